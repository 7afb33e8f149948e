package retry

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Failure retries inside the data plane (HealthConfig.FailureRetries).
const (
	// DefaultFailureRetries is one retry: it absorbs a single dropped
	// socket or 5xx without the client seeing it, and leaves a persistent
	// failure to the client's own retries.
	DefaultFailureRetries = 1
	// NoFailureRetries leaves every retry of such a failure to the client.
	NoFailureRetries = -1
)

// Probe pacing of a failing upstream: the next attempt is due a quarter of
// the time it has been failing after its latest failure, within these
// bounds.
const (
	MinProbeInterval = time.Second
	MaxProbeInterval = 15 * time.Second
)

// HealthConfig configures a Health. The zero value is usable.
type HealthConfig struct {
	// FailureRetries is how many times one request retries, inside the
	// data plane, a failure its client can retry itself (a 5xx, a
	// transport failure on a new socket, an unreachable backend, a 429)
	// while its upstream is healthy. While the upstream is failing a
	// request makes one attempt and its failure goes to the client at
	// once. (Optional) Default DefaultFailureRetries; NoFailureRetries for
	// none; at most pacing.MaxMaxRetries (the budget's MaxRetries caps it
	// too).
	FailureRetries int
	// Clock is the time source (Optional; default SystemClock).
	Clock Clock
	// Logger gets a warning when an upstream starts failing and a line
	// when it recovers (Optional; default discards).
	Logger *slog.Logger
}

// Health is the data plane's memory of its upstreams, shared by every
// request: whether each one (keyed by the caller, typically the backend's
// host) is failing, since when, why, and when the next attempt is due.
//
// An upstream is failing from the first failure a client could retry
// (Backoff or Throttled, recorded by Do or Dial) until an attempt on it
// succeeds. While it is failing, requests spend no retries of their own on
// it (Do with Config.Health), and when it is unreachable (no socket could
// be opened: refused, DNS, TLS, timeout, an upgrade 5xx) Dial refuses new
// sockets at once with a *DownError until the next probe is due; then one
// request dials as the probe while the others keep being answered at once.
// The probe is due a quarter of the failing time after the latest failure,
// between MinProbeInterval and MaxProbeInterval, so a client that retries
// on a doubling schedule finds the probe due at each retry, and RetryAfter
// tells it when that is.
//
// Health is safe for concurrent use.
type Health struct {
	clock   Clock
	retries int
	logger  *slog.Logger

	mu  sync.Mutex // guards ups
	ups map[string]*upstreamState
}

type upstreamState struct {
	since       time.Time // first failure of the current run; zero when healthy
	last        time.Time // latest failure
	failures    int
	cause       error
	unreachable bool // the latest dial failed before a socket opened
	probing     bool // a dial is in flight while unreachable
	nextProbe   time.Time
}

// NewHealth returns a Health; a FailureRetries out of range is an error
// matching ErrInvalidConfig.
func NewHealth(cfg HealthConfig) (*Health, error) {
	h := &Health{clock: cfg.Clock, retries: cfg.FailureRetries, logger: cfg.Logger, ups: map[string]*upstreamState{}}
	switch {
	case cfg.FailureRetries == 0:
		h.retries = DefaultFailureRetries
	case cfg.FailureRetries == NoFailureRetries:
		h.retries = 0
	case cfg.FailureRetries < 0 || cfg.FailureRetries > pacing.MaxMaxRetries:
		return nil, fmt.Errorf("%w: failure retries %d is out of range; allowed: 1..%d, or %d for none",
			ErrInvalidConfig, cfg.FailureRetries, pacing.MaxMaxRetries, NoFailureRetries)
	}
	if h.clock == nil {
		h.clock = SystemClock{}
	}
	if h.logger == nil {
		h.logger = slog.New(slog.DiscardHandler)
	}
	return h, nil
}

// FailureRetries is the resolved retry allowance of a healthy upstream.
func (h *Health) FailureRetries() int { return h.retries }

// UpstreamStatus is a snapshot of one upstream.
type UpstreamStatus struct {
	Failing     bool
	Since       time.Time // first failure of the current run
	Failures    int       // failures recorded since then
	Unreachable bool      // no socket could be opened at the latest dial
	NextProbe   time.Time // when the next attempt is due (failing only)
	Cause       error     // the latest failure
}

// Status returns the state of upstream key.
func (h *Health) Status(key string) UpstreamStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	if st == nil || st.since.IsZero() {
		return UpstreamStatus{}
	}
	return UpstreamStatus{Failing: true, Since: st.since, Failures: st.failures, Unreachable: st.unreachable,
		NextProbe: st.nextProbe, Cause: st.cause}
}

// RetryAfter is how long a client should wait before retrying a failure
// on upstream key that carries no hint of its own: until the next probe
// is due while the upstream is failing (at least MinProbeInterval), else
// MinProbeInterval.
func (h *Health) RetryAfter(key string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	if st == nil || st.since.IsZero() {
		return MinProbeInterval
	}
	return max(st.nextProbe.Sub(h.clock.Now()), MinProbeInterval)
}

// AccountKey is the key under which Health remembers an account's own
// throttling on upstream (Config.Account); upstream itself when account is
// "".
func AccountKey(upstream, account string) string {
	if account == "" {
		return upstream
	}
	return upstream + " account " + account
}

// RetryAfterAccount is RetryAfter for a request on account at upstream:
// the later of the upstream's and the account's next attempt.
func (h *Health) RetryAfterAccount(upstream, account string) time.Duration {
	return max(h.RetryAfter(upstream), h.RetryAfter(AccountKey(upstream, account)))
}

// allowance is how many failure retries a request starting now may spend
// on upstream key.
func (h *Health) allowance(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if st := h.ups[key]; st != nil && !st.since.IsZero() {
		return 0
	}
	return h.retries
}

// failedLocked records a failure; the caller holds mu.
func (h *Health) failedLocked(key string, cause error, unreachable bool) {
	now := h.clock.Now()
	st := h.ups[key]
	if st == nil {
		st = &upstreamState{}
		h.ups[key] = st
	}
	if st.since.IsZero() {
		st.since = now
		h.logger.Warn("upstream failing", "upstream", key, "unreachable", unreachable, "err", cause)
	}
	st.last, st.cause = now, cause
	st.failures++
	st.unreachable = unreachable
	st.nextProbe = now.Add(min(max(now.Sub(st.since)/4, MinProbeInterval), MaxProbeInterval))
}

// failed records a failure a client could retry (a response that failed,
// a socket that broke) on upstream key.
func (h *Health) failed(key string, cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	h.failedLocked(key, cause, st != nil && st.unreachable)
}

// succeeded records a successful attempt: the upstream is healthy again.
func (h *Health) succeeded(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	if st == nil || st.since.IsZero() {
		return
	}
	h.logger.Info("upstream recovered", "upstream", key, "failing_for", h.clock.Now().Sub(st.since).Round(time.Millisecond),
		"failures", st.failures)
	delete(h.ups, key)
}

// DownError refuses a new socket to an upstream known to be unreachable,
// before any dial: the latest attempt could not open a socket and the next
// probe is not due, or another request is probing it now.
type DownError struct {
	Upstream   string
	Since      time.Time     // first failure of the current run
	RetryAfter time.Duration // until the next probe is due (at least MinProbeInterval)
	Cause      error         // the latest failure
}

func (e *DownError) Error() string {
	return fmt.Sprintf("upstream %s unreachable since %s, next attempt in %v: %v", e.Upstream,
		e.Since.Format(time.RFC3339), e.RetryAfter.Round(time.Second), e.Cause)
}

func (e *DownError) Unwrap() error { return e.Cause }

// ErrProbing is the cause of a DownError while another request's dial is
// probing the upstream and no failure is known yet.
var ErrProbing = errors.New("another request is probing the upstream")

// Dial asks whether a new socket to upstream key may be opened now. While
// the upstream is unreachable it returns a *DownError unless the next probe
// is due and no other request is probing; the caller then dials as the
// probe. Every DialTicket it returns must be settled: Reached, Unreachable
// or Done.
func (h *Health) Dial(key string) (*DialTicket, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	if st != nil && st.unreachable {
		if err := h.downLocked(key, st); err != nil {
			return nil, err
		}
		st.probing = true
		return &DialTicket{h: h, key: key, probe: true}, nil
	}
	return &DialTicket{h: h, key: key}, nil
}

// Down returns the *DownError Dial would return for upstream key now, or
// nil, without taking the probe: a caller about to spend something scarce
// before the dial (an admission token) asks Down first, so a request that
// Dial would refuse costs nothing.
func (h *Health) Down(key string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.ups[key]
	if st == nil || !st.unreachable {
		return nil
	}
	return h.downLocked(key, st)
}

// downLocked is Down for an unreachable upstream; the caller holds mu.
func (h *Health) downLocked(key string, st *upstreamState) error {
	now := h.clock.Now()
	if !st.probing && !now.Before(st.nextProbe) {
		return nil // the probe is due: the dial may go
	}
	cause := st.cause
	if cause == nil {
		cause = ErrProbing
	}
	return &DownError{Upstream: key, Since: st.since, RetryAfter: max(st.nextProbe.Sub(now), MinProbeInterval), Cause: cause}
}

// DialTicket is one permitted dial; settle it exactly once (later calls do
// nothing).
type DialTicket struct {
	h       *Health
	key     string
	probe   bool
	settled bool
}

// Reached records that the upstream answered the dial: a socket opened,
// or the upgrade was answered with a status that shows the backend up
// (401, 403, 429). It ends the unreachable state, not a failing one.
func (d *DialTicket) Reached() {
	d.settle(func(st *upstreamState) {
		if st != nil {
			st.unreachable = false
		}
	})
}

// Unreachable records that no socket could be opened: refused, DNS, TLS,
// a timeout, an upgrade answered 5xx.
func (d *DialTicket) Unreachable(cause error) {
	d.settle(func(*upstreamState) { d.h.failedLocked(d.key, cause, true) })
}

// Done settles a dial that ended without telling anything about the
// upstream (cancelled); a no-op after Reached or Unreachable.
func (d *DialTicket) Done() { d.settle(func(*upstreamState) {}) }

func (d *DialTicket) settle(f func(*upstreamState)) {
	if d == nil {
		return
	}
	h := d.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if d.settled {
		return
	}
	d.settled = true
	st := h.ups[d.key]
	if d.probe && st != nil {
		st.probing = false
	}
	f(st)
}
