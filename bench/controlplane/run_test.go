package main

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr})
	defer rc.Close()
	info, err := rc.Info(t.Context(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	pid := regexp.MustCompile(`process_id:(\d+)`).FindStringSubmatch(info)
	if pid == nil {
		t.Fatalf("no process_id in INFO server:\n%s", info)
	}
	var out, errOut bytes.Buffer
	err = run(t.Context(), []string{"--addr", srv.Addr, "--token-file", srv.AgentTokenFile, "--inflight", "1,4",
		"--redis-addr", rsrv.Addr, "--redis-token-file", rsrv.AgentTokenFile, "--modes", "noop,admit,redis",
		"--redis-server", rs.Addr, "--redis-pid", pid[1],
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
		if (r.Mode == "redis") != (r.ScriptUs > 0) {
			t.Errorf("result %+v: want the script's time per call for the redis mode only", r)
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
		{[]string{"--token-file", "x", "--redis-pid", "7"}, "--redis-server and --redis-pid go together"},
	}
	for _, tt := range tests {
		err := run(t.Context(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("run(%v) = %v, want %q", tt.args, err, tt.want)
		}
	}
}

// The probe's parsers read the kernel's and Redis's formats.
func TestRedisProbeParsers(t *testing.T) {
	// A command name with spaces and a parenthesis; utime 250, stime 50.
	stat := "4242 (redis-server *:6379) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 50 0 0 20 0 5 0 100 0 0"
	if got, err := cpuTime(stat, 100); err != nil || got != 3*time.Second {
		t.Errorf("cpuTime = %v, %v; want 3s", got, err)
	}
	if _, err := cpuTime("garbage", 100); err == nil {
		t.Error("cpuTime(garbage) succeeded; want an error")
	}
	info := "# Commandstats\r\ncmdstat_ping:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_evalsha:calls=1000,usec=7250,usec_per_call=7.25,rejected_calls=0,failed_calls=1\r\n"
	if calls, usec := commandStats(info, "evalsha"); calls != 1000 || usec != 7250 {
		t.Errorf("commandStats = %d calls, %d usec; want 1000, 7250", calls, usec)
	}
	if calls, usec := commandStats(info, "fcall"); calls != 0 || usec != 0 {
		t.Errorf("commandStats of a command that never ran = %d, %d; want 0, 0", calls, usec)
	}
	cpu, script, calls := redisCost([]redisStats{{cpu: time.Second, calls: 100000, usec: 500000}, {cpu: time.Second, calls: 100000, usec: 700000}})
	if cpu != 10 || script != 6 || calls != 200000 {
		t.Errorf("redisCost = %v µs CPU, %v µs script, %d calls; want 10, 6, 200000", cpu, script, calls)
	}
}
