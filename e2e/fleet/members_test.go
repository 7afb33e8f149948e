package fleet

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// members runs on a fleet of two replicas over Redis: a data plane
// started with --member-keys (the fleet's agent token) serves the key
// `clodexctl member create` wrote, and refuses another (401, x-should-retry
// false); the key keeps working through a FLUSHALL (the replicas put the
// member back); `clodexctl member remove` through the other replica makes
// the data plane refuse it. The delay from the removal to the first
// refusal is printed.
func (h *harness) members(ctx context.Context, dir string) {
	t, f := h.t, h.f
	dp, err := f.StartDataPlane(ctx, "--member-keys")
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "alice.key")
	if out, err := f.ControlPlanes[0].Ctl(ctx, "member", "create", "alice", "--rate", "600", "--out", keyFile); err != nil || !strings.Contains(string(out), "member alice created") {
		t.Fatalf("member create = %s, %v", out, err)
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(b))
	for i := 0; ; i++ { // the member list reaches the data plane on its agent stream
		if st, _ := h.postKey(ctx, dp.BaseURL, key); st == http.StatusOK {
			break
		}
		if i == 500 {
			t.Fatal("the --member-keys data plane never served alice's key")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st, body := h.postKey(ctx, dp.BaseURL, "clx_guessed"); st != http.StatusUnauthorized || !strings.Contains(body, "invalid member key") {
		t.Errorf("an unknown key = %d %s; want 401 invalid member key", st, body)
	}

	opt, err := redis.ParseURL(f.RedisURL())
	if err != nil {
		t.Fatal(err)
	}
	raw := redis.NewClient(opt)
	defer raw.Close()
	flushed := time.Now()
	if err := raw.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for served := 1; ; served++ {
		if st, body := h.postKey(ctx, dp.BaseURL, key); st != http.StatusOK {
			t.Fatalf("alice's turn %d after the FLUSHALL = %d %s", served, st, body)
		}
		if n, _ := raw.HLen(ctx, "clodex:members").Result(); n == 1 {
			t.Logf("FLUSHALL: alice was back in redis %v after it, %d of her turns in between, every one served",
				time.Since(flushed).Round(time.Millisecond), served)
			break
		}
		if served == 500 {
			t.Fatal("alice is not back in redis after the FLUSHALL")
		}
		time.Sleep(20 * time.Millisecond)
	}

	removed := time.Now()
	if _, err := f.ControlPlanes[1].Ctl(ctx, "member", "remove", "alice"); err != nil {
		t.Fatal(err)
	}
	for served := 0; ; served++ {
		st, body := h.postKey(ctx, dp.BaseURL, key)
		if st == http.StatusUnauthorized {
			t.Logf("member removal: the data plane refused alice's key at most %v after `clodexctl member remove` was started through the other replica, clodexctl's own run included (%d turns served in between)",
				time.Since(removed).Round(time.Millisecond), served)
			break
		}
		if st != http.StatusOK || served == 1000 {
			t.Fatalf("alice's turn after her removal = %d %s; want 200 until the push, then 401", st, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// postKey sends one new conversation to base with key and returns the
// status and body.
func (h *harness) postKey(ctx context.Context, base, key string) (int, string) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(cluster.TurnRequest(cluster.NewSessionID())))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", key)
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
