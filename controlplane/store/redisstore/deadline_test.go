package redisstore

import (
	"testing"
	"time"
)

func TestDeadlineFollowsLatency(t *testing.T) {
	d := newDeadline(100*time.Millisecond, time.Second)
	t0 := time.Unix(1_000_000, 0)
	steps := []struct {
		at   time.Duration
		took time.Duration
		want time.Duration
	}{
		{0, time.Millisecond, 100 * time.Millisecond},                           // fast calls: the floor
		{100 * time.Millisecond, 60 * time.Millisecond, 240 * time.Millisecond}, // 4 x the slowest
		{2 * time.Second, time.Millisecond, 240 * time.Millisecond},             // still within the window
		{3 * time.Second, 400 * time.Millisecond, time.Second},                  // capped
		{10 * time.Second, time.Millisecond, time.Second},                       // the 60 ms call left the window, not the 400 ms one
		{13 * time.Second, 2 * time.Millisecond, 100 * time.Millisecond},        // and then it did
	}
	for _, s := range steps {
		d.observe(t0.Add(s.at), s.took)
		if got := d.get(); got != s.want {
			t.Errorf("after a %v call at +%v: deadline %v, want %v", s.took, s.at, got, s.want)
		}
	}
}
