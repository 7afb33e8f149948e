package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/account"
)

const (
	// fleetSize is the number of data-plane processes.
	fleetSize = 3
	// The working policy: fast enough that the load never waits long.
	rate, burst = 600, 20
	// testBound is a generous bound on the whole test; the cases bound
	// their own polls far below it.
	testBound = 3 * time.Minute
)

// TestFleet runs three clodex-dataplane processes against one
// clodex-controlplane and clodex-sim, all real binaries on loopback, and
// checks the fleet's promises (README, Operations) in order (each step leaves the fleet
// as the next one needs it):
//
//  1. clodexctl set-rate reaches every data plane within a second;
//  2. killing the control plane mid-run fails no turn, and restarting it
//     restores central admission on every data plane;
//  3. adaptive mode lowers the effective rate after upstream 403s;
//  4. the usage ledger (clodexctl usage) holds what clodex-sim counted,
//     every step above included, within 1 %.
//
// The adaptive rule's restore (+configured/10 per quiet minute) needs a
// minute of quiet per step; it is covered with a fake clock by the
// control plane's own tests (controlplane/store adaptive tests), not here.
func TestFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()
	bins := buildBinaries(t, ctx)

	dir := t.TempDir()
	f, err := cluster.Start(ctx, cluster.Options{
		Bins:              bins,
		Dir:               dir,
		Mode:              cluster.Central,
		DataPlanes:        fleetSize,
		Rate:              rate,
		Burst:             burst,
		UpgradeLimit:      100000, // no throttle until the adaptive step lowers it
		UpgradeWindow:     10 * time.Second,
		ControlPlaneAdmin: true,
		DataPlaneArgs:     []string{"--usage-flush", "1s"},
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

	h.waitAgents(ctx, fleetSize)
	for i := range f.DataPlanes {
		h.mustTurn(ctx, i) // every data plane has served the account
	}

	t.Run("SetRateReachesEveryDataPlaneWithinASecond", func(t *testing.T) { h.t = t; h.setRatePropagates(ctx) })
	t.Run("KillMidRunFailsNoTurnAndRestartRestoresCentral", func(t *testing.T) { h.t = t; h.killMidRun(ctx) })
	t.Run("AdaptiveLowersEffectiveRate", func(t *testing.T) { h.t = t; h.adaptiveLowers(ctx) })
	t.Run("UsageLedgerMatchesTheEmulator", func(t *testing.T) { h.t = t; h.usageMatches(ctx) })
}

type harness struct {
	t      *testing.T
	f      *cluster.Fleet
	client *http.Client
}

// setRatePropagates lowers the rate, kills the control plane one second
// after clodexctl set-rate returned, and checks that every data plane
// enforces the new rate on its own. Its local share of 30/min burst 1 over
// 3 live agents is 10/min burst 1: one new socket at once, the next slot
// 6 s away, beyond the 4.8 s wait bound of the default budget, so further
// new conversations are refused (a policy that can refuse: 5 retries x 4 s
// hint >= 6 s per slot). So 4 concurrent new conversations open at most
// one new socket per data plane within 3 s. With the old policy still in
// place (600/min burst 20: a share of 200/min burst 7) all 12 would open.
func (h *harness) setRatePropagates(ctx context.Context) {
	t, f := h.t, h.f
	v, err := f.ControlPlane.SetRate(ctx, 30, 1)
	if err != nil {
		t.Fatalf("set-rate: %v", err)
	}
	set := time.Now()
	if v.RatePerMinute != 30 || v.Burst != 1 {
		t.Fatalf("set-rate %s 30 --burst 1 printed rate %d burst %d, want 30 and 1", cluster.Account, v.RatePerMinute, v.Burst)
	}
	if err := sleepUntil(ctx, set.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	f.ControlPlane.Kill()

	before := h.upgrades(ctx)
	const perDataPlane = 4
	var wg sync.WaitGroup
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for _, dp := range f.DataPlanes {
		for range perDataPlane {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cluster.RunTurn(tctx, h.client, dp.BaseURL, cluster.Retry{MaxRetries: 0}, rand.Float64)
			}()
		}
	}
	wg.Wait()
	opened := h.upgrades(ctx) - before
	if max := int64(len(f.DataPlanes)); opened > max {
		t.Errorf("after set-rate 30/min burst 1 and the control plane killed 1 s later, %d concurrent new conversations on %d data planes opened %d upstream sockets, want at most %d (each data plane's share of the new policy is 10/min burst 1; the old policy's share would open all %d)",
			perDataPlane*len(f.DataPlanes), len(f.DataPlanes), opened, max, perDataPlane*len(f.DataPlanes))
	}

	// Back to the working policy for the next steps.
	if err := f.ControlPlane.Restart(ctx); err != nil {
		t.Fatalf("restart control plane: %v", err)
	}
	if _, err := f.ControlPlane.SetRate(ctx, rate, burst); err != nil {
		t.Fatalf("set-rate: %v", err)
	}
	h.waitAgents(ctx, fleetSize)
}

// killMidRun runs Claude-Code-like load on every data plane, SIGKILLs the
// control plane 1.5 s in and restarts it 3 s later, and checks that no
// turn failed and that turns kept completing during the outage. Then each
// data plane must be admitted centrally again: the restarted control
// plane (whose counters start at zero) counts its admissions.
func (h *harness) killMidRun(ctx context.Context) {
	t, f := h.t, h.f
	const (
		killAt    = 1500 * time.Millisecond
		restartAt = 4500 * time.Millisecond
		duration  = 7 * time.Second
	)
	bases := make([]string, len(f.DataPlanes))
	for i, dp := range f.DataPlanes {
		bases[i] = dp.BaseURL
	}
	start := time.Now()
	killed, restarted := make(chan time.Time, 1), make(chan time.Time, 1)
	outageErr := make(chan error, 1)
	go func() {
		if err := sleepUntil(ctx, start.Add(killAt)); err != nil {
			outageErr <- err
			return
		}
		f.ControlPlane.Kill()
		killed <- time.Now()
		if err := sleepUntil(ctx, start.Add(restartAt)); err != nil {
			outageErr <- err
			return
		}
		err := f.ControlPlane.Restart(ctx)
		restarted <- time.Now()
		outageErr <- err
	}()
	res, err := cluster.RunLoad(ctx, cluster.LoadConfig{
		BaseURLs: bases,
		Agents:   4,
		Duration: duration,
		Drain:    30 * time.Second,
		Retry:    cluster.Retry{MaxRetries: 10},
		Client:   h.client,
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := <-outageErr; err != nil {
		t.Fatalf("outage: %v", err)
	}
	down, up := <-killed, <-restarted

	if res.Failed != 0 || res.Unfinished != 0 {
		t.Errorf("with the control plane killed for %v mid-run: %d turns failed %v, %d unfinished; want none (ok %d)",
			up.Sub(down).Round(time.Millisecond), res.Failed, res.Reasons, res.Unfinished, res.OK)
	}
	during := 0
	for _, r := range res.Results {
		if r.OK && r.Start.After(down) && r.Start.Add(r.Latency).Before(up) {
			during++
		}
	}
	if during == 0 {
		t.Errorf("no turn started and completed while the control plane was down (%d turns ok in all); the fleet stopped serving", res.OK)
	}

	// Central again: each data plane's new conversations reach the
	// restarted control plane. A data plane retries it after its
	// fallback backoff (at most 10 s, ±20 %), so poll with a bound.
	for i := range f.DataPlanes {
		h.waitCentral(ctx, i, 30*time.Second)
	}
}

// waitCentral sends new conversations to data plane i until the control
// plane's admission counter moves, or fails after bound.
func (h *harness) waitCentral(ctx context.Context, i int, bound time.Duration) {
	t, f := h.t, h.f
	const metric = "clodex_controlplane_admissions_total"
	before, err := f.ControlPlane.Metric(ctx, h.client, metric)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(bound)
	for time.Now().Before(deadline) {
		h.mustTurn(ctx, i)
		now, err := f.ControlPlane.Metric(ctx, h.client, metric)
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			return
		}
		if err := sleepUntil(ctx, time.Now().Add(250*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	t.Errorf("data plane %d: the restarted control plane saw no admission within %v of new conversations; the data plane stayed on its local bucket", i, bound)
}

// adaptiveLowers turns adaptive mode on, lowers the emulator's throttle so
// new sockets get 403s, and checks that the control plane hears of them
// and lowers the effective rate by the rule max(1, floor(0.5 x effective))
// from the configured 600 while the configured rate stays 600. When it
// does not, the failure says whether the data planes reported no 403 at
// all (clodex_controlplane_upstream_403_total stayed 0: the report path
// from the upgrade to the control plane is broken) or the control plane
// heard them and did not lower the rate.
func (h *harness) adaptiveLowers(ctx context.Context) {
	t, f := h.t, h.f
	const upstream403 = "clodex_controlplane_upstream_403_total"
	if err := f.ControlPlane.SetAdaptive(ctx, true); err != nil {
		t.Fatalf("set-adaptive: %v", err)
	}
	if err := f.Sim.Configure(ctx, h.client, `{"upgrade_limit":1,"upgrade_window":"1m"}`); err != nil {
		t.Fatal(err)
	}
	// 600 -> 300 -> 150 -> 75 (one step per 10 s at most), computed by hand.
	ladder := map[int]bool{300: true, 150: true, 75: true}
	deadline := time.Now().Add(30 * time.Second)
	var (
		last     cluster.AccountView
		sim403   int64
		reported float64
		err      error
	)
	for time.Now().Before(deadline) {
		var wg sync.WaitGroup
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		for _, dp := range f.DataPlanes {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cluster.RunTurn(tctx, h.client, dp.BaseURL, cluster.Retry{MaxRetries: 0}, rand.Float64)
				}()
			}
		}
		wg.Wait()
		cancel()
		if last, err = f.ControlPlane.Get(ctx); err != nil {
			t.Fatalf("get: %v", err)
		}
		if last.EffectiveRatePerMinute == nil {
			t.Fatalf("clodexctl get -o json printed no effective_rate_per_minute")
		}
		if reported, err = f.ControlPlane.Metric(ctx, h.client, upstream403); err != nil {
			t.Fatal(err)
		}
		if eff := *last.EffectiveRatePerMinute; eff != rate {
			if !ladder[eff] || last.RatePerMinute != rate {
				t.Fatalf("after upstream 403s: rate_per_minute %d, effective_rate_per_minute %d; want rate %d and effective one of 300, 150, 75", last.RatePerMinute, eff, rate)
			}
			if reported < 1 {
				t.Errorf("the control plane lowered the rate but %s is %v", upstream403, reported)
			}
			return
		}
		sim403 = h.stats(ctx).Upgrade403s
	}
	if sim403 > 0 && reported == 0 {
		t.Errorf("clodex-sim answered %d upgrade 403s but the control plane received no 403 report (%s = 0) in 30 s: the data planes no longer report upgrade 403s (the pool dialer's 403 -> agent.Report403 path), so adaptive mode cannot act", sim403, upstream403)
		return
	}
	t.Errorf("effective_rate_per_minute still %v after 30 s (emulator: %d upgrade 403s; control plane: %v reported); want 300 (0.5 x 600)", deref(last.EffectiveRatePerMinute), sim403, reported)
}

func (h *harness) stats(ctx context.Context) statsView {
	st, err := h.f.Sim.Stats(ctx, h.client)
	if err != nil {
		h.t.Fatal(err)
	}
	return statsView{Upgrades: st.Upgrades, Upgrade403s: st.Upgrade403s}
}

type statsView struct{ Upgrades, Upgrade403s int64 }

func (h *harness) upgrades(ctx context.Context) int64 { return h.stats(ctx).Upgrades }

// mustTurn runs one new conversation on data plane i; it must succeed.
func (h *harness) mustTurn(ctx context.Context, i int) {
	h.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	r := cluster.RunTurn(tctx, h.client, h.f.DataPlanes[i].BaseURL, cluster.Retry{MaxRetries: 3}, rand.Float64)
	if !r.OK {
		h.t.Fatalf("data plane %d: a new conversation failed after %d attempts: %s (cancelled %v)", i, r.Attempts, r.Reason, r.Cancelled)
	}
}

// waitAgents polls clodexctl agents until n live agents serve the fleet
// account (bounded).
func (h *harness) waitAgents(ctx context.Context, n int) {
	h.t.Helper()
	key := account.Key(cluster.Account)
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		// Any replica lists the whole fleet (replicas share a roster in
		// Redis), so asking the first is enough, whichever replica holds
		// each agent's stream.
		live := map[string]bool{}
		all, err := h.f.ControlPlane.Agents(ctx)
		for _, a := range all {
			if (a.Live == nil || *a.Live) && contains(a.Accounts, key, cluster.Account) {
				live[a.ID] = true
			}
		}
		if err == nil {
			if len(live) >= n {
				return
			}
			last = fmt.Sprintf("%d live agents for %s: %+v", len(live), key, all)
		} else {
			last = err.Error()
		}
		if err := sleepUntil(ctx, time.Now().Add(200*time.Millisecond)); err != nil {
			h.t.Fatal(err)
		}
	}
	h.t.Fatalf("want %d live agents within 30 s; last: %s", n, last)
}

func contains(list []string, vals ...string) bool {
	for _, v := range list {
		for _, w := range vals {
			if v == w {
				return true
			}
		}
	}
	return false
}

func deref(p *int) any {
	if p == nil {
		return "absent"
	}
	return *p
}

func sleepUntil(ctx context.Context, at time.Time) error {
	t := time.NewTimer(time.Until(at))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// buildBinaries builds the four programs into a test directory (one go
// build; the build cache makes it fast).
func buildBinaries(t *testing.T, ctx context.Context) cluster.Binaries {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root %s: %v", root, err)
	}
	goBin, err := exec.LookPath("go") // go test puts the go command that runs it first on PATH
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	bins, err := cluster.Build(ctx, goBin, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return bins
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
