package controlplane_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// An agent's rate-limits reports become the account's quota (ListQuotas),
// and passing 90 % of a window is logged once.
func TestRateLimitsReportsBecomeQuotas(t *testing.T) {
	clk := newClock()
	logs := &syncBuffer{}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	st := connect(t, srv, hello("a-1-x", key))
	recvPolicy(t, st)

	resets := clk.Now().Add(3 * time.Hour).UnixMilli()
	report := func(at time.Duration, primary float64) {
		t.Helper()
		m := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_RateLimits{RateLimits: &controlplanev1.RateLimits{
			Account: key, PlanType: "pro", AtUnixMs: clk.Now().Add(at).UnixMilli(),
			Windows: []*controlplanev1.QuotaWindow{
				{Name: "primary", UsedPercent: primary, WindowMinutes: 300, ResetsAtUnixMs: resets},
				{Name: "secondary", UsedPercent: 29, WindowMinutes: 10080},
			},
		}}}
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	quota := func(want float64) *controlplanev1.AccountQuota {
		t.Helper()
		var q *controlplanev1.ListQuotasResponse
		deadline := time.Now().Add(10 * time.Second)
		for {
			var err error
			q, err = admin.ListQuotas(t.Context(), &controlplanev1.ListQuotasRequest{Key: key})
			if err == nil && len(q.GetQuotas()) == 1 && q.GetQuotas()[0].GetWindows()[0].GetUsedPercent() == want {
				return q.GetQuotas()[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("ListQuotas = %v, %v; want the primary window at %v%%", q, err, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	report(0, 80)
	q := quota(80)
	if q.GetPlanType() != "pro" || q.GetAgentId() != "a-1-x" || len(q.GetWindows()) != 2 ||
		q.GetWindows()[0].GetWindowMinutes() != 300 || q.GetWindows()[0].GetResetsAtUnixMs() != resets ||
		q.GetWindows()[1].GetName() != "secondary" || q.GetWindows()[1].GetResetsAtUnixMs() != 0 {
		t.Fatalf("quota = %v; want pro, a-1-x, primary 80%% of 300 min resetting at %d, secondary", q, resets)
	}
	report(time.Second, 91)
	quota(91)
	report(2*time.Second, 95)
	quota(95)
	if n := strings.Count(logs.String(), "account passed 90% of its plan's primary usage window"); n != 1 {
		t.Errorf("the 90%% notice was logged %d times, want once:\n%s", n, logs)
	}

	// A malformed report names its problem and ends the stream.
	bad := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_RateLimits{RateLimits: &controlplanev1.RateLimits{
		Account: key, Windows: []*controlplanev1.QuotaWindow{{Name: "primary", UsedPercent: -1}}}}}
	if err := st.Send(bad); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := st.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "used_percent -1 is out of range; allowed 0..1000") {
			t.Errorf("stream after a bad report = %v, want InvalidArgument naming used_percent", err)
		}
		break
	}
	if _, err := admin.ListQuotas(t.Context(), &controlplanev1.ListQuotasRequest{Key: "no pe"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ListQuotas(bad key) = %v, want InvalidArgument", err)
	}
}
