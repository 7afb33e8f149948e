package fleet

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// TestReplicas runs two clodex-controlplane replicas over one
// redis-server and two clodex-dataplane processes that take both
// addresses (--control-plane a,b), all real binaries on loopback, and
// checks the replicas' promises (README, Operations) in order:
//
//  1. accuracy: the two data planes hammering one hot account (30/min,
//     burst 5) through both replicas open at most rate x T + burst new
//     sockets in any window of T (20 s here), plus 1 %: one bucket, however
//     many replicas serve it;
//  2. a replica SIGKILLed mid fan-out fails no turn, and no data plane
//     falls back to its local bucket: the survivor admits every new
//     socket centrally.
func TestReplicas(t *testing.T) {
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

	const (
		window            = 20 * time.Second
		hotRate, hotBurst = 30, 5
	)
	f, err := cluster.Start(ctx, cluster.Options{
		Bins:          bins,
		Dir:           t.TempDir(),
		Mode:          cluster.Central,
		Replicas:      2,
		DataPlanes:    2,
		Rate:          hotRate,
		Burst:         hotBurst,
		UpgradeLimit:  100000, // no throttle: the emulator only counts
		UpgradeWindow: window,
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
	h.waitAgents(ctx, 2)

	t.Run("OneBucketAcrossReplicas", func(t *testing.T) {
		h.t = t
		bases := []string{f.DataPlanes[0].BaseURL, f.DataPlanes[1].BaseURL}
		// Six agents per data plane retrying on Claude Code's ladder ask
		// about three times a second, six times the account's rate.
		res, err := cluster.RunLoad(ctx, cluster.LoadConfig{
			BaseURLs: bases, Agents: 6, Duration: window, Drain: 30 * time.Second,
			Retry: cluster.Retry{MaxRetries: 10}, Client: client,
		})
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		st := h.stats(ctx)
		maxWin := h.maxWindow(ctx)
		bound := float64(hotRate)*window.Minutes() + hotBurst
		t.Logf("2 replicas x 2 data planes x 6 agents at %d/min burst %d for %v: %d upgrades in all, at most %d in any %v window (bound %.0f + 1%%); %d turns ok, %d 429s retried",
			hotRate, hotBurst, window, st.Upgrades, maxWin, window, bound, res.OK, res.Retries)
		if float64(maxWin) > bound*1.01 {
			t.Errorf("the fleet opened %d upstream sockets in one %v window; want at most rate x time + burst = %.0f (+1%%)", maxWin, window, bound)
		}
		if res.OK == 0 {
			t.Errorf("no turn completed in %v (%+v); the load did not reach the upstream", window, res)
		}
		h.noLocalAdmission()
	})

	t.Run("KillAReplicaMidFanOut", func(t *testing.T) {
		h.t = t
		if _, err := f.ControlPlane.SetRate(ctx, rate, burst); err != nil {
			t.Fatalf("set-rate: %v", err)
		}
		bases := []string{f.DataPlanes[0].BaseURL, f.DataPlanes[1].BaseURL}
		killed := make(chan struct{})
		go func() {
			defer close(killed)
			if sleepUntil(ctx, time.Now().Add(2*time.Second)) == nil {
				f.ControlPlanes[1].Kill()
			}
		}()
		res, err := cluster.RunLoad(ctx, cluster.LoadConfig{
			BaseURLs: bases, Agents: 8, Duration: 6 * time.Second, Drain: 30 * time.Second,
			Retry: cluster.Retry{MaxRetries: 10}, Client: client,
		})
		<-killed
		if err != nil {
			t.Fatalf("load: %v", err)
		}
		t.Logf("fan-out with replica cp-1 SIGKILLed 2 s in: %d turns ok, %d failed, %d unfinished", res.OK, res.Failed, res.Unfinished)
		if res.Failed != 0 || res.Unfinished != 0 || res.OK == 0 {
			t.Errorf("with a replica killed mid fan-out: %d turns failed %v, %d unfinished, %d ok; want none failed", res.Failed, res.Reasons, res.Unfinished, res.OK)
		}
		h.noLocalAdmission()
	})
}

// noLocalAdmission fails when a data plane's log says it admitted from
// its local bucket: with a replica alive, every admission is central.
func (h *harness) noLocalAdmission() {
	h.t.Helper()
	for i, dp := range h.f.DataPlanes {
		b, err := os.ReadFile(dp.Log)
		if err != nil {
			h.t.Fatal(err)
		}
		if strings.Contains(string(b), "admitting new upstream connections locally") {
			h.t.Errorf("data plane %d fell back to local admission with a replica alive; log:\n%s", i, lastLines(string(b), 20))
		}
	}
}

// maxWindow is the emulator's most accepted upgrades of the fleet account
// in one throttle window.
func (h *harness) maxWindow(ctx context.Context) int {
	st, err := h.f.Sim.Stats(ctx, h.client)
	if err != nil {
		h.t.Fatal(err)
	}
	return st.MaxUpgradesPerWindow[cluster.Account]
}
