package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
)

// A short run against real servers (one on the memory store, one on a
// real redis-server): every combination is measured, with no errors, and
// Admit really ran the buckets of both stores.
func TestRunSmoke(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{EnableBench: true})
	rs := redistest.Start(t)
	rsrv := controlplanetest.Start(t, &controlplanetest.Options{EnableBench: true, RedisURL: rs.URL})
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--addr", srv.Addr, "--token-file", srv.AgentTokenFile, "--inflight", "1,4",
		"--redis-addr", rsrv.Addr, "--redis-token-file", rsrv.AgentTokenFile, "--modes", "noop,admit,redis",
		"--accounts", "1,20", "--duration", "50ms", "--warmup", "10ms", "--rounds", "2", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 12 {
		t.Fatalf("got %d result lines, want 12 (3 modes x 2 in flight x 2 account counts):\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		var r result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		if r.Requests == 0 || r.Errors != 0 || r.RPS <= 0 || r.P50us <= 0 || r.P99us < r.P50us {
			t.Errorf("result %+v: want requests, no errors, p99 >= p50 > 0", r)
		}
		if r.Mode != "noop" && len(r.Decisions) == 0 {
			t.Errorf("admit result without decisions: %+v", r)
		}
	}
	accts, err := srv.Store().Accounts(t.Context(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if len(accts) != 20 { // bench-account-0..19; the 1-account runs use bench-account-0
		t.Errorf("server knows %d accounts, want 20", len(accts))
	}
	if accts, err := rsrv.Store().Accounts(t.Context(), time.Now()); err != nil || len(accts) != 20 {
		t.Errorf("the Redis store knows %d accounts (%v), want 20", len(accts), err)
	}
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{}, "--token-file is required"},
		{[]string{"--token-file", "x", "--modes", "fast"}, `--modes: "fast" is invalid; allowed noop, admit, redis`},
		{[]string{"--token-file", "x", "--modes", "redis"}, "--modes redis needs --redis-addr"},
		{[]string{"--token-file", "x", "--inflight", "0"}, `--inflight: "0" is not a positive integer`},
		{[]string{"--token-file", "x", "--rounds", "0"}, "--rounds must be at least 1"},
	}
	for _, tt := range tests {
		err := run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%v) = %v, want %q", tt.args, err, tt.want)
		}
	}
}
