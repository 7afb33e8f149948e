package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// usageAgent runs a data plane's control-plane client with id that sends
// its usage every 20 ms.
func usageAgent(t *testing.T, srv *controlplanetest.Server, clk *clock, id string, accounts ...string) *control.Client {
	t.Helper()
	logger, pushed := pushLogger()
	c, err := control.New(control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: id, Clock: clk.Now,
		Accounts: accounts, Logger: logger, UsageFlush: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("control client Run = %v, want nil once cancelled", err)
		}
		_ = c.Close()
	})
	select {
	case <-pushed:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never received a policy push")
	}
	return c
}

// waitTurns waits until the ledger holds n turns.
func waitTurns(t *testing.T, srv *controlplanetest.Server, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, err := ctl(t, srv, "usage", "--by", "member", "-o", "json")
		var v struct{ Rows []struct{ Turns int64 } }
		if err == nil && json.Unmarshal([]byte(out), &v) == nil {
			var got int64
			for _, r := range v.Rows {
				got += r.Turns
			}
			if got == n {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger never held %d turns: %s %v", n, out, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// clodexctl usage prints the ledger's sums per group: a table with the
// grouped-by keys in --by's order and a total, or JSON rows with only the
// grouped-by keys.
func TestUsageOutput(t *testing.T) {
	clk := &clock{t: time.Now().UTC().Truncate(time.Minute)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	a1, a2 := account.Key(acct1), account.Key("chatgpt-account-2")
	dp1 := usageAgent(t, srv, clk, "build-7-100-0a0b0c0d", a1, a2)
	dp2 := usageAgent(t, srv, clk, "build-8-200-01020304", a1)
	turn := func(c *control.Client, member, acct, model string, in, cached, out, sockets, refused int64) {
		c.ReportUsage(&controlplanev1.UsageRow{Member: member, Account: acct, Model: model, Turns: 1, InputTokens: in,
			CachedTokens: cached, OutputTokens: out, NewSockets: sockets, Refusals: refused})
	}
	turn(dp1, "alice", a1, "claude-sonnet-4-5", 12000, 0, 800, 1, 0)
	turn(dp1, "alice", a1, "claude-sonnet-4-5", 12900, 12000, 450, 0, 0)
	turn(dp1, "bob", a2, "claude-haiku-4-5", 3000, 0, 120, 1, 0)
	turn(dp2, "alice", a1, "claude-haiku-4-5", 2500, 0, 90, 1, 0)
	turn(dp2, "carol", a1, "claude-sonnet-4-5", 0, 0, 0, 0, 1)
	turn(dp2, "", a1, "gpt-5.5", 700, 0, 30, 1, 0)
	waitTurns(t, srv, 6)

	table, _, err := ctl(t, srv, "usage")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "usage_by_member_table", table)
	table, _, err = ctl(t, srv, "usage", "--by", "agent,account,model", "--since", "1h")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "usage_by_agent_account_model_table", table)

	out, _, err := ctl(t, srv, "usage", "--by", "model,member", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "usage_by_model_member_json", out)
	var v struct {
		Rows []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("usage -o json is not {\"rows\":[...]}: %v\n%s", err, out)
	}
	for _, r := range v.Rows {
		for _, k := range []string{"agent", "account"} {
			if _, ok := r[k]; ok {
				t.Errorf("row %v has %q, which it was not grouped by", r, k)
			}
		}
		for _, k := range []string{"member", "model", "turns", "input_tokens", "cached_tokens", "output_tokens", "new_sockets", "refusals"} {
			if _, ok := r[k]; !ok {
				t.Errorf("row %v lacks %q", r, k)
			}
		}
	}
	if len(v.Rows) != 5 {
		t.Errorf("usage --by model,member: %d rows, want 5", len(v.Rows))
	}
}

// Bad usage flags exit 2 naming what is allowed.
func TestUsageBadFlags(t *testing.T) {
	srv := startServer(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"usage", "--by", "team"}, `--by "team": "team" is not a key; allowed member, agent, account, model`},
		{[]string{"usage", "--by", "member,member"}, `--by "member,member" names member twice`},
		{[]string{"usage", "--since", "31d"}, `--since "31d" is invalid; want a duration above 0 and at most 30d`},
		{[]string{"usage", "--since", "0s"}, `--since "0s" is invalid`},
		{[]string{"usage", "extra"}, `unexpected argument "extra"`},
	} {
		_, _, err := ctl(t, srv, tt.args...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("clodexctl %v = %v (exit %d), want exit 2 containing %q", tt.args, err, exitCode(err), tt.want)
		}
	}
}

// clodexctl quota shows each window's burn rate and when it empties at
// it: the BURN and EMPTIES IN columns, burn_percent_per_minute and
// empties_in_seconds in JSON.
func TestQuotaBurn(t *testing.T) {
	clk := &clock{t: time.Now().UTC().Truncate(time.Second)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	key := account.Key(acct1)
	dp := runAgent(t, srv, clk, "build-7-100-0a0b0c0d", key)
	t0 := clk.Now()
	resets := t0.Add(4 * time.Hour)
	report := func(at time.Duration, primary float64) {
		dp.ReportRateLimits(&controlplanev1.RateLimits{Account: key, PlanType: "pro", AtUnixMs: t0.Add(at).UnixMilli(),
			Windows: []*controlplanev1.QuotaWindow{
				{Name: "primary", UsedPercent: primary, WindowMinutes: 300, ResetsAtUnixMs: resets.UnixMilli()},
				{Name: "secondary", UsedPercent: 30, WindowMinutes: 10080},
			}})
	}
	type window struct {
		Name    string   `json:"name"`
		Used    float64  `json:"used_percent"`
		Burn    *float64 `json:"burn_percent_per_minute"`
		Empties *int64   `json:"empties_in_seconds"`
	}
	read := func(used float64) []window {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			out, _, err := ctl(t, srv, "quota", acct1, "-o", "json")
			var v []struct{ Windows []window }
			if err == nil && json.Unmarshal([]byte(out), &v) == nil && len(v) == 1 && len(v[0].Windows) == 2 && v[0].Windows[0].Used == used {
				return v[0].Windows
			}
			if time.Now().After(deadline) {
				t.Fatalf("quota never showed the primary at %v%%: %s %v", used, out, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	report(0, 20)
	if w := read(20); w[0].Burn != nil || w[0].Empties != nil {
		t.Errorf("after one report: burn %v, empties %v; want neither in the JSON", w[0].Burn, w[0].Empties)
	}
	// 20 % then 32 % eight minutes later: 1.5 %/min; 68 % left at that
	// rate is 45m20s (2720 s) from the report, which is now.
	clk.mu.Lock()
	clk.t = t0.Add(8 * time.Minute)
	clk.mu.Unlock()
	report(8*time.Minute, 32)
	w := read(32)
	if w[0].Burn == nil || *w[0].Burn != 1.5 || w[0].Empties == nil || *w[0].Empties != 2720 {
		t.Errorf("primary: burn %v, empties %v; want 1.5 and 2720", w[0].Burn, w[0].Empties)
	}
	if w[1].Burn == nil || *w[1].Burn != 0 || w[1].Empties != nil {
		t.Errorf("secondary: burn %v, empties %v; want 0 and none", w[1].Burn, w[1].Empties)
	}
	table, _, err := ctl(t, srv, "quota", acct1)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	cols := func(i int) string {
		f := strings.Fields(lines[i])
		if len(f) < 9 {
			return ""
		}
		return f[7] + " " + f[8]
	}
	if len(lines) != 3 || !strings.Contains(lines[0], "RESETS IN  BURN") || !strings.Contains(lines[0], "EMPTIES IN  LIMIT") ||
		cols(1) != "1.50%/min 45m0s" || cols(2) != "0.00%/min never" {
		t.Errorf("quota table:\n%s\nwant BURN and EMPTIES IN columns: 1.50%%/min 45m0s (to the minute) and 0.00%%/min never", table)
	}
}
