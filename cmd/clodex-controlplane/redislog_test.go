package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store/redistest"
)

// Through a Redis outage every line the control plane writes is a JSON
// record (go-redis's own pool lines included, which used to go raw to
// stderr, four a second), and go-redis's lines come at most one per
// redisstore.ClientLogEvery. --check-config against a Redis that does not
// answer writes no raw line either.
func TestRedisOutageLogIsStructured(t *testing.T) {
	rs := redistest.Start(t)
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1", "CLODEX_REDIS_URL": rs.URL})
	r := start(t, []string{"--listen", "127.0.0.1:0", "--replica", "cp-1", "--log-format", "json"}, env)
	waitLog := func(what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(r.stderr.String(), what); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the log never said %q:\n%s", what, r.stderr.String())
			}
		}
	}
	rs.Kill()
	killed := time.Now()
	waitLog("redis unreachable")
	waitLog(`"msg":"redis client"`)
	time.Sleep(3 * time.Second) // the breaker's probe dials every 250 ms: a dozen failed dials
	rs.Restart()
	waitLog("redis answers again")
	outage := time.Since(killed)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	records := 0
	for _, line := range strings.Split(strings.TrimSpace(r.stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("a log line is not a JSON record: %q", line)
			continue
		}
		if rec["msg"] == "redis client" {
			records++
		}
	}
	most := int(outage/(10*time.Second)) + 1
	t.Logf("outage of %v: %d go-redis records", outage.Round(time.Millisecond), records)
	if records < 1 || records > most {
		t.Errorf("%d go-redis records over an outage of %v; want 1..%d (one per 10 s)", records, outage.Round(time.Millisecond), most)
	}

	// --check-config: a Redis that does not answer is one error, no raw line.
	var stderr syncBuffer
	err := runEnv(t.Context(), []string{"--check-config", "--log-format", "json"},
		envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1", "CLODEX_REDIS_URL": "redis://127.0.0.1:1"}),
		&stderr, &stderr, nil)
	if err == nil {
		t.Error("--check-config against a closed port = nil; want an error naming Redis")
	}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		if line != "" && !strings.HasPrefix(line, "{") {
			t.Errorf("--check-config wrote a raw line: %q", line)
		}
	}
}
