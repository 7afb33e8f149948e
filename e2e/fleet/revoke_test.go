package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// TestRevocation runs two clodex-controlplane replicas over one
// redis-server with the credential broker, a data plane on the fleet's
// agent token and one on a scoped agent credential, all real binaries on
// loopback. After `clodexctl agent remove` through the second replica
// the scoped data plane stops serving: its next turn, and every one
// after, is answered 403 permission_error with x-should-retry: false
// saying the credential was revoked and what to do (it held a broker
// token and sockets it could have used); the control plane lists it no
// more; the other data plane serves on. The delay from the removal to
// the first such answer is printed. Then members (members.go) on the same
// fleet: a data plane started with --member-keys serves a key from
// `clodexctl member create`, through a FLUSHALL, until `clodexctl member
// remove` through the other replica.
func TestRevocation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed (CI=true requires it; apt-get install redis-server): %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	bins := buildBinaries(t, ctx)
	dir := t.TempDir()
	f, err := cluster.Start(ctx, cluster.Options{
		Bins:          bins,
		Dir:           dir,
		Mode:          cluster.Central,
		Replicas:      2,
		DataPlanes:    1,
		Rate:          rate,
		Burst:         burst,
		UpgradeLimit:  100000,
		UpgradeWindow: 10 * time.Second,
		Broker:        true,
	})
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			for _, l := range f.Logs() {
				b, _ := os.ReadFile(l)
				t.Logf("---- %s ----\n%s", filepath.Base(l), lastLines(string(b), 40))
			}
		}
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	h := &harness{t: t, f: f, client: client}

	tokFile := filepath.Join(dir, "dp-rev.token")
	if _, err := f.ControlPlane.Ctl(ctx, "agent", "create", "dp-rev", "--accounts", cluster.Account, "--out", tokFile); err != nil {
		t.Fatal(err)
	}
	if _, err := f.StartDataPlane(ctx, "--agent-token-file", tokFile); err != nil {
		t.Fatal(err)
	}
	scoped := len(f.DataPlanes) - 1
	h.waitAgents(ctx, 2)
	h.mustTurn(ctx, 0)
	h.mustTurn(ctx, scoped)

	removed := time.Now()
	if _, err := f.ControlPlanes[1].Ctl(ctx, "agent", "remove", "dp-rev"); err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	var body []byte
	served := 0
	for ; ; served++ {
		resp, body = h.post(ctx, scoped)
		if resp.StatusCode != http.StatusOK || time.Since(removed) > 30*time.Second {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("revocation delay: the scoped data plane answered 403 at most %v after `clodexctl agent remove` was started through the other replica, clodexctl's own run included (%d turns served in between)",
		time.Since(removed).Round(time.Millisecond), served)
	var e struct {
		Error struct{ Type, Message string } `json:"error"`
	}
	_ = json.Unmarshal(body, &e)
	if resp.StatusCode != http.StatusForbidden || e.Error.Type != "permission_error" ||
		!strings.HasPrefix(e.Error.Message, `This data plane's agent credential "dp-rev" was revoked on the control plane at `) ||
		!strings.Contains(e.Error.Message, "an operator must create a new one (clodexctl agent create NAME --accounts ... --out FILE) and restart the data plane with --agent-token-file FILE") {
		t.Errorf("after the revocation: %d %s; want 403 permission_error saying dp-rev was revoked and what to do", resp.StatusCode, body)
	}
	if v := resp.Header.Get("X-Should-Retry"); v != "false" || resp.Header.Get("Retry-After") != "" {
		t.Errorf("x-should-retry %q, retry-after %q; want false and none", v, resp.Header.Get("Retry-After"))
	}
	for range 3 {
		if resp, _ := h.post(ctx, scoped); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a later turn on the revoked data plane = %d, want 403", resp.StatusCode)
		}
	}
	// The replicas list only the other data plane now.
	for deadline := time.Now().Add(30 * time.Second); ; {
		all, err := f.ControlPlanes[1].Agents(ctx)
		live := 0
		for _, a := range all {
			if a.Live == nil || *a.Live {
				live++
			}
		}
		if err == nil && live == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agents after the revocation: %+v, %v; want only the fleet token's data plane", all, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	h.mustTurn(ctx, 0)

	h.members(ctx, dir)
}

// post sends one new conversation to data plane i, without retries, and
// returns the answer and its body.
func (h *harness) post(ctx context.Context, i int) (*http.Response, []byte) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.f.DataPlanes[i].BaseURL+"/v1/messages", bytes.NewReader(cluster.TurnRequest(cluster.NewSessionID())))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-api-key", "fleet-test")
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, b
}
