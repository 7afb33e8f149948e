package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Class says what a failed attempt means for the next one.
type Class int

const (
	// Fatal: no retry. 400, 401 after refresh, a usage limit resetting in more than 60 s,
	// context overflow, client cancellation, and any failure after output.
	Fatal Class = iota + 1
	// Replace: previous_response_not_found, websocket_connection_limit_reached, or a transport
	// failure on a reused socket. The next attempt runs at once on a new socket with the full
	// context and spends no retry; the new socket asks for admission unless the attempt was
	// itself admitted for the socket it replaces (docs/pool.md §6). Each budgeted attempt gets one replacement:
	// a Replace failure of the replacement itself is treated as Backoff (docs/errors.md §5).
	Replace
	// Backoff: a transport failure on a new socket, an upgrade 5xx, or a 502/529 output-less
	// terminal. The next attempt waits the ladder rung.
	Backoff
	// Throttled: an upstream 403 upgrade or 429. The next attempt waits
	// max(rung, min(hint, 60 s)) × (1 + U[0, 0.25)).
	Throttled
	// Refused: the pacer refused admission. The next attempt waits exactly the hint: no rung,
	// no jitter (the pacer's wait bound assumes this substitution).
	Refused
)

func (c Class) String() string {
	switch c {
	case Fatal:
		return "fatal"
	case Replace:
		return "replace"
	case Backoff:
		return "backoff"
	case Throttled:
		return "throttled"
	case Refused:
		return "refused"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Failure is a classified failed attempt.
type Failure struct {
	Class Class
	Hint  time.Duration // retry hint: Throttled and Refused use it; 0 = none
	// Err is the classified error surfaced if the retries run out: from
	// Classify, an *UpstreamError (what the client is told) wrapping the
	// cause.
	Err error
	// Kind is what failed; Status the HTTP status the upstream (or the
	// pacer, 429) answered, 0 when none: the caller's metrics and spans.
	Kind   Kind
	Status int
	// KeepSocket says the socket that carried the attempt is healthy: its
	// response failed with a frame that ended it (Facts.ResponseEnded), so
	// the caller keeps the socket, without its head, for the next attempt
	// and turn to resend the whole conversation on (Classify sets it).
	KeepSocket bool
}

// Kind says what failed in an attempt.
type Kind int

// Kinds of Failure.
const (
	KindOther       Kind = iota // a failure the caller built itself (Final)
	KindResponse                // the upstream response failed (an error or response.failed event)
	KindPacer                   // the pacer refused a new socket
	KindDown                    // no dial: the upstream is known unreachable
	KindCredential              // the credential could not be had
	KindUpgrade                 // the upgrade was answered with an HTTP status
	KindUnreachable             // the dial opened no socket
	KindTransport               // the socket failed (a send, a read, a dial without a status)
)

func (f *Failure) Error() string {
	if f.Err == nil {
		return "retry: " + f.Class.String() + " failure"
	}
	return f.Err.Error()
}

func (f *Failure) Unwrap() error { return f.Err }

// final is the error Do surfaces for f.
func (f *Failure) final() error {
	if f.Err == nil {
		return f
	}
	return f.Err
}

// Attempt describes one attempt to the attempt function.
type Attempt struct {
	// N is the 0-based budgeted attempt: retry N (N ≥ 1) has been spent to run it. A
	// replacement keeps the N of the attempt it replaces.
	N int
	// Replacement is true for the one immediate replacement of attempt N after a Replace
	// failure: use a new socket with the full context, and do not ask the pacer.
	Replacement bool
	// Previous is the failure that led to this attempt; nil for the first one.
	Previous *Failure
	// Waited is how long Do waited before this attempt.
	Waited time.Duration
	// Idle is the request's shared no-data deadline. Call Idle.Reset() on every upstream
	// stream event; nothing else resets it.
	Idle *Deadline
}

// Config configures Do. The zero value is usable.
type Config struct {
	// Budget (Optional) is the request budget; the zero value means pacing.DefaultBudget()
	// (idle 120 s, total 600 s, 5 retries). Otherwise IdleTimeout and TotalTimeout must be
	// positive and MaxRetries in 0..pacing.MaxMaxRetries.
	Budget pacing.Budget
	// Clock (Optional) is the time source; default SystemClock.
	Clock Clock
	// Rand (Optional) returns a uniform value in [0, 1) for jitter; default math/rand/v2.
	// Values outside [0, 1) are clamped.
	Rand func() float64
	// Logger (Optional) gets one debug line per retry; default discards.
	Logger *slog.Logger
	// Health (Optional) is the shared memory of upstream failures, and
	// Upstream this request's key in it. With a Health, a failure the client
	// can retry itself (Backoff, Throttled) is retried inside Do at most
	// Health's FailureRetries times while the upstream is healthy, and not
	// at all while it is failing: Do returns it for the client to retry
	// after Health.RetryAfter. Every such failure is recorded, and a success
	// makes the upstream healthy. Refusals and replacements are not
	// affected. Without a Health every retry of the budget may be spent.
	Health   *Health
	Upstream string
	// Account (Optional) is the key of the account the request runs on. A
	// Throttled failure is the account's limit, not the upstream's state:
	// with an Account it is recorded under the account (AccountKey), so one
	// account's rate limit never costs other accounts their retries.
	// Without one it is recorded under Upstream.
	Account string
}

// ErrInvalidConfig is matched by the error Do returns for a bad Config.
var ErrInvalidConfig = errors.New("retry: invalid config")

type resolved struct {
	budget pacing.Budget
	clock  Clock
	rand   func() float64
	logger *slog.Logger
}

func (c *Config) resolve() (resolved, error) {
	r := resolved{budget: c.Budget, clock: c.Clock, rand: c.Rand, logger: c.Logger}
	if r.budget == (pacing.Budget{}) {
		r.budget = pacing.DefaultBudget()
	}
	var errs []error
	if r.budget.IdleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("budget idle timeout %v is out of range; allowed: more than 0", r.budget.IdleTimeout))
	}
	if r.budget.TotalTimeout <= 0 {
		errs = append(errs, fmt.Errorf("budget total timeout %v is out of range; allowed: more than 0", r.budget.TotalTimeout))
	}
	if r.budget.MaxRetries < 0 || r.budget.MaxRetries > pacing.MaxMaxRetries {
		errs = append(errs, fmt.Errorf("budget max retries %d is out of range; allowed: 0..%d", r.budget.MaxRetries, pacing.MaxMaxRetries))
	}
	if len(errs) > 0 {
		return r, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	if r.clock == nil {
		r.clock = SystemClock{}
	}
	if r.rand == nil {
		r.rand = rand.Float64
	}
	if r.logger == nil {
		r.logger = slog.New(slog.DiscardHandler)
	}
	return r, nil
}

// unit clamps a random draw into [0, 1); NaN gives 0.
func unit(v float64) float64 {
	if !(v > 0) { // also NaN
		return 0
	}
	return min(v, math.Nextafter(1, 0))
}

// Wait returns how long to wait before retry number retry (1-based) after a failure of class
// c with hint, given a uniform draw r in [0, 1) for jitter. Fatal and unknown classes give 0,
// and so does Replace (the replacement runs at once).
func Wait(c Class, retry int, hint time.Duration, r float64) time.Duration {
	switch c {
	case Backoff:
		return pacing.Rung(retry)
	case Throttled:
		base := max(pacing.Rung(retry), min(max(hint, 0), MaxRetryAfter))
		return time.Duration(float64(base) * (1 + 0.25*unit(r)))
	case Refused:
		return min(max(hint, time.Second), MaxRetryAfter)
	}
	return 0
}

// Do runs attempt until it returns nil, fails fatally, the budget's retries run out, or the
// next wait would reach the idle or total deadline; see the package doc for the schedule.
//
// attempt returns nil on success, a *Failure (or an error wrapping one) for a classified
// failure, and any other error for a fatal one. Its context is cancelled when the attempt
// returns, when ctx is, and when a deadline expires (with a *TimeoutError cause).
//
// Do returns nil on success; the failure's Err when it is fatal; the last failure's Err,
// wrapped with why, when the retries run out or a wait would pass a deadline; the
// *TimeoutError when a deadline expired during an attempt; context.Cause(ctx), wrapped, when
// ctx is cancelled; and an error matching ErrInvalidConfig for a bad Config.
func Do(ctx context.Context, cfg Config, attempt func(ctx context.Context, a Attempt) error) error {
	c, err := cfg.resolve()
	if err != nil {
		return err
	}
	if attempt == nil {
		return fmt.Errorf("%w: nil attempt function", ErrInvalidConfig)
	}
	idle := NewDeadline(c.budget.IdleTimeout, c.clock)
	defer idle.Stop()
	total := newDeadline(c.budget.TotalTimeout, c.clock, false)
	defer total.Stop()
	idleCtx, cancelIdle := idle.Context(ctx)
	defer cancelIdle()
	reqCtx, cancelTotal := total.Context(idleCtx)
	defer cancelTotal()

	failureRetries := c.budget.MaxRetries // retries a Backoff or Throttled failure may still spend
	throttleKey := AccountKey(cfg.Upstream, cfg.Account)
	if cfg.Health != nil {
		failureRetries = min(failureRetries, cfg.Health.allowance(cfg.Upstream), cfg.Health.allowance(throttleKey))
	}
	a := Attempt{Idle: idle}
	for {
		actx, cancel := context.WithCancel(reqCtx)
		err := attempt(actx, a)
		cancel()
		if err == nil {
			if cfg.Health != nil {
				cfg.Health.succeeded(cfg.Upstream)
				cfg.Health.succeeded(throttleKey)
			}
			return nil
		}
		if cause := context.Cause(reqCtx); cause != nil {
			var te *TimeoutError
			if errors.As(cause, &te) {
				return te
			}
			return fmt.Errorf("retry: attempt %d: %w", a.N, cause)
		}
		var f *Failure
		if !errors.As(err, &f) {
			return err
		}
		class := f.Class
		switch class {
		case Fatal:
			return f.final()
		case Replace:
			if !a.Replacement {
				c.logger.DebugContext(ctx, "retry: replacing attempt", "attempt", a.N, "class", class.String())
				a = Attempt{N: a.N, Replacement: true, Previous: f, Idle: idle}
				continue
			}
			class = Backoff
		case Backoff, Throttled, Refused:
		default:
			return fmt.Errorf("retry: attempt %d returned a failure of unknown class %d (allowed: %d..%d): %w",
				a.N, int(f.Class), int(Fatal), int(Refused), f.final())
		}
		clientRetries := class == Backoff || class == Throttled
		if cfg.Health != nil {
			switch class {
			case Backoff:
				cfg.Health.failed(cfg.Upstream, f.final())
			case Throttled:
				cfg.Health.failed(throttleKey, f.final())
			}
		}
		if a.N >= c.budget.MaxRetries {
			return fmt.Errorf("retry: gave up after %d retries: %w", a.N, f.final())
		}
		if clientRetries {
			if failureRetries <= 0 {
				return fmt.Errorf("retry: left to the client after %d retries: %w", a.N, f.final())
			}
			failureRetries--
		}
		wait := Wait(class, a.N+1, f.Hint, c.rand())
		at := c.clock.Now().Add(wait)
		if !at.Before(idle.Expiry()) {
			return fmt.Errorf("retry: a %v wait would pass the idle deadline: %w", wait, f.final())
		}
		if !at.Before(total.Expiry()) {
			return fmt.Errorf("retry: a %v wait would pass the total deadline: %w", wait, f.final())
		}
		c.logger.DebugContext(ctx, "retry: waiting", "attempt", a.N+1, "class", class.String(), "wait", wait)
		if err := c.clock.Sleep(reqCtx, wait); err != nil {
			if cause := context.Cause(reqCtx); cause != nil {
				var te *TimeoutError
				if errors.As(cause, &te) {
					return fmt.Errorf("retry: %v while waiting: %w", te, f.final())
				}
				return fmt.Errorf("retry: wait before attempt %d: %w", a.N+1, cause)
			}
			return fmt.Errorf("retry: wait before attempt %d: %w", a.N+1, err)
		}
		a = Attempt{N: a.N + 1, Previous: f, Waited: wait, Idle: idle}
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

// Budgets is the turn budget of every account: the latest the control
// plane pushed for it (clodexctl set-budget), else the default. The
// control-plane client writes it, every turn reads it. It is safe for
// concurrent use.
type Budgets struct {
	def pacing.Budget // immutable

	mu    sync.Mutex // guards byKey
	byKey map[string]pacing.Budget
}

// NewBudgets returns Budgets whose accounts all have def (the zero Budget
// means pacing.DefaultBudget()) until Set says otherwise.
func NewBudgets(def pacing.Budget) *Budgets {
	if def == (pacing.Budget{}) {
		def = pacing.DefaultBudget()
	}
	return &Budgets{def: def, byKey: make(map[string]pacing.Budget)}
}

// Set makes b the budget of the account with key. A budget Do cannot run
// with (a deadline not positive, MaxRetries outside 0..pacing.MaxMaxRetries)
// is refused with an error naming the field; the account keeps its budget.
func (bs *Budgets) Set(key string, b pacing.Budget) error {
	if b.IdleTimeout <= 0 || b.TotalTimeout <= 0 || b.MaxRetries < 0 || b.MaxRetries > pacing.MaxMaxRetries {
		return fmt.Errorf("budget of %s: idle timeout %v, total timeout %v, max retries %d; want both timeouts positive and max retries in 0..%d",
			key, b.IdleTimeout, b.TotalTimeout, b.MaxRetries, pacing.MaxMaxRetries)
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	bs.byKey[key] = b
	return nil
}

// For returns the budget of a turn on the account with key.
func (bs *Budgets) For(key string) pacing.Budget {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if b, ok := bs.byKey[key]; ok {
		return b
	}
	return bs.def
}
