package redisstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive deadline.
const (
	// deadlineFactor times the slowest recent call is the deadline.
	deadlineFactor = 4
	// deadlineWindow is how long a call's latency counts, in seconds.
	deadlineWindow = 10
)

// deadline is the Redis call deadline, following observed latency:
// deadlineFactor times the slowest call of the last deadlineWindow
// seconds (a call that failed counts as taking its whole deadline), at
// least floor (Options.Timeout) and at most ceiling (Options.MaxTimeout).
// A busy host that makes Redis's answers slow for a while lengthens the
// deadline instead of opening the breaker; a Redis that stops answering
// is still found within ceiling. It is safe for concurrent use.
type deadline struct {
	floor, ceiling time.Duration
	cur            atomic.Int64 // the deadline now, ns

	mu    sync.Mutex // guards the following field
	slots [deadlineWindow]latencySlot
}

// latencySlot is the slowest call of one second.
type latencySlot struct {
	sec     int64 // Unix second
	slowest time.Duration
}

func newDeadline(floor, ceiling time.Duration) *deadline {
	d := &deadline{floor: floor, ceiling: max(ceiling, floor)}
	d.cur.Store(int64(floor))
	return d
}

// get returns the deadline now.
func (d *deadline) get() time.Duration { return time.Duration(d.cur.Load()) }

// observe records a call that took took, ending at now.
func (d *deadline) observe(now time.Time, took time.Duration) {
	sec := now.Unix()
	d.mu.Lock()
	defer d.mu.Unlock()
	s := &d.slots[sec%deadlineWindow]
	if s.sec == sec && took <= s.slowest {
		return
	}
	if s.sec != sec {
		s.sec, s.slowest = sec, 0
	}
	s.slowest = max(s.slowest, took)
	var slowest time.Duration
	for _, x := range d.slots {
		if sec-x.sec < deadlineWindow {
			slowest = max(slowest, x.slowest)
		}
	}
	d.cur.Store(int64(min(max(deadlineFactor*slowest, d.floor), d.ceiling)))
}
