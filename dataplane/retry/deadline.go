package retry

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Clock is the time source of Do and Deadline. SystemClock is the real one; tests inject a
// fake that advances on Sleep.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f once d has elapsed, unless stopped first. It must not call f before
	// it returns, nor while its caller waits for it.
	AfterFunc(d time.Duration, f func()) Timer
	// Sleep waits d, or returns context.Cause(ctx) as soon as ctx is done.
	Sleep(ctx context.Context, d time.Duration) error
}

// Timer is the handle AfterFunc returns; *time.Timer satisfies it.
type Timer interface {
	Stop() bool
}

// SystemClock is the Clock of the time package.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// AfterFunc is time.AfterFunc.
func (SystemClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Sleep waits d or until ctx is done.
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Sentinels matched by a *TimeoutError through errors.Is.
var (
	ErrIdleTimeout  = errors.New("retry: idle deadline expired")
	ErrTotalTimeout = errors.New("retry: total deadline expired")
)

// TimeoutError reports that a request's no-data (Idle) or total deadline expired. Its text is
// the message the client sees (docs/errors.md §5): "no data received from provider for 120s" or
// "provider stream exceeded 600s".
type TimeoutError struct {
	Idle  bool          // true: the no-data deadline; false: the total deadline
	Limit time.Duration // the configured timeout
}

func (e *TimeoutError) Error() string {
	secs := strconv.FormatFloat(e.Limit.Seconds(), 'f', -1, 64)
	if e.Idle {
		return "no data received from provider for " + secs + "s"
	}
	return "provider stream exceeded " + secs + "s"
}

// Is matches ErrIdleTimeout or ErrTotalTimeout.
func (e *TimeoutError) Is(target error) bool {
	return e.Idle && target == ErrIdleTimeout || !e.Idle && target == ErrTotalTimeout
}

// Upstream returns the failure as the client sees it: 502 api_error before output, or the
// api_error SSE event after it.
func (e *TimeoutError) Upstream() *UpstreamError {
	return &UpstreamError{Status: http.StatusBadGateway, Type: "api_error", Message: e.Error()}
}

// Deadline is a no-data deadline shared by every attempt of one request. It expires timeout
// after it was created or last Reset. Reset is cheap (no timer is re-armed per call): the one
// timer re-arms itself lazily when it fires before the current expiry. Deadline is safe for
// concurrent use.
type Deadline struct {
	clock   Clock
	timeout time.Duration
	err     *TimeoutError
	done    chan struct{}

	mu      sync.Mutex // guards the following fields
	expiry  time.Time
	timer   Timer
	expired bool
	stopped bool
	hooks   map[uint64]func()
	nextID  uint64
}

// NewDeadline starts a no-data deadline of timeout on clock (nil: SystemClock). A timeout of
// zero or less expires at once.
func NewDeadline(timeout time.Duration, clock Clock) *Deadline {
	return newDeadline(timeout, clock, true)
}

func newDeadline(timeout time.Duration, clock Clock, idle bool) *Deadline {
	if clock == nil {
		clock = SystemClock{}
	}
	d := &Deadline{
		clock:   clock,
		timeout: timeout,
		err:     &TimeoutError{Idle: idle, Limit: timeout},
		done:    make(chan struct{}),
	}
	d.expiry = clock.Now().Add(timeout)
	if timeout <= 0 {
		d.expired = true
		close(d.done)
		return d
	}
	d.mu.Lock() // fire may run before AfterFunc has returned
	d.timer = clock.AfterFunc(timeout, d.fire)
	d.mu.Unlock()
	return d
}

// fire runs on the timer: it expires the deadline, or re-arms the timer when Reset has pushed
// the expiry later.
func (d *Deadline) fire() {
	d.mu.Lock()
	if d.expired || d.stopped {
		d.mu.Unlock()
		return
	}
	if rem := d.expiry.Sub(d.clock.Now()); rem > 0 {
		d.timer = d.clock.AfterFunc(rem, d.fire)
		d.mu.Unlock()
		return
	}
	d.expired = true
	hooks := d.hooks
	d.hooks = nil
	close(d.done)
	d.mu.Unlock()
	for _, h := range hooks {
		h()
	}
}

// Reset pushes the expiry to timeout from now. Call it on every upstream stream event, and on
// nothing else. It returns false, changing nothing, once the deadline has expired or stopped.
func (d *Deadline) Reset() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.expired || d.stopped {
		return false
	}
	d.expiry = d.clock.Now().Add(d.timeout)
	return true
}

// Expiry returns when the deadline expires unless Reset first.
func (d *Deadline) Expiry() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expiry
}

// Done is closed when the deadline expires (never if it is stopped first).
func (d *Deadline) Done() <-chan struct{} { return d.done }

// Err returns the *TimeoutError once the deadline has expired, else nil.
func (d *Deadline) Err() error {
	select {
	case <-d.done:
		return d.err
	default:
		return nil
	}
}

// Stop releases the timer; the deadline then never expires. It is safe to call more than once.
func (d *Deadline) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped || d.expired {
		return
	}
	d.stopped = true
	d.hooks = nil
	d.timer.Stop()
}

// Context returns a child of parent that is cancelled, with the *TimeoutError as its cause,
// when the deadline expires. The CancelFunc releases it and must be called.
func (d *Deadline) Context(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	d.mu.Lock()
	if d.expired {
		d.mu.Unlock()
		cancel(d.err)
		return ctx, func() { cancel(context.Canceled) }
	}
	if d.stopped {
		d.mu.Unlock()
		return ctx, func() { cancel(context.Canceled) }
	}
	id := d.nextID
	d.nextID++
	if d.hooks == nil {
		d.hooks = make(map[uint64]func(), 1)
	}
	d.hooks[id] = func() { cancel(d.err) }
	d.mu.Unlock()
	return ctx, func() {
		d.mu.Lock()
		delete(d.hooks, id)
		d.mu.Unlock()
		cancel(context.Canceled)
	}
}
