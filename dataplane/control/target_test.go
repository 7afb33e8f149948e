package control_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

func TestParseControlPlanes(t *testing.T) {
	tests := []struct {
		spec string
		want control.ControlPlanes
	}{
		{"cp.example:17700", control.ControlPlanes{Target: "dns:///cp.example:17700"}},
		{" cp.example:17700 ", control.ControlPlanes{Target: "dns:///cp.example:17700"}},
		{"[::1]:17700", control.ControlPlanes{Target: "dns:///[::1]:17700"}},
		{"a:17700,b:17700", control.ControlPlanes{Target: "clodex-controlplanes:///controlplanes", Addrs: []string{"a:17700", "b:17700"}}},
		{"a:1, b:2 ,c:3", control.ControlPlanes{Target: "clodex-controlplanes:///controlplanes", Addrs: []string{"a:1", "b:2", "c:3"}}},
		{"dns:///cp.example:17700", control.ControlPlanes{Target: "dns:///cp.example:17700"}},
		{"dns://8.8.8.8/cp.example:17700", control.ControlPlanes{Target: "dns://8.8.8.8/cp.example:17700"}},
	}
	for _, tt := range tests {
		got, err := control.ParseControlPlanes(tt.spec)
		if err != nil {
			t.Errorf("ParseControlPlanes(%q) = %v", tt.spec, err)
			continue
		}
		if got.Target != tt.want.Target || !slices.Equal(got.Addrs, tt.want.Addrs) {
			t.Errorf("ParseControlPlanes(%q) = %+v, want %+v", tt.spec, got, tt.want)
		}
	}

	bad := []struct {
		spec    string
		wantErr []string
	}{
		{"", []string{"control plane address is empty; want host:port, a comma-separated list of host:port, or dns:///host:port"}},
		{"cp", []string{`control plane address 1 of 1 ("cp"): not host:port (e.g. controlplane.internal:17700)`}},
		{"a:1,,b", []string{`address 2 of 3 (""): not host:port`, `address 3 of 3 ("b"): not host:port`}},
		{"a:1,a:1", []string{`control plane address "a:1" is listed twice`}},
		{":17700", []string{"not host:port"}},
		{"http://cp:17700", []string{`control plane address "http://cp:17700" has a scheme`}},
		{"dns:///cp", []string{`control plane target "dns:///cp": not host:port`}},
		{"dns:///a:1,b:2", []string{"want dns:///host:port (one name; list several addresses without the dns:// prefix)"}},
		{strings.Repeat("a:1,", 64) + "a:2", []string{"control plane list has 65 addresses; allowed at most 64"}},
	}
	for _, tt := range bad {
		_, err := control.ParseControlPlanes(tt.spec)
		if err == nil {
			t.Errorf("ParseControlPlanes(%q) = nil error, want %q", tt.spec, tt.wantErr)
			continue
		}
		for _, w := range tt.wantErr {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("ParseControlPlanes(%q) = %q, want it to contain %q", tt.spec, err, w)
			}
		}
	}
}

// replicas is the --control-plane list of the servers' addresses.
func replicas(srvs ...*controlplanetest.Server) string {
	addrs := make([]string, len(srvs))
	for i, s := range srvs {
		addrs[i] = s.Addr
	}
	return strings.Join(addrs, ",")
}

// TestFailoverAcrossReplicas kills one of two replicas while 32 callers
// admit through one connection to both: every request is still decided by
// a control plane (none falls back to a local bucket, none fails), the
// survivor takes them all, and the connection balanced over both before.
func TestFailoverAcrossReplicas(t *testing.T) {
	off := pacing.DefaultPolicy()
	off.RatePerMinute = 0 // every central decision admits: the test is about routing
	a := controlplanetest.Start(t, &controlplanetest.Options{Defaults: &off})
	b := controlplanetest.Start(t, &controlplanetest.Options{Defaults: &off, Tokens: a})
	// A data plane registers the accounts it serves: these 1000.
	keys := []string{keyA, keyB}
	for i := range 20 {
		keys = append(keys, account.Key(fmt.Sprint("warm-", i)))
	}
	for w := range 32 {
		for i := range 30 {
			keys = append(keys, account.Key(fmt.Sprint("load-", w, "-", i)))
		}
	}
	const probes = 18 // the hello takes at most 1000 accounts
	for i := range probes {
		keys = append(keys, account.Key(fmt.Sprint("probe-", i)))
	}
	a.Register(keys...)
	b.Register(keys...)
	var notes noticeLog
	// A generous timeout: a loaded machine must not turn a slow answer
	// into a local decision; the test is about a dead replica's errors.
	c := newClient(t, control.Config{Target: replicas(a, b), Token: a.AgentToken, Timeout: 10 * time.Second}, newFakeClock(), &notes)
	ctx := t.Context()

	// Round robin picks among the replicas that are READY and whose store
	// health says SERVING; the connection is READY with the first. Probe
	// until both have decided one (each probe account once), so the warm
	// round below starts with both in the balancer.
	probed := 0
	for ready := false; !ready; probed++ {
		i := probed
		if i == probes {
			t.Fatalf("after %d admissions one replica still decided none: the balancer never used both", probes)
		}
		k := account.Key(fmt.Sprint("probe-", i))
		if err := c.Admit(ctx, k); err != nil {
			t.Fatal(err)
		}
		decided := func(s *controlplanetest.Server) bool {
			for j := range i + 1 {
				if _, err := s.Store().Account(ctx, account.Key(fmt.Sprint("probe-", j)), time.Now()); err == nil {
					return true
				}
			}
			return false
		}
		if decided(a) && decided(b) {
			ready = true
		} else {
			time.Sleep(250 * time.Millisecond) // let the second replica's health check report
		}
	}

	// Round robin: distinct accounts land on both replicas (each has its
	// own memory store, so an account's presence says who decided it).
	served := func(s *controlplanetest.Server, n int) int {
		k := 0
		for i := range n {
			if _, err := s.Store().Account(ctx, account.Key(fmt.Sprint("warm-", i)), time.Now()); err == nil {
				k++
			}
		}
		return k
	}
	const warm = 20
	for i := range warm {
		if err := c.Admit(ctx, account.Key(fmt.Sprint("warm-", i))); err != nil {
			t.Fatal(err)
		}
	}
	if na, nb := served(a, warm), served(b, warm); na == 0 || nb == 0 || na+nb != warm {
		t.Fatalf("before the kill, replica A decided %d and B %d of %d accounts; want both some, %d in all", na, nb, warm, warm)
	}

	const callers, each, killAfter = 32, 30, 10
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	killed := make(chan struct{})
	var once sync.Once
	for w := range callers {
		wg.Go(func() {
			for i := range each {
				if w == 0 && i == killAfter {
					once.Do(func() { a.Kill(); close(killed) })
				}
				if err := c.Admit(ctx, account.Key(fmt.Sprint("load-", w, "-", i))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Admit during the kill = %v, want nil", err)
	}
	<-killed

	st := c.Stats()
	if st.Local != (control.Counts{}) || st.Fallbacks != 0 || st.Errors != 0 {
		t.Errorf("stats after killing one of two replicas = %+v; want every decision central (no local decision, fallback or error)", st)
	}
	if got, want := st.Central.Admits, int64(probed+warm+callers*each); got != want {
		t.Errorf("central admits = %d, want %d", got, want)
	}
	// After the kill every caller's next request went to the survivor.
	for w := range callers {
		key := account.Key(fmt.Sprint("load-", w, "-", each-1))
		if _, err := b.Store().Account(ctx, key, time.Now()); err != nil {
			t.Errorf("the last request of caller %d (after the kill) was not decided by the surviving replica: %v", w, err)
		}
	}
	if msgs := notes.Msgs(); len(msgs) != 0 {
		t.Errorf("notices = %q, want none (admission never left the control planes)", msgs)
	}
}

// TestAllReplicasDownIsLocal: with every replica gone an RPC fails at once
// (no replica is healthy) and the request is decided locally.
func TestAllReplicasDownIsLocal(t *testing.T) {
	a := controlplanetest.Start(t, nil)
	b := controlplanetest.Start(t, &controlplanetest.Options{Tokens: a})
	a.Register(keyA, keyB)
	b.Register(keyA, keyB)
	var notes noticeLog
	c := newClient(t, control.Config{Target: replicas(a, b), Token: a.AgentToken, Timeout: 10 * time.Second}, newFakeClock(), &notes)
	if err := c.Admit(t.Context(), keyA); err != nil {
		t.Fatal(err)
	}
	a.Kill()
	b.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := c.Admit(ctx, keyA); err != nil {
		t.Fatalf("Admit with both replicas down = %v, want a local decision", err)
	}
	if got := c.Mode(); got != control.ModeLocal {
		t.Errorf("Mode() = %q, want %q", got, control.ModeLocal)
	}
}
