package fleet

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// TestLearnedThrottle is issue 15's target for the learned upgrade
// throttle, with default settings and nothing configured about the limit:
// clodex-sim at 20 upgrades per 60 s (no retry-after on its 403s) and 30
// simultaneous new conversations spread over 3 data planes that share one
// control plane. The first upstream 403 pauses the account fleet-wide for
// the learned interval and halves its rate, so the throttle costs at most
// 3 upstream 403s and no turn fails (clients retry 429s after their
// retry-after, as Claude Code does). Without learning the same run sees
// dozens of 403s (make bench-fleet, learned-off-3). It asserts counts,
// not timing; it runs for about as long as the pause (some 70 s).
func TestLearnedThrottle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binaries for over a minute; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	bins := buildBinaries(t, ctx)
	f, err := cluster.Start(ctx, cluster.Options{
		Bins:          bins,
		Dir:           t.TempDir(),
		Mode:          cluster.Central,
		DataPlanes:    3,
		DefaultPolicy: true,
		UpgradeLimit:  20,
		UpgradeWindow: time.Minute,
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
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	t.Cleanup(client.CloseIdleConnections)
	h := &harness{t: t, f: f, client: client}
	h.waitAgents(ctx, 3)

	bases := make([]string, len(f.DataPlanes))
	for i, dp := range f.DataPlanes {
		bases[i] = dp.BaseURL
	}
	turnCtx, stop := context.WithTimeout(ctx, 150*time.Second)
	defer stop()
	res := cluster.RunFanOut(turnCtx, cluster.FanOutConfig{
		BaseURLs:      bases,
		Conversations: 30,
		Retry:         cluster.Retry{MaxRetries: 10},
		Client:        client,
	})
	st := h.stats(ctx)
	if res.OK != 30 || res.Failed != 0 || res.Unfinished != 0 {
		t.Errorf("fan-out of 30: %d ok, %d failed (%v), %d unfinished; want 30 ok", res.OK, res.Failed, res.Reasons, res.Unfinished)
	}
	if st.Upgrade403s > 3 {
		t.Errorf("clodex-sim answered %d upgrade 403s; want at most 3 (the throttle found once, the fleet paused)", st.Upgrade403s)
	}
	if st.Upgrades < 30 {
		t.Errorf("clodex-sim accepted %d upgrades; want at least 30 (one per conversation)", st.Upgrades)
	}
	t.Logf("fan-out of 30 over 3 data planes at 20 upgrades per 60 s: %d upstream 403s, %d failed turns, %d client retries, %v",
		st.Upgrade403s, res.Failed, res.Retries, res.Elapsed.Round(time.Second))
}
