package accounts_test

import (
	"errors"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/translate"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newSet(t *testing.T, ids ...string) (*accounts.Set, *clock) {
	t.Helper()
	c := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	s := accounts.New(c.now)
	for _, id := range ids {
		s.Add(id)
	}
	return s, c
}

func used(pct float64, resets time.Time) translate.RateLimits {
	return translate.RateLimits{Windows: []translate.RateLimitWindow{
		{Name: "primary", UsedPercent: pct, Window: 5 * time.Hour, ResetsAt: resets},
	}}
}

func picks(t *testing.T, s *accounts.Set, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		id, err := s.Pick()
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		got[id]++
	}
	return got
}

func TestPickEmpty(t *testing.T) {
	s, _ := newSet(t)
	if _, err := s.Pick(); !errors.Is(err, accounts.ErrNone) {
		t.Fatalf("Pick on an empty set = %v; want ErrNone", err)
	}
}

func TestUnknownHeadroomSpreadsRoundRobin(t *testing.T) {
	s, _ := newSet(t, "a", "b", "c")
	got := picks(t, s, 9)
	for _, id := range []string{"a", "b", "c"} {
		if got[id] != 3 {
			t.Fatalf("picks = %v; want 3 each", got)
		}
	}
}

func TestMostHeadroomWins(t *testing.T) {
	s, c := newSet(t, "a", "b")
	s.ObserveRateLimits("a", used(40, c.t.Add(time.Hour)))
	s.ObserveRateLimits("b", used(10, c.t.Add(time.Hour)))
	if got := picks(t, s, 4); got["b"] != 4 {
		t.Fatalf("picks = %v; want all on b (90%% headroom against 60%%)", got)
	}
	// The tightest window counts: b's weekly window is nearly used up.
	rl := used(10, c.t.Add(time.Hour))
	rl.Windows = append(rl.Windows, translate.RateLimitWindow{Name: "secondary", UsedPercent: 95, ResetsAt: c.t.Add(72 * time.Hour)})
	s.ObserveRateLimits("b", rl)
	if got := picks(t, s, 2); got["a"] != 2 {
		t.Fatalf("picks = %v; want all on a (b's tightest window has 5%% left)", got)
	}
	// Once a's window resets it counts as unused again.
	c.t = c.t.Add(2 * time.Hour)
	s.ObserveRateLimits("b", used(10, c.t.Add(time.Hour)))
	if got := picks(t, s, 4); got["a"] != 4 {
		t.Fatalf("picks after a's reset = %v; want all on a (100%% against 90%%)", got)
	}
}

func TestLimitedSkippedUntilReset(t *testing.T) {
	s, c := newSet(t, "a", "b")
	reset := c.t.Add(10 * time.Minute)
	s.Limited("a", reset)
	if until, ok := s.LimitedUntil("a"); !ok || !until.Equal(reset) {
		t.Fatalf("LimitedUntil(a) = %v, %v; want %v, true", until, ok, reset)
	}
	if got := picks(t, s, 4); got["b"] != 4 {
		t.Fatalf("picks = %v; want all on b while a is limited", got)
	}
	c.t = reset
	if _, ok := s.LimitedUntil("a"); ok {
		t.Fatal("a still limited at its reset")
	}
	if got := picks(t, s, 4); got["a"] != 2 || got["b"] != 2 {
		t.Fatalf("picks after the reset = %v; want 2 each", got)
	}
}

func TestAllLimitedNamesFirstReset(t *testing.T) {
	s, c := newSet(t, "a", "b", "c")
	s.Limited("a", c.t.Add(30*time.Minute))
	s.Limited("b", c.t.Add(5*time.Minute))
	s.ObserveRateLimits("c", translate.RateLimits{LimitReached: true, Windows: []translate.RateLimitWindow{
		{Name: "primary", UsedPercent: 100, ResetsAt: c.t.Add(20 * time.Minute)},
	}})
	_, err := s.Pick()
	var all *accounts.AllLimitedError
	if !errors.As(err, &all) {
		t.Fatalf("Pick = %v; want *AllLimitedError", err)
	}
	if all.Account != "b" || !all.ResetsAt.Equal(c.t.Add(5*time.Minute)) || all.ResetsIn != 5*time.Minute {
		t.Fatalf("AllLimitedError = %s at %v; want b at %v", all.Account, all.ResetsAt, c.t.Add(5*time.Minute))
	}
	c.t = c.t.Add(5 * time.Minute)
	if id, err := s.Pick(); err != nil || id != "b" {
		t.Fatalf("Pick after b's reset = %q, %v; want b", id, err)
	}
}

func TestAddIgnoresEmptyAndDuplicates(t *testing.T) {
	s, _ := newSet(t, "a", "", "a", "b")
	if got := s.Accounts(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("Accounts = %v; want [a b]", got)
	}
}

func TestDownSkipped(t *testing.T) {
	s, c := newSet(t, "a", "b")
	s.Down("a", time.Minute)
	if got := picks(t, s, 3); got["b"] != 3 {
		t.Fatalf("picks = %v; want all on b while a's sign-in is down", got)
	}
	s.Down("b", time.Minute)
	if _, err := s.Pick(); !errors.Is(err, accounts.ErrAllDown) {
		t.Fatalf("Pick with every sign-in down = %v; want ErrAllDown", err)
	}
	s.Limited("b", c.t.Add(time.Hour))
	var all *accounts.AllLimitedError
	if _, err := s.Pick(); !errors.As(err, &all) || all.Account != "b" {
		t.Fatalf("Pick with a down and b limited = %v; want b's usage limit", err)
	}
	c.t = c.t.Add(time.Minute)
	if id, err := s.Pick(); err != nil || id != "a" {
		t.Fatalf("Pick once a is back = %q, %v; want a", id, err)
	}
}
