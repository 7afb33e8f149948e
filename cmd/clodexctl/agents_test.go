package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/agent"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

// runAgent runs a data plane agent against srv until the test ends and
// waits for its first policy push (it is registered then).
func runAgent(t *testing.T, srv *controlplanetest.Server, clk *clock, id string, accounts ...string) {
	t.Helper()
	pushed := make(chan struct{})
	var once sync.Once
	a, err := agent.New(agent.Config{
		Conn: srv.Dial(srv.AgentToken, nil), ID: id, Host: "build-7", Version: "v0.9.0", Clock: clk.Now,
		Accounts: func() []string { return accounts },
		OnPolicy: func(string, pacing.Policy, int) { once.Do(func() { close(pushed) }) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent Run = %v, want nil once cancelled", err)
		}
	})
	select {
	case <-pushed:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent never received a policy push")
	}
}

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
		"id": "build-7-100-0a0b0c0d", "host": "build-7", "version": "v0.9.0", "capability_version": 4.0,
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
