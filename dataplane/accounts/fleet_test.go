package accounts

import (
	"errors"
	"testing"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// fleetView is a FleetView of fixed figures.
type fleetView map[string]*controlplanev1.RateLimits

func (f fleetView) FleetLimits(key string) (*controlplanev1.RateLimits, bool) {
	rl, ok := f[key]
	return rl, ok
}

func fleetUsed(key string, pct float64, at, resets time.Time, reached bool) *controlplanev1.RateLimits {
	return &controlplanev1.RateLimits{Account: key, LimitReached: reached, AtUnixMs: at.UnixMilli(), Windows: []*controlplanev1.QuotaWindow{
		{Name: "primary", UsedPercent: pct, WindowMinutes: 300, ResetsAtUnixMs: resets.UnixMilli()}}}
}

// A new conversation's choice uses the fleet's figures of an account
// this data plane has none of, or older ones: an account another data
// plane found at 90 % is not taken for an unused one, and one the fleet
// found at its limit takes no new conversation until its reset. Its own
// newer figures win.
func TestFleetFiguresGuideTheChoice(t *testing.T) {
	ids := []string{"a", "b"}
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	fleet := fleetView{}
	r, err := NewRouter(Config{Source: &keys{list: ids, down: map[string]bool{}}, Clock: c.now, Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	if got := picks(t, r, ids, 4); got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("picks with nothing known = %v; want 2 each", got)
	}

	// The fleet knows a at 90 %: b, never reported anywhere, has more
	// headroom.
	fleet["a"] = fleetUsed("a", 90, c.t.Add(-time.Minute), c.t.Add(time.Hour), false)
	if got := picks(t, r, ids, 4); got["b"] != 4 {
		t.Fatalf("picks with a at 90%% in the fleet = %v; want all on b", got)
	}

	// This data plane then reads b at 95 % itself: a (fleet, 90 %) wins.
	r.observe("b", used(95, c.t.Add(time.Hour)), true, c.t)
	if got := picks(t, r, ids, 2); got["a"] != 2 {
		t.Fatalf("picks with b at 95%% here = %v; want all on a", got)
	}

	// Its own reading of a, newer than the fleet's, wins over it.
	r.observe("a", used(99, c.t.Add(time.Hour)), true, c.t)
	if got := picks(t, r, ids, 2); got["b"] != 2 {
		t.Fatalf("picks with a at 99%% here (newer) = %v; want all on b", got)
	}
	// A newer fleet report of a (another data plane, later) wins again.
	c.t = c.t.Add(time.Minute)
	fleet["a"] = fleetUsed("a", 20, c.t, c.t.Add(time.Hour), false)
	if got := picks(t, r, ids, 2); got["a"] != 2 {
		t.Fatalf("picks with a newer fleet report of a at 20%% = %v; want all on a", got)
	}

	// The fleet found both at their limit: none takes a new conversation
	// until the first reset, which the answer names.
	fleet["a"] = fleetUsed("a", 100, c.t, c.t.Add(30*time.Minute), true)
	fleet["b"] = fleetUsed("b", 100, c.t, c.t.Add(10*time.Minute), true)
	_, err = r.Route(t.Context(), noHeads{}, part(), nil)
	var all *AllLimitedError
	if !errors.As(err, &all) || all.Account != "b" || all.ResetsIn != 10*time.Minute {
		t.Fatalf("Route with both at their limit in the fleet = %v; want *AllLimitedError naming b in 10m", err)
	}
}
