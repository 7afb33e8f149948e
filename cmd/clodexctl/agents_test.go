package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
)

// runAgent runs a data plane's control-plane client against srv until the
// test ends and waits for its first policy push (it is registered then).
func runAgent(t *testing.T, srv *controlplanetest.Server, clk *clock, id string, accounts ...string) *control.Client {
	t.Helper()
	logger, pushed := pushLogger()
	c, err := control.New(control.Config{
		Target: srv.Addr, Token: srv.AgentToken, AgentID: id, Host: "build-7", Version: "v0.9.0", Clock: clk.Now,
		Accounts: accounts, Logger: logger,
	})
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

// pushLogger returns a logger for a control-plane client and a channel
// closed when the client logs its first policy push.
func pushLogger() (*slog.Logger, <-chan struct{}) {
	h := &pushHandler{pushed: make(chan struct{})}
	return slog.New(h), h.pushed
}

type pushHandler struct {
	once   sync.Once
	pushed chan struct{}
}

func (h *pushHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *pushHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "policy from the control plane" {
		h.once.Do(func() { close(h.pushed) })
	}
	return nil
}
func (h *pushHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *pushHandler) WithGroup(string) slog.Handler      { return h }

// agents -o json prints a JSON array with id, host, accounts and
// last_seen (RFC 3339) for every registered data plane.
func TestAgentsJSON(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	runAgent(t, srv, clk, "build-7-100-0a0b0c0d", account.Key(acct1), account.Key("chatgpt-account-2"))
	clk.mu.Lock()
	clk.t = clk.t.Add(3 * time.Second) // the second agent registers 3s later
	clk.mu.Unlock()
	runAgent(t, srv, clk, "build-8-200-01020304", account.Key("chatgpt-account-3"))

	out, _, err := ctl(t, srv, "agents", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, out)
	}
	if len(got) != 2 {
		t.Fatalf("agents = %d, want 2:\n%s", len(got), out)
	}
	want0 := map[string]any{
		"id": "build-7-100-0a0b0c0d", "host": "build-7", "version": "v0.9.0", "capability_version": 7.0,
		"accounts":  []any{"acct_989eff5c06c62dbc", "acct_c74b8577a6daeaf7"},
		"last_seen": "2026-11-30T12:00:00Z", "connected": "2026-11-30T12:00:00Z", "live": true,
	}
	for k, v := range want0 {
		if gb, _ := json.Marshal(got[0][k]); string(gb) != mustJSON(t, v) {
			t.Errorf("agents[0].%s = %s, want %s", k, gb, mustJSON(t, v))
		}
	}
	if got[1]["id"] != "build-8-200-01020304" || got[1]["last_seen"] != "2026-11-30T12:00:03Z" || mustJSON(t, got[1]["accounts"]) != `["acct_33f4edcd87f76c70"]` {
		t.Errorf("agents[1] = %v, want build-8-200-01020304 seen 12:00:03Z serving acct_33f4edcd87f76c70", got[1])
	}

	table, _, err := ctl(t, srv, "agents")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "agents_table", table)
	if !strings.Contains(table, "build-7-100-0a0b0c0d") {
		t.Errorf("table lacks the agent:\n%s", table)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// get -o json keeps rate_per_minute (configured) and adds
// effective_rate_per_minute, lowered after a 403 in adaptive mode.
func TestGetShowsEffectiveRate(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	if _, _, err := ctl(t, srv, "set-adaptive", acct1, "on"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.Store().Report403(t.Context(), account.Key(acct1), clk.Now(), 0); err != nil {
		t.Fatal(err)
	}
	out, _, err := ctl(t, srv, "get", acct1, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatal(err)
	}
	if m["rate_per_minute"] != 60.0 || m["effective_rate_per_minute"] != 30.0 || m["adaptive"] != true {
		t.Errorf("get -o json = rate %v effective %v adaptive %v, want 60, 30, true", m["rate_per_minute"], m["effective_rate_per_minute"], m["adaptive"])
	}
}

// quota prints the latest plan usage the data planes reported, per
// account and window, as a table and as JSON.
func TestQuota(t *testing.T) {
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	out, _, err := ctl(t, srv, "quota")
	if err != nil || !strings.Contains(out, "no plan usage reported yet") {
		t.Fatalf("quota with none = %q, %v; want a line saying none was reported", out, err)
	}
	const acct2 = "chatgpt-account-2"
	qs, ok := srv.Store().(controlplane.QuotaStore)
	if !ok {
		t.Fatalf("the test control plane's store %T keeps no quotas", srv.Store())
	}
	resets := time.Now().Add(3*time.Hour + 30*time.Second).Truncate(time.Second).UTC()
	for i, acct := range []string{acct1, acct2} {
		_, _, err := qs.PutQuota(t.Context(), store.Quota{Key: account.Key(acct), PlanType: "pro", AgentID: "dp-1",
			ReportedAt: clk.Now(), Windows: []store.QuotaWindow{
				{Name: "primary", UsedPercent: 7 + float64(i), Window: 5 * time.Hour, ResetsAt: resets},
				{Name: "secondary", UsedPercent: 29.5, Window: 7 * 24 * time.Hour},
			}})
		if err != nil {
			t.Fatal(err)
		}
	}
	out, _, err = ctl(t, srv, "quota")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || !strings.HasPrefix(lines[0], "ACCOUNT") {
		t.Fatalf("quota = %q; want a header and two rows per account", out)
	}
	want := []string{account.Key(acct1), "pro", "primary", "7%", "5h", resets.Format(time.RFC3339), "3h0m0s", "-", "2026-11-30T12:00:00Z"}
	if got := strings.Fields(lines[1]); !slices.Equal(got, want) && !slices.Equal(got[:6], want[:6]) {
		t.Errorf("first row = %v, want %v", got, want)
	}
	if got := strings.Fields(lines[2]); got[2] != "secondary" || got[3] != "29.5%" || got[4] != "7d" || got[5] != "-" {
		t.Errorf("second row = %v, want the secondary window, 29.5%% of 7d, reset unknown", got)
	}
	out, _, err = ctl(t, srv, "quota", acct2, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var v []map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("quota -o json = %q: %v", out, err)
	}
	if len(v) != 1 || v[0]["account"] != acct2 || v[0]["key"] != account.Key(acct2) || v[0]["plan_type"] != "pro" {
		t.Fatalf("quota ACCOUNT -o json = %v; want the one account", v)
	}
	w := v[0]["windows"].([]any)[0].(map[string]any)
	if w["name"] != "primary" || w["used_percent"] != 8.0 || w["window_minutes"] != 300.0 || w["resets_at"] != resets.Format(time.RFC3339) {
		t.Errorf("windows[0] = %v; want primary, 8%%, 300 minutes, resetting at %s", w, resets.Format(time.RFC3339))
	}
	if _, _, err := ctl(t, srv, "quota", "--key", "nope"); err == nil || !strings.Contains(err.Error(), "is not an account key") {
		t.Errorf("quota --key nope = %v, want a usage error naming the key", err)
	}
}
