package gateway

import (
	"context"
	"sync"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
)

// Epoch is the fake clock's start.
var Epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// FakeClock is a manual retry.Clock, for this package's tests and
// gateway_test's: time moves only in Advance and Sleep, and due timers run
// synchronously, in order, on the goroutine that moves it.
type FakeClock struct {
	mu      sync.Mutex // guards the following fields
	now     time.Time
	timers  []*fakeTimer
	sleeps  []time.Duration
	onSleep func(d time.Duration) // called at the start of Sleep, before time moves
}

type fakeTimer struct {
	c       *FakeClock
	at      time.Time
	f       func()
	stopped bool
	fired   bool
}

// NewFakeClock returns a FakeClock at Epoch.
func NewFakeClock() *FakeClock { return &FakeClock{now: Epoch} }

func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// OnSleep sets a function Sleep calls first, before time moves.
func (c *FakeClock) OnSleep(f func(d time.Duration)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onSleep = f
}

func (c *FakeClock) AfterFunc(d time.Duration, f func()) retry.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.stopped || t.fired {
		return false
	}
	t.stopped = true
	return true
}

// Advance moves time forward by d, running every timer that falls due on the way.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	target := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, t := range c.timers {
			if !t.stopped && !t.fired && !t.at.After(target) && (next == nil || t.at.Before(next.at)) {
				next = t
			}
		}
		if next == nil {
			c.now = target
			c.mu.Unlock()
			return
		}
		if next.at.After(c.now) {
			c.now = next.at
		}
		next.fired = true
		c.mu.Unlock()
		next.f()
	}
}

func (c *FakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	hook := c.onSleep
	c.mu.Unlock()
	if hook != nil {
		hook(d)
	}
	if err := context.Cause(ctx); err != nil {
		return err
	}
	c.Advance(d)
	return nil
}

// Sleeps returns the waits Sleep was asked for, in order.
func (c *FakeClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.sleeps...)
}
