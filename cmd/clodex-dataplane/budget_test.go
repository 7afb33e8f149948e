package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// clodexctl set-budget reaches the turns: after the control plane pushes a
// budget with no retries, a failing turn is tried once, where the
// environment's budget (one retry) would try it twice.
func TestPushedBudgetBoundsTurns(t *testing.T) {
	s := startSim(t)
	cp := controlplanetest.Start(t, nil)
	r := startRun(t, map[string]string{pacing.EnvMaxRetries: "1"},
		append(s.args(), "--control-plane", cp.Addr, "--agent-token-file", cp.AgentTokenFile)...)
	if got := turn(t, r.base, "#sim reply fleet"); got != "fleet" { // registers the account
		t.Fatalf("reply = %q, want \"fleet\"", got)
	}
	key := account.Key(simAccount)
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	if _, err := admin.SetBudget(t.Context(), &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(0)}); err != nil {
		t.Fatal(err)
	}
	pushed := fmt.Sprintf(`msg="policy from the control plane" account=%s`, key)
	waitFor(t, func() bool {
		for _, l := range strings.Split(r.stderr.String(), "\n") {
			if strings.Contains(l, pushed) && strings.Contains(l, " max_retries=0 ") {
				return true
			}
		}
		return false
	}, func() string { return fmt.Sprintf("log has no %q with max_retries=0:\n%s", pushed, r.stderr) })

	before := s.Stats().Errors["server_error"]
	body := `{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":"#sim fail server_error"}]}`
	if resp := post(t, r.base, body); resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("failing turn: status %d, want 502", resp.StatusCode)
	}
	if n := s.Stats().Errors["server_error"] - before; n != 1 {
		t.Errorf("the sim failed %d responses for one turn, want 1 (the pushed budget has no retries)", n)
	}
}
