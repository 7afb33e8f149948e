package control

import (
	"testing"
	"time"
)

// TestLiveCountHoldsPeaksForTheWindow checks the window by hand: each
// step records a push (n > 0) and then reads the count, at t0 + at.
func TestLiveCountHoldsPeaksForTheWindow(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	type step struct {
		at   time.Duration
		push int // 0: no push, only a read
		want int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"rising counts are taken at once", []step{
			{0, 1, 1}, {time.Second, 2, 2}, {2 * time.Second, 3, 3},
		}},
		{"a drop counts after 15s", []step{
			{0, 3, 3},
			{10 * time.Second, 1, 3},                 // 3 replaced at 10s: holds until 25s
			{25*time.Second - time.Nanosecond, 0, 3}, // still inside the window
			{25 * time.Second, 0, 1},                 // the window has passed
			{time.Hour, 0, 1},                        // and stays passed
		}},
		{"a restarted control plane climbing back", []step{
			{0, 3, 3},
			{20 * time.Second, 1, 3}, // the first push after a 20s outage
			{21 * time.Second, 2, 3},
			{22 * time.Second, 3, 3},
			{40 * time.Second, 0, 3},
		}},
		{"each drop keeps its own window", []step{
			{0, 5, 5},
			{time.Second, 4, 5},     // 5 until 16s
			{2 * time.Second, 2, 5}, // 4 until 17s
			{16 * time.Second, 0, 4},
			{17 * time.Second, 0, 2},
		}},
		{"a higher push ends lower peaks early", []step{
			{0, 3, 3},
			{time.Second, 1, 3}, // 3 until 16s
			{2 * time.Second, 4, 4},
			{3 * time.Second, 2, 4}, // 4 until 18s
			{17 * time.Second, 0, 4},
			{18 * time.Second, 0, 2},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l liveCount
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				if s.push > 0 {
					l.set(s.push, now)
				}
				if got := l.max(now); got != s.want {
					t.Errorf("step %d at +%v (push %d): count %d, want %d", i+1, s.at, s.push, got, s.want)
				}
			}
		})
	}
}

// TestNextBackoff checks the reconnect schedule by hand: at once after a
// stream that was up, then 250ms doubling to 2s while connects fail.
func TestNextBackoff(t *testing.T) {
	const up = 10 * time.Second
	tests := []struct {
		name        string
		last        time.Duration
		established bool
		lasted      time.Duration
		want        time.Duration
	}{
		{"a stream that was up reconnects at once", 2 * time.Second, true, up, 0},
		{"up for exactly 2s counts as up", 0, true, 2 * time.Second, 0},
		{"a stream closed at once starts over at 250ms", 0, true, time.Second, 250 * time.Millisecond},
		{"a short stream resets a long delay", 2 * time.Second, true, time.Millisecond, 250 * time.Millisecond},
		{"the first failed connect waits 250ms", 0, false, 0, 250 * time.Millisecond},
		{"then 500ms", 250 * time.Millisecond, false, 0, 500 * time.Millisecond},
		{"then 1s", 500 * time.Millisecond, false, 0, time.Second},
		{"then 2s", time.Second, false, 0, 2 * time.Second},
		{"and stays at 2s", 2 * time.Second, false, 0, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nextBackoff(tt.last, tt.established, tt.lasted); got != tt.want {
				t.Errorf("nextBackoff(%v, %v, %v) = %v, want %v", tt.last, tt.established, tt.lasted, got, tt.want)
			}
		})
	}
}
