package control_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/pacing"
)

// TestCentralMaybeBack checks that a reconnect signal makes the next Admit
// probe at once, that a probe failing after it backs off from 250 ms again,
// and that a central client ignores it.
func TestCentralMaybeBack(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &notes)

	c.CentralMaybeBack() // central: nothing to do
	runSteps(t, c, clk, []step{{key: keyA}})
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() = %q, want %q", got, control.ModeCentral)
	}
	srv.Stop()
	// keyB's pacing is off: every local decision admits at once.
	if err := c.SetPolicy(keyB, pacing.Policy{RatePerMinute: 0, Burst: 10, Budget: pacing.DefaultBudget()}); err != nil {
		t.Fatal(err)
	}

	type admitAt struct {
		advance    time.Duration
		back       bool // call CentralMaybeBack before the Admit
		wantProbes int64
		wantMode   string
	}
	run := func(steps []admitAt) {
		t.Helper()
		for i, s := range steps {
			clk.Advance(s.advance)
			if s.back {
				c.CentralMaybeBack()
			}
			if err := c.Admit(t.Context(), keyB); err != nil {
				t.Fatalf("step %d: Admit = %v, want nil", i+1, err)
			}
			if got := c.Stats().Probes; got != s.wantProbes {
				t.Fatalf("step %d (+%v, back %v): probes = %d, want %d", i+1, s.advance, s.back, got, s.wantProbes)
			}
			if got := c.Mode(); got != s.wantMode {
				t.Fatalf("step %d: Mode() = %q, want %q", i+1, got, s.wantMode)
			}
		}
	}
	run([]admitAt{
		{0, false, 0, control.ModeLocal},                      // falls back; next probe at 250ms
		{250 * time.Millisecond, false, 1, control.ModeLocal}, // fails; next 500ms later
		{500 * time.Millisecond, false, 2, control.ModeLocal}, // fails; next 1s later
		{0, true, 3, control.ModeLocal},                       // probes at once, fails; next 250ms later, not 2s
		{249 * time.Millisecond, false, 3, control.ModeLocal},
		{1 * time.Millisecond, false, 4, control.ModeLocal}, // fails; next 500ms later
	})

	srv.Restart()
	waitReady(t, c)
	run([]admitAt{
		{0, false, 4, control.ModeLocal},  // the backoff still runs
		{0, true, 5, control.ModeCentral}, // the agent reconnected: back at once
		{0, true, 5, control.ModeCentral}, // central: asks without probing
	})
	want := control.Stats{
		Central:    control.Counts{Admits: 3},
		Local:      control.Counts{Admits: 7}, // six before the restart, one after
		Fallbacks:  1,
		Recoveries: 1,
		Probes:     5,
	}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	if msgs := notes.Msgs(); len(msgs) != 2 || !strings.Contains(msgs[1], "reachable again") {
		t.Errorf("notices = %q, want the unreachable notice then one back notice", msgs)
	}
}

// TestEachOutageStartsEmpty checks that the local bucket of every outage
// starts with no tokens, so the switch never adds a burst to what the
// central bucket just admitted, and that the share and the notice use the
// live count of the account that fell back.
func TestEachOutageStartsEmpty(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &notes)
	c.SetLiveAgents(keyA, 2)
	c.SetLiveAgents(keyB, 5)

	runSteps(t, c, clk, []step{{key: keyA}, {key: keyA}})
	srv.Stop()
	// The default 60/minute burst 10 shared by keyA's 2 agents: 30/minute
	// burst 5, from zero tokens: 2 s, then 4 s.
	runSteps(t, c, clk, []step{
		{key: keyA, sleeps: []time.Duration{2 * sec}},
		{key: keyA, sleeps: []time.Duration{4 * sec}},
	})
	msgs := notes.Msgs()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "1/2 of its rate") {
		t.Fatalf("notices = %q, want one naming keyA's 1/2 share", msgs)
	}

	srv.Restart()
	waitReady(t, c)
	c.CentralMaybeBack()
	runSteps(t, c, clk, []step{{key: keyA}})
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() after the restart = %q, want %q", got, control.ModeCentral)
	}

	// Ten minutes later the first outage's bucket would be full (5
	// tokens). The second outage starts empty again.
	clk.Advance(10 * time.Minute)
	srv.Stop()
	runSteps(t, c, clk, []step{{key: keyA, sleeps: []time.Duration{2 * sec}}})
	want := control.Stats{
		Central:    control.Counts{Admits: 3},
		Local:      control.Counts{Waits: 3},
		Fallbacks:  2,
		Recoveries: 1,
		Probes:     1,
		HandOvers:  1, // the first outage's two local grants, before the probe's admission
		HandedOver: 2,
	}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	if got := notes.Msgs(); len(got) != 3 || !slices.ContainsFunc(got[2:], func(m string) bool { return strings.Contains(m, "1/2 of its rate") }) {
		t.Errorf("notices = %q, want unreachable, back, unreachable (1/2)", got)
	}
}
