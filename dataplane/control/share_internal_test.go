package control

import (
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

func TestShare(t *testing.T) {
	budget := pacing.DefaultBudget()
	tests := []struct {
		rate, burst, live   int
		wantRate, wantBurst int
	}{
		{60, 10, 1, 60, 10},
		{60, 10, 2, 30, 5},
		{60, 10, 3, 20, 4},   // burst ceil(10/3) = 4
		{7, 3, 2, 3, 2},      // rate floor(7/2) = 3, burst ceil(3/2) = 2
		{1, 1, 4, 1, 1},      // both floored at 1
		{5, 1000, 7, 1, 143}, // rate max(1, 0) = 1, burst ceil(1000/7) = 143
		{600, 1000, 1000, 1, 1},
		{0, 10, 3, 0, 4},    // pacing off stays off
		{60, 10, 0, 60, 10}, // live below 1 counts as 1
		{60, 10, -5, 60, 10},
	}
	for _, tt := range tests {
		p := pacing.Policy{RatePerMinute: tt.rate, Burst: tt.burst, Budget: budget}
		got := share(p, tt.live)
		want := pacing.Policy{RatePerMinute: tt.wantRate, Burst: tt.wantBurst, Budget: budget}
		if got != want {
			t.Errorf("share(%d/min burst %d, %d live) = %d/min burst %d, want %d/min burst %d",
				tt.rate, tt.burst, tt.live, got.RatePerMinute, got.Burst, tt.wantRate, tt.wantBurst)
		}
	}
}

func TestJitter(t *testing.T) {
	tests := []struct {
		d    time.Duration
		r    float64
		want time.Duration
	}{
		{time.Second, 0.5, time.Second},
		{time.Second, 0, 800 * time.Millisecond},
		{time.Second, 0.75, 1100 * time.Millisecond},
		{time.Second, 0.25, 900 * time.Millisecond},
		{10 * time.Second, 1, 12 * time.Second},
		{time.Second, -3, 800 * time.Millisecond}, // out-of-range rand is clamped
		{time.Second, 7, 1200 * time.Millisecond},
	}
	for _, tt := range tests {
		if got := jitter(tt.d, tt.r); got != tt.want {
			t.Errorf("jitter(%v, %v) = %v, want %v", tt.d, tt.r, got, tt.want)
		}
	}
}

// TestBackoffSchedule checks the probe delays a local client waits, with
// zero jitter: 250 ms doubling to the 2 s cap.
func TestBackoffSchedule(t *testing.T) {
	var r reach
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	want := []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		2 * time.Second, 2 * time.Second}
	for i, w := range want {
		r.schedule(now, 0.5)
		if got := r.nextProbe.Sub(now); got != w {
			t.Errorf("probe %d after %v, want %v", i+1, got, w)
		}
	}
}
