package controlplane_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Accounts come from operators and registered data planes, not from
// traffic: Admit without an agent id for an account nobody configured or
// serves is PermissionDenied (and counted); an operator's policy, an
// agent's hello, or a data plane's Admit naming its agent id make it
// admissible; registrations lapse when no stream names them.
func TestAccountsFromOperatorsAndAgents(t *testing.T) {
	clk := newClock()
	reg := prometheus.NewRegistry()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Registerer: reg, FleetTick: 5 * time.Millisecond})
	agentAdmit := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	admit := func(key, agentID string) error {
		_, err := agentAdmit.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key, AgentId: agentID})
		return err
	}

	invented := account.Key("invented")
	err := admit(invented, "")
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "is not registered: no operator configured it and no registered data plane serves it") {
		t.Fatalf("Admit of an invented account = %v, want PermissionDenied naming why", err)
	}
	if _, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: invented}); status.Code(err) != codes.NotFound {
		t.Errorf("GetAccount after the refused Admit = %v, want NotFound (no bucket created)", err)
	}
	if v := gather(t, reg)[`clodex_controlplane_denied_total{peer="127.0.0.1",reason="unknown_account"}`]; v != 1 {
		t.Errorf("denied_total{unknown_account} = %v, want 1", v)
	}

	// An operator configures an account.
	configured := account.Key("configured")
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: configured, RatePerMinute: 30}); err != nil {
		t.Fatal(err)
	}
	if err := admit(configured, ""); err != nil {
		t.Errorf("Admit of an operator's account = %v, want admitted", err)
	}

	// A data plane registers the accounts of its hello, and its Admit
	// (which names its agent id) registers another it serves.
	served := account.Key("served")
	st := connect(t, srv, hello("dp-1", served))
	recvPolicy(t, st)
	if err := admit(served, ""); err != nil {
		t.Errorf("Admit of a registered account = %v, want admitted", err)
	}
	later := account.Key("served-later")
	if err := admit(later, "dp-2"); err != nil {
		t.Errorf("Admit naming the agent dp-2 = %v, want admitted (and registered)", err)
	}
	if err := admit(later, ""); err != nil {
		t.Errorf("Admit of the account registered by the previous Admit = %v, want admitted", err)
	}
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: account.Key("operator-admit")}); err != nil {
		t.Errorf("Admit with the admin token (an operator's) = %v, want admitted", err)
	}

	// The agent goes away; 10 minutes later its accounts lapse (the
	// fleet loop sweeps), the operator's stays.
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("the agent stream stayed open after CloseSend")
	}
	clk.Advance(11 * time.Minute)
	deadline := time.Now().Add(30 * time.Second)
	for admit(served, "") == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, k := range []string{served, later} {
		if err := admit(k, ""); status.Code(err) != codes.PermissionDenied {
			t.Errorf("Admit of %s 11 minutes after the agents left = %v, want PermissionDenied", k, err)
		}
	}
	if err := admit(configured, ""); err != nil {
		t.Errorf("Admit of the operator's account 11 minutes later = %v, want admitted", err)
	}
}

// One agent credential registers at most --max-agent-accounts accounts:
// a hello or an Admit past it is ResourceExhausted naming the flag.
func TestAccountCapPerCredential(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	keys := make([]string, 1001)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	recvPolicy(t, connect(t, srv, hello("dp-1", keys[:600]...)))
	recvPolicy(t, connect(t, srv, hello("dp-2", keys[300:1000]...))) // 400 new: 1000 in all
	_, err := connect(t, srv, hello("dp-3", keys[1000])).Recv()
	if status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(err.Error(), `agent credential "agent" may register at most 1000 accounts (clodex-controlplane --max-agent-accounts); it serves 1000 and this would add 1`) {
		t.Errorf("hello past the cap = %v, want ResourceExhausted naming the cap and the flag", err)
	}
	_, err = controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: keys[1000], AgentId: "dp-4"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "may register at most 1000 accounts") {
		t.Errorf("Admit registering past the cap = %v, want ResourceExhausted naming the cap", err)
	}
}
