package control_test

import (
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
)

// The stream's connect (the old OnConnect) happens once per stream opened:
// on the first connect and again after the control plane restarts.
func TestConnectOnEveryConnect(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	a := startAgent(t, srv, clk, "h1-1-a", keyA)

	a.rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	if got := a.rec.connected(); got != 1 {
		t.Fatalf("connects after the first connect = %d, want 1", got)
	}
	first := a.rec.count()
	srv.Stop()
	srv.Restart()
	eventually(t, "a push after the restart", func() bool { return a.rec.count() > first })
	if got := a.rec.connected(); got != 2 {
		t.Errorf("connects after the restart = %d, want 2", got)
	}
}

// When the stream connects again after an outage, admission returns to the
// control plane without waiting for a request: the outage's local grants
// are handed over first (the old OnConnect, CentralMaybeBack and the
// node's recover loop).
func TestReconnectHandsOverAndReturnsToCentral(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	admin := adminClient(srv)
	rec := newRecorder()
	var notes noticeLog
	cfg := agentConfig(srv, clk, rec, "h1-1-a", keyA)
	cfg.Sleep, cfg.Notify, cfg.Rand = clk.Sleep, notes.Notify, func() float64 { return 0.5 }
	a := run(t, cfg, rec)
	rec.waitFor(t, "on connect", keyA, func(push) bool { return true })
	if err := a.Admit(t.Context(), keyA); err != nil || a.Mode() != control.ModeCentral {
		t.Fatalf("Admit = %v in mode %q, want nil in central", err, a.Mode())
	}

	srv.Stop()
	// The stream finds the control plane gone (or the next Admit does):
	// local, from an empty bucket at 60/minute: one token a second.
	for range 3 {
		clk.Advance(2 * time.Second)
		if err := a.Admit(t.Context(), keyA); err != nil {
			t.Fatalf("local Admit = %v, want nil", err)
		}
	}
	if a.Reachable() || a.Mode() != control.ModeLocal {
		t.Fatalf("during the outage Reachable() = %v, Mode() = %q; want false and %q", a.Reachable(), a.Mode(), control.ModeLocal)
	}

	srv.Restart() // buckets start full: 10 tokens
	eventually(t, "central admission after the stream reconnects", func() bool { return a.Reachable() })
	if got := a.Mode(); got != control.ModeCentral {
		t.Errorf("Mode() after the reconnect = %q, want %q", got, control.ModeCentral)
	}
	if got := tokens(t, admin, keyA); got != 7 {
		t.Errorf("tokens after the hand-over = %v, want 7 (10 - the 3 local grants)", got)
	}
	if st := a.Stats(); st.HandedOver != 3 || st.Recoveries != 1 || st.Fallbacks != 1 {
		t.Errorf("Stats() = %+v, want 3 grants handed over, 1 fallback and 1 recovery", st)
	}
	msgs := notes.Msgs()
	if len(msgs) != 2 || !strings.Contains(msgs[0], "control plane unreachable") || !strings.Contains(msgs[1], "reachable again") {
		t.Errorf("notices = %q, want one unreachable notice then one back notice", msgs)
	}
}

// When agents leave, the control plane pushes the lower count at once, but
// LiveAgents keeps the higher one for the 15 s liveness window.
func TestLiveAgentsHoldsTheHigherCountForTheWindow(t *testing.T) {
	clk := newFakeClock()
	srv := startServer(t, clk)
	a1 := startAgent(t, srv, clk, "h1-1-a", keyA)
	a2 := startAgent(t, srv, clk, "h2-2-b", keyA)
	a3 := startAgent(t, srv, clk, "h3-3-c", keyA)
	a1.rec.waitFor(t, "with live 3", keyA, func(p push) bool { return p.live == 3 })
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Fatalf("LiveAgents = %d, want 3", got)
	}

	a2.stop()
	a3.stop()
	a1.rec.waitFor(t, "with live 1", keyA, func(p push) bool { return p.live == 1 })
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Errorf("LiveAgents right after the drop = %d, want 3", got)
	}
	clk.Advance(control.LiveWindow - time.Millisecond)
	if got := a1.LiveAgents(keyA); got != 3 {
		t.Errorf("LiveAgents 14.999s after the drop = %d, want 3", got)
	}
	clk.Advance(time.Millisecond)
	if got := a1.LiveAgents(keyA); got != 1 {
		t.Errorf("LiveAgents 15s after the drop = %d, want 1", got)
	}
}
