package console

import (
	"testing"
	"time"
)

func TestPerMinuteOverTheLastMinute(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sr := &series{recent: []sample{
		{at: t0, refusals: 0, forbidden: 0},
		{at: t0.Add(30 * time.Second), refusals: 10, forbidden: 1},
		{at: t0.Add(90 * time.Second), refusals: 40, forbidden: 4},
		{at: t0.Add(120 * time.Second), refusals: 46, forbidden: 4},
	}}
	// The newest sample and the newest one at least a minute older (30 s):
	// 36 refusals and 3 403s in 90 s.
	rf, fb := sr.perMinute()
	if rf != 24 || fb != 2 {
		t.Errorf("perMinute() = %v, %v; want 24, 2", rf, fb)
	}
	// A replica restart resets its counters: no negative rate.
	sr.recent = append(sr.recent, sample{at: t0.Add(150 * time.Second), refusals: 1})
	if rf, fb := sr.perMinute(); rf != 0 || fb != 0 {
		t.Errorf("after a counter reset perMinute() = %v, %v; want 0, 0", rf, fb)
	}
}

func TestForecast(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	reset := t0.Add(5 * time.Hour).UnixMilli()
	mk := func(min int, used float64, reset int64) sample {
		return sample{at: t0.Add(time.Duration(min) * time.Minute), used: map[string]float64{"primary": used}, resets: map[string]int64{"primary": reset}}
	}
	// 50 % → 60 % in 10 minutes: 1 %/min, 40 % left: full in 40 minutes,
	// before the reset in 5 h.
	sr := &series{recent: []sample{mk(0, 50, reset), mk(5, 55, reset), mk(10, 60, reset)}}
	if got, want := forecast(sr, "primary", 60, 5*time.Hour), "full in 40m at 1.00 %/min"; got != want {
		t.Errorf("forecast = %q, want %q", got, want)
	}
	// The same burn with the reset in 30 minutes: it holds.
	if got, want := forecast(sr, "primary", 60, 30*time.Minute), "holds until the reset at 1.00 %/min"; got != want {
		t.Errorf("forecast = %q, want %q", got, want)
	}
	// A window that reset in between: only the samples of the new reset
	// count (one is not enough to tell).
	sr = &series{recent: []sample{mk(0, 90, reset-1), mk(10, 2, reset)}}
	if got := forecast(sr, "primary", 2, 5*time.Hour); got != "" {
		t.Errorf("forecast across a reset = %q, want none", got)
	}
	// Use that does not rise.
	sr = &series{recent: []sample{mk(0, 20, reset), mk(10, 20, reset)}}
	if got, want := forecast(sr, "primary", 20, 5*time.Hour), "not rising"; got != want {
		t.Errorf("forecast = %q, want %q", got, want)
	}
}
