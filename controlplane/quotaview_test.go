package controlplane_test

import (
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// reportAt sends a rate-limits report of key read at t: the primary
// window at primary percent resetting at resets, the secondary at 20 %.
func reportAt(t *testing.T, st rawStream, at time.Time, primary float64, resets time.Time) {
	t.Helper()
	m := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_RateLimits{RateLimits: &controlplanev1.RateLimits{
		Account: key, PlanType: "pro", AtUnixMs: at.UnixMilli(),
		Windows: []*controlplanev1.QuotaWindow{
			{Name: "primary", UsedPercent: primary, WindowMinutes: 300, ResetsAtUnixMs: resets.UnixMilli()},
			{Name: "secondary", UsedPercent: 20, WindowMinutes: 10080},
		},
	}}}
	if err := st.Send(m); err != nil {
		t.Fatal(err)
	}
}

// windowsOf waits until ListQuotas answers key's latest report (read at
// at) and returns its windows by name.
func windowsOf(t *testing.T, admin controlplanev1.AdminServiceClient, at time.Time) map[string]*controlplanev1.QuotaWindow {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q, err := admin.ListQuotas(t.Context(), &controlplanev1.ListQuotasRequest{Key: key})
		if err == nil && len(q.GetQuotas()) == 1 && q.GetQuotas()[0].GetReportedUnixMs() == at.UnixMilli() {
			out := map[string]*controlplanev1.QuotaWindow{}
			for _, w := range q.GetQuotas()[0].GetWindows() {
				out[w.GetName()] = w
			}
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("ListQuotas = %v, %v; want the report read at %v", q, err, at)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The burn rate of a window is its use per minute over the reports of the
// last 15 minutes of its current reset, and EMPTIES IN how long from now
// until it is used up at that rate, counted on from the latest report
// (injected clock; the figures are worked out by hand).
func TestQuotaBurnRate(t *testing.T) {
	clk := newClock()
	t0 := clk.Now()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	st := connect(t, srv, helloUsage("dp-1", key))
	recvPolicy(t, st)
	resets := t0.Add(3 * time.Hour)

	// One report: no rate yet.
	reportAt(t, st, t0, 40, resets)
	w := windowsOf(t, admin, t0)
	if w["primary"].BurnPercentPerMinute != nil || w["primary"].EmptiesInSeconds != nil {
		t.Errorf("after one report: burn %v, empties %v; want neither", w["primary"].BurnPercentPerMinute, w["primary"].EmptiesInSeconds)
	}

	// 40 % at t0, 45 % at t0+5m, 50 % at t0+10m: 10 points in 10 minutes
	// is 1 %/min; the 50 left take 50 minutes: 3000 s from t0+10m.
	clk.Advance(5 * time.Minute)
	reportAt(t, st, t0.Add(5*time.Minute), 45, resets)
	windowsOf(t, admin, t0.Add(5*time.Minute))
	clk.Advance(5 * time.Minute)
	reportAt(t, st, t0.Add(10*time.Minute), 50, resets)
	w = windowsOf(t, admin, t0.Add(10*time.Minute))
	if p := w["primary"]; p.BurnPercentPerMinute == nil || p.GetBurnPercentPerMinute() != 1 || p.EmptiesInSeconds == nil || p.GetEmptiesInSeconds() != 3000 {
		t.Errorf("primary at t0+10m: burn %v %%/min, empties in %v s; want 1 and 3000", p.BurnPercentPerMinute, p.EmptiesInSeconds)
	}
	// The secondary window does not rise: a rate of 0, never empty.
	if s := w["secondary"]; s.BurnPercentPerMinute == nil || s.GetBurnPercentPerMinute() != 0 || s.EmptiesInSeconds != nil {
		t.Errorf("secondary: burn %v, empties %v; want 0 and none", s.BurnPercentPerMinute, s.EmptiesInSeconds)
	}

	// Five minutes on without a report: the same rate, 45 minutes left
	// (t0+10m + 50m - t0+15m).
	clk.Advance(5 * time.Minute)
	w = windowsOf(t, admin, t0.Add(10*time.Minute))
	if p := w["primary"]; p.GetBurnPercentPerMinute() != 1 || p.GetEmptiesInSeconds() != 2700 {
		t.Errorf("primary at t0+15m: burn %v, empties in %v s; want 1 and 2700", p.GetBurnPercentPerMinute(), p.GetEmptiesInSeconds())
	}

	// At t0+20m, 60 %: the report of t0 is over 15 minutes old, so the
	// rate is from 45 % at t0+5m: 15 points in 15 minutes, 1 %/min, and
	// 40 minutes left. At t0+22m, 66 %: from 50 % at t0+10m (the t0+5m
	// report is now too old): 16 in 12 minutes, 4/3 %/min; 34 left take
	// 25.5 minutes: 1530 s.
	clk.Advance(5 * time.Minute)
	reportAt(t, st, t0.Add(20*time.Minute), 60, resets)
	w = windowsOf(t, admin, t0.Add(20*time.Minute))
	if p := w["primary"]; p.GetBurnPercentPerMinute() != 1 || p.GetEmptiesInSeconds() != 2400 {
		t.Errorf("primary at t0+20m: burn %v, empties in %v s; want 1 and 2400", p.GetBurnPercentPerMinute(), p.GetEmptiesInSeconds())
	}
	clk.Advance(2 * time.Minute)
	reportAt(t, st, t0.Add(22*time.Minute), 66, resets)
	w = windowsOf(t, admin, t0.Add(22*time.Minute))
	if p := w["primary"]; p.GetBurnPercentPerMinute() != 16.0/12 || p.GetEmptiesInSeconds() != 1530 {
		t.Errorf("primary at t0+22m: burn %v, empties in %v s; want 4/3 and 1530", p.GetBurnPercentPerMinute(), p.GetEmptiesInSeconds())
	}

	// The window resets: the reports before it do not count, so with one
	// report of the new reset there is no rate; a used-up window empties
	// now (0).
	clk.Advance(time.Minute)
	reportAt(t, st, t0.Add(23*time.Minute), 1, t0.Add(5*time.Hour))
	w = windowsOf(t, admin, t0.Add(23*time.Minute))
	if p := w["primary"]; p.BurnPercentPerMinute != nil {
		t.Errorf("after the reset: burn %v, want none", p.GetBurnPercentPerMinute())
	}
	clk.Advance(2 * time.Minute)
	reportAt(t, st, t0.Add(25*time.Minute), 100, t0.Add(5*time.Hour))
	w = windowsOf(t, admin, t0.Add(25*time.Minute))
	if p := w["primary"]; p.GetBurnPercentPerMinute() != 49.5 || p.EmptiesInSeconds == nil || p.GetEmptiesInSeconds() != 0 {
		t.Errorf("used up: burn %v, empties %v; want 49.5 and 0", p.GetBurnPercentPerMinute(), p.EmptiesInSeconds)
	}
}

// recvQuotas receives until a quota push naming key and returns its
// figures.
func recvQuotas(t *testing.T, st rawStream) *controlplanev1.RateLimits {
	t.Helper()
	for {
		m, err := st.Recv()
		if err != nil {
			t.Fatalf("Recv waiting for a quota push: %v", err)
		}
		for _, rl := range m.GetQuotas().GetAccounts() {
			if rl.GetAccount() == key {
				return rl
			}
		}
	}
}

// One data plane's report reaches every agent serving the account (a
// QuotaPush), and an agent that connects later gets the latest figures
// at once; through another replica sharing the store too.
func TestQuotaPush(t *testing.T) {
	for _, redis := range []bool{false, true} {
		name := "memory"
		if redis {
			name = "redis"
		}
		t.Run(name, func(t *testing.T) {
			clk := newClock()
			o := controlplanetest.Options{Now: clk.Now, FleetTick: 20 * time.Millisecond}
			if redis {
				rs := redistest.Start(t)
				o.RedisURL, o.RedisPrefix, o.RedisTimeout, o.Replica = rs.URL, "push:", 5*time.Second, "cp-a"
			}
			a := controlplanetest.Start(t, &o)
			other := a
			if redis { // the listeners connect to another replica
				ob := o
				ob.Replica, ob.Tokens = "cp-b", a
				other = controlplanetest.Start(t, &ob)
			}
			reporter := connect(t, a, helloUsage("dp-1", key))
			recvPolicy(t, reporter)
			listener := connect(t, other, helloUsage("dp-2", key))
			recvPolicy(t, listener)
			at := clk.Now()
			reportAt(t, reporter, at, 90, at.Add(time.Hour))
			// Stored; the other replica reads the store every 5 s.
			windowsOf(t, controlplanev1.NewAdminServiceClient(a.Dial(a.AdminToken, nil)), at)
			clk.Advance(controlplane.QuotaRefresh)
			rl := recvQuotas(t, listener)
			if rl.GetAtUnixMs() != at.UnixMilli() || len(rl.GetWindows()) != 2 || rl.GetWindows()[0].GetUsedPercent() != 90 || rl.GetPlanType() != "pro" {
				t.Errorf("push to dp-2 = %v; want the primary at 90 %% read at %v", rl, at)
			}
			late := connect(t, other, helloUsage("dp-3", key))
			if rl := recvQuotas(t, late); rl.GetWindows()[0].GetUsedPercent() != 90 {
				t.Errorf("push to dp-3 on connect = %v; want the primary at 90 %%", rl)
			}
		})
	}
}
