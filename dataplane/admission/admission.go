package admission

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const (
	// DefaultTimeout bounds each Admit and Cancel RPC.
	DefaultTimeout = 250 * time.Millisecond
	// MinBackoff is the first delay before a local client asks the control
	// plane again; each failed probe doubles it up to MaxBackoff.
	MinBackoff = 250 * time.Millisecond
	// MaxBackoff caps the delay between probes. It is short so that a
	// fleet comes back to central admission within about 2 s of a control
	// plane restart: until every host is back, the hosts that are admit at
	// the restarted bucket's full rate while the others still admit at
	// their local share, which together exceed the account's rate.
	MaxBackoff = 2 * time.Second
	// jitterFraction spreads each backoff uniformly over ±20 %.
	jitterFraction = 0.2
)

// Modes reported by Client.Mode.
const (
	ModeCentral = "central" // decisions come from the control plane
	ModeLocal   = "local"   // the control plane is unreachable; local buckets decide
)

// Config configures New. New copies it and never modifies it.
type Config struct {
	// Conn is the connection to the control plane, dialed by the caller
	// with the otelgrpc client stats handler, the agent token's per-RPC
	// credentials and DialOption (the embedded control plane is dialed the
	// same way). The Client never closes it. (Required)
	Conn grpc.ClientConnInterface
	// AgentID names this data plane in Admit requests (logs and metrics
	// only). (Optional)
	AgentID string
	// Timeout bounds each Admit and Cancel RPC. (Optional; default 250ms)
	Timeout time.Duration
	// Fallback is the local bucket's policy for an account whose policy was
	// never seen through SetPolicy: normally pacing.PolicyFromEnv's result.
	// The zero Policy means pacing.DefaultPolicy(). (Optional)
	Fallback pacing.Policy
	// LiveAgents returns how many live data planes share the account
	// with key accountKey; its local bucket gets 1/LiveAgents(accountKey)
	// of the account's policy. It is called synchronously on every local
	// decision and must not block; values below 1 count as 1. The data
	// plane passes agent.Agent.LiveAgents, which holds the highest count
	// of the last 15 s. (Optional; default always 1)
	LiveAgents func(accountKey string) int
	// Clock is the time source of the local buckets and the probe backoff.
	// (Optional; default time.Now)
	Clock func() time.Time
	// Sleep waits d or until ctx ends, returning ctx.Err() in that case.
	// (Optional; default a timer)
	Sleep func(ctx context.Context, d time.Duration) error
	// Notify receives one-time user notices: the switch to local admission
	// and the return to central admission. It runs synchronously, outside
	// every lock. (Optional; default none)
	Notify func(msg string)
	// Logger receives the client's logs. (Optional; default discards)
	Logger *slog.Logger
	// Rand returns a uniform value in [0, 1) for the backoff jitter.
	// (Optional; default math/rand/v2)
	Rand func() float64
}

// Validate reports every invalid field at once.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.Conn == nil {
		errs = append(errs, errors.New("field Conn is required: a connection to the control plane"))
	}
	if cfg.Timeout < 0 {
		errs = append(errs, fmt.Errorf("field Timeout %v is negative; want 0 (default %v) or more", cfg.Timeout, DefaultTimeout))
	}
	if cfg.Fallback != (pacing.Policy{}) {
		if err := cfg.Fallback.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("field Fallback: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Counts are the decisions of one mode.
type Counts struct {
	Admits   int64 // admitted at once
	Waits    int64 // admitted after a granted delay (counted when granted)
	Refusals int64 // refused with a retry-after hint
}

// Stats are the client's counters since New.
type Stats struct {
	Central Counts // decided by the control plane
	Local   Counts // decided by a local bucket
	// Fallbacks counts switches from central to local admission.
	Fallbacks int64
	// Recoveries counts switches back from local to central admission.
	Recoveries int64
	// Probes counts requests that asked the control plane while local.
	Probes int64
	// Errors counts control-plane answers that were errors of another kind
	// than unreachable (e.g. Unauthenticated); each was decided locally.
	Errors int64
	// Cancels counts requests whose context ended while they waited out a
	// granted delay; Refunds counts the reservations that were refunded.
	Cancels, Refunds int64
	// HandOvers counts the reports of local grants the control plane
	// accepted (ReportGrants); HandedOver is how many grants it debited.
	HandOvers, HandedOver int64
}

// Client admits new upstream sockets through the control plane, falling
// back to local buckets while it is unreachable. It is safe for concurrent
// use.
type Client struct {
	admission  controlplanev1.AdmissionServiceClient
	agentID    string
	timeout    time.Duration
	fallback   pacing.Policy
	liveAgents func(accountKey string) int
	now        func() time.Time
	sleep      func(ctx context.Context, d time.Duration) error
	notify     func(msg string)
	log        *slog.Logger
	rand       func() float64

	reportPrefix string         // report ids are reportPrefix-gN
	notices      pacing.Notices // one-time notices other than the mode switches
	rejectedLog  rate.Sometimes // limits "control plane rejected" logs

	mu        sync.Mutex // guards the following fields
	closed    bool
	mode      string
	probing   bool          // a probe is in flight
	nextProbe time.Time     // while local: when the next request may probe
	backoff   time.Duration // the last probe delay; reset by each fallback
	policies  map[string]pacing.Policy
	paused    map[string]time.Time    // pauses pushed by the control plane (SetPause)
	buckets   map[string]*localBucket // this outage's buckets; emptied by each fallback
	tally     map[string]*grantTally  // local grants not yet in a report (the hand-over)
	pending   []*pendingReport        // reports not yet confirmed, oldest first
	reportSeq uint64
	reporting bool // a hand-over is in flight
	stats     Stats
}

// localBucket is one account's local bucket; guarded by Client.mu.
type localBucket struct {
	bucket *pacing.Bucket
	share  pacing.Policy // the policy bucket was last set to
}

// New returns a Client in central mode. It starts no goroutine.
func New(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new admission client: %w", err)
	}
	c := &Client{
		admission:    controlplanev1.NewAdmissionServiceClient(cfg.Conn),
		agentID:      cfg.AgentID,
		timeout:      cfg.Timeout,
		fallback:     cfg.Fallback,
		liveAgents:   cfg.LiveAgents,
		now:          cfg.Clock,
		sleep:        cfg.Sleep,
		notify:       cfg.Notify,
		rand:         cfg.Rand,
		reportPrefix: reportPrefix(cfg.AgentID),
		rejectedLog:  rate.Sometimes{First: 3, Interval: time.Minute},
		mode:         ModeCentral,
		policies:     make(map[string]pacing.Policy),
		paused:       make(map[string]time.Time),
		buckets:      make(map[string]*localBucket),
		tally:        make(map[string]*grantTally),
	}
	if c.timeout == 0 {
		c.timeout = DefaultTimeout
	}
	if c.fallback == (pacing.Policy{}) {
		c.fallback = pacing.DefaultPolicy()
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.sleep == nil {
		c.sleep = sleep
	}
	if c.notify == nil {
		c.notify = func(string) {}
	}
	if c.rand == nil {
		c.rand = rand.Float64
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	c.log = logger.With("component", "dataplane/admission")
	return c, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// DialOption returns the reconnect backoff the control-plane connection
// should use so that the transport comes back on the same schedule as the
// client's probes: 250 ms doubling to 2 s, ±20 %, with gRPC's default 20 s
// connect timeout.
func DialOption() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: MinBackoff, Multiplier: 2, Jitter: jitterFraction, MaxDelay: MaxBackoff},
		MinConnectTimeout: 20 * time.Second,
	})
}

// Admit asks for one new upstream socket for the account with key
// accountKey (account.Key of the ChatGPT account id). It returns nil when
// the caller may dial now, after waiting out any granted delay; a
// *RefusedError when admission is refused (the caller's retry loop waits
// exactly RefusedError.RetryAfter); ctx.Err() when ctx ends first (a
// pending reservation is cancelled); ErrInvalidKey or ErrClosed for misuse.
// A control plane that cannot be reached or answers with an error never
// fails the request: a local bucket decides instead.
func (c *Client) Admit(ctx context.Context, accountKey string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !account.IsKey(accountKey) {
		return fmt.Errorf("admit: %w", ErrInvalidKey)
	}
	ask, probe, err := c.route()
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	if !ask {
		return c.local(ctx, accountKey, true)
	}
	// A probe hands the outage's grants over before it asks, so the
	// account's bucket counts them before this host admits centrally.
	if probe {
		if err := c.handOver(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				c.endProbe(probe)
				return ctxErr
			}
			c.failed(ctx, accountKey, err, probe)
			return c.local(ctx, accountKey, true)
		}
	}
	resp, err := c.ask(ctx, accountKey)
	if err == nil {
		return c.central(ctx, accountKey, resp, probe)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		c.endProbe(probe)
		return ctxErr
	}
	c.failed(ctx, accountKey, err, probe)
	return c.local(ctx, accountKey, unreachable(err))
}

// route reports whether this request asks the control plane and whether it
// is the probe of a local client.
func (c *Client) route() (ask, probe bool, err error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return false, false, ErrClosed
	case c.mode == ModeCentral:
		return true, false, nil
	case c.probing || now.Before(c.nextProbe):
		return false, false, nil
	}
	c.probing = true
	c.stats.Probes++
	return true, true, nil
}

func (c *Client) endProbe(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	c.probing = false
	c.mu.Unlock()
}

// ask sends one Admit RPC bounded by the timeout. An answer with an unknown
// decision is returned as an Unknown status error.
func (c *Client) ask(ctx context.Context, key string) (*controlplanev1.AdmitResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.admission.Admit(rctx, &controlplanev1.AdmitRequest{Account: key, AgentId: c.agentID})
	if err != nil {
		return nil, err
	}
	switch resp.GetDecision() {
	case controlplanev1.Decision_DECISION_ADMIT, controlplanev1.Decision_DECISION_WAIT, controlplanev1.Decision_DECISION_REFUSE:
		return resp, nil
	}
	return nil, status.Errorf(codes.Unknown, "admit answered decision %v; want ADMIT, WAIT or REFUSE", resp.GetDecision())
}

// unreachable reports whether err means the control plane did not answer:
// Unavailable, DeadlineExceeded, Canceled, or an error not from gRPC.
func unreachable(err error) bool {
	s, ok := status.FromError(err)
	if !ok {
		return true
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// central acts on a control-plane answer.
func (c *Client) central(ctx context.Context, key string, resp *controlplanev1.AdmitResponse, probe bool) error {
	c.mu.Lock()
	back := probe && c.mode == ModeLocal
	if probe {
		c.probing = false
	}
	if back {
		c.mode = ModeCentral
		c.stats.Recoveries++
	}
	switch resp.GetDecision() {
	case controlplanev1.Decision_DECISION_ADMIT:
		c.stats.Central.Admits++
	case controlplanev1.Decision_DECISION_WAIT:
		c.stats.Central.Waits++
	case controlplanev1.Decision_DECISION_REFUSE:
		c.stats.Central.Refusals++
	}
	leftover := back && (len(c.tally) > 0 || len(c.pending) > 0)
	c.mu.Unlock()
	if back {
		c.announceBack(ctx)
	}
	if leftover {
		// Grants made locally while this probe was in flight. A failure
		// keeps them for the next outage's hand-over.
		_ = c.handOver(ctx)
	}

	switch resp.GetDecision() {
	case controlplanev1.Decision_DECISION_WAIT:
		wait := max(time.Duration(resp.GetWaitMs())*time.Millisecond, 0)
		annotate(ctx, ModeCentral, pacing.KindWait, wait, 0)
		if err := c.sleep(ctx, wait); err != nil {
			c.cancelCentral(ctx, key, resp.GetReservationId())
			return ctxErr(ctx, err)
		}
		// A 403 elsewhere paused the account while this request waited:
		// give the slot back rather than dial into the pause.
		if until, ok := c.pausedUntil(key); ok {
			c.cancelCentral(ctx, key, resp.GetReservationId())
			retryAfter := max((until.Sub(c.now())+time.Second-1)/time.Second*time.Second, time.Second)
			annotate(ctx, ModeCentral, pacing.KindRefuse, 0, retryAfter)
			return &RefusedError{RetryAfter: retryAfter, RequiredWait: retryAfter, Paused: true}
		}
		return nil
	case controlplanev1.Decision_DECISION_REFUSE:
		// The control plane floors its hint at 1 s; a zero hint would make
		// the caller retry in a hot loop, so floor it here too.
		retryAfter := max(time.Duration(resp.GetRetryAfterMs())*time.Millisecond, time.Second)
		annotate(ctx, ModeCentral, pacing.KindRefuse, 0, retryAfter)
		return &RefusedError{
			RetryAfter:   retryAfter,
			RequiredWait: time.Duration(resp.GetRequiredWaitMs()) * time.Millisecond,
		}
	}
	annotate(ctx, ModeCentral, pacing.KindAdmit, 0, 0)
	return nil
}

// ctxErr returns ctx's error when it has one, else err.
func ctxErr(ctx context.Context, err error) error {
	if e := ctx.Err(); e != nil {
		return e
	}
	return err
}

// cancelCentral cancels a pending reservation under a short context that
// outlives the request's cancellation.
func (c *Client) cancelCentral(ctx context.Context, key, reservation string) {
	c.mu.Lock()
	c.stats.Cancels++
	c.mu.Unlock()
	if reservation == "" {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
	defer cancel()
	resp, err := c.admission.Cancel(cctx, &controlplanev1.CancelRequest{Account: key, ReservationId: reservation})
	if err != nil {
		// The token stays spent until the bucket refills; nothing else
		// depends on the refund.
		c.log.LogAttrs(ctx, slog.LevelWarn, "cancel reservation", slog.String("code", status.Code(err).String()))
		return
	}
	if resp.GetRefunded() {
		c.mu.Lock()
		c.stats.Refunds++
		c.mu.Unlock()
	}
}

// failed records a control-plane failure: an unreachable control plane
// switches a central client to local admission (announced once per outage)
// and a failed probe extends the backoff.
func (c *Client) failed(ctx context.Context, key string, err error, probe bool) {
	unreach := unreachable(err)
	code := status.Code(err)
	now := c.now()
	c.mu.Lock()
	switched := false
	switch {
	case probe:
		c.probing = false
		c.scheduleProbeLocked(now)
	case unreach && c.mode == ModeCentral:
		c.mode = ModeLocal
		c.stats.Fallbacks++
		c.backoff = 0
		c.scheduleProbeLocked(now)
		// Each outage starts with new, empty buckets (see bucketLocked).
		clear(c.buckets)
		switched = true
	}
	if !unreach {
		c.stats.Errors++
	}
	c.mu.Unlock()

	switch {
	case switched:
		live := c.live(key)
		c.log.LogAttrs(ctx, slog.LevelWarn, "control plane unreachable; admitting locally",
			slog.String("code", code.String()), slog.Int("live_agents", live))
		c.notify(fmt.Sprintf("control plane unreachable (%v): admitting new upstream connections locally "+
			"at this host's share of each account's policy (1/%d of its rate and burst) until it is back", code, live))
	case !unreach:
		c.rejectedLog.Do(func() {
			c.log.LogAttrs(ctx, slog.LevelError, "control plane rejected admit; admitting locally",
				slog.String("code", code.String()), slog.String("err", status.Convert(err).Message()))
		})
		c.notices.Emit(pacing.Notice{
			Key:     "admission.rejected:" + code.String(),
			Message: rejectedNotice(err),
		}, c.notify)
	}
}

// rejectedNotice says why the control plane refused an admission request
// and what to check: the server's own message (it names the account or
// the credential's scope) and, for a token the control plane does not
// know, the data plane's token and address.
func rejectedNotice(err error) string {
	st := status.Convert(err)
	hint := ""
	switch st.Code() {
	case codes.Unauthenticated:
		hint = "; check the data plane's --agent-token-file and --control-plane address"
	case codes.PermissionDenied:
		hint = "; an operator must grant this data plane's credential the account (see the control plane's message)"
	}
	return fmt.Sprintf("control plane rejected an admission request (%v: %s): admitting new upstream connections locally%s",
		st.Code(), st.Message(), hint)
}

// scheduleProbeLocked doubles the backoff (from MinBackoff, up to
// MaxBackoff) and sets the next probe time with jitter.
func (c *Client) scheduleProbeLocked(now time.Time) {
	if c.backoff == 0 {
		c.backoff = MinBackoff
	} else {
		c.backoff = min(2*c.backoff, MaxBackoff)
	}
	c.nextProbe = now.Add(jitter(c.backoff, c.rand()))
}

// jitter spreads d uniformly over [0.8 d, 1.2 d) for r in [0, 1).
func jitter(d time.Duration, r float64) time.Duration {
	r = min(max(r, 0), 1)
	return time.Duration(math.Round(float64(d) * (1 + jitterFraction*(2*r-1))))
}

func (c *Client) live(key string) int {
	if c.liveAgents == nil {
		return 1
	}
	return max(c.liveAgents(key), 1)
}

// share returns one agent's share of p among live agents: rate
// max(1, floor(rate / live)) (a rate of 0, pacing off, stays 0) and burst
// max(1, ceil(burst / live)). The budget is unchanged.
func share(p pacing.Policy, live int) pacing.Policy {
	live = max(live, 1)
	if p.RatePerMinute > 0 {
		p.RatePerMinute = max(1, p.RatePerMinute/live)
	}
	p.Burst = max(1, (p.Burst+live-1)/live)
	return p
}

// local decides with the account's local bucket. When outage is set (the
// control plane is unreachable, not merely refusing this data plane) a
// debited grant is tallied for the hand-over.
func (c *Client) local(ctx context.Context, key string, outage bool) error {
	live := c.live(key)
	now := c.now()
	c.mu.Lock()
	lb := c.bucketLocked(key, live, now)
	d := lb.bucket.Take(now)
	pol := lb.share
	if outage && d.Debited {
		c.tallyLocked(key, now)
	}
	switch d.Kind {
	case pacing.KindAdmit:
		c.stats.Local.Admits++
	case pacing.KindWait:
		c.stats.Local.Waits++
	case pacing.KindRefuse:
		c.stats.Local.Refusals++
	}
	c.mu.Unlock()

	switch d.Kind {
	case pacing.KindWait:
		annotate(ctx, ModeLocal, d.Kind, d.Wait, 0)
		if err := c.sleep(ctx, d.Wait); err != nil {
			now := c.now()
			c.mu.Lock()
			c.stats.Cancels++
			if lb.bucket.RefundReservation(now, d.ID) {
				c.stats.Refunds++
				if outage {
					c.untallyLocked(key)
				}
			}
			c.mu.Unlock()
			return ctxErr(ctx, err)
		}
		return nil
	case pacing.KindRefuse:
		annotate(ctx, ModeLocal, d.Kind, 0, d.RetryAfter)
		return &RefusedError{RetryAfter: d.RetryAfter, RequiredWait: d.RequiredWait, Local: true}
	}
	annotate(ctx, ModeLocal, pacing.KindAdmit, 0, 0)
	if d.Relaxed {
		c.notices.Emit(pol.RelaxedNotice(), c.notify)
	}
	return nil
}

// bucketLocked returns the account's local bucket, set to its current
// share. A new bucket starts with zero tokens and refills at the share's
// rate: the switch to local admission follows requests the control plane
// has just admitted from the account's central bucket, which the local
// bucket cannot see, so a full burst on top of them would open up to
// burst more sockets fleet-wide at once than the policy allows (the
// upstream answers such bursts with 403s). Starting empty gives up at most
// one burst per outage, never an excess.
func (c *Client) bucketLocked(key string, live int, now time.Time) *localBucket {
	p, ok := c.policies[key]
	if !ok {
		p = c.fallback
	}
	want := share(p, live)
	lb := c.buckets[key]
	switch {
	case lb == nil:
		lb = &localBucket{bucket: pacing.Restore(want, pacing.State{Tokens: 0, Updated: now}), share: want}
		c.buckets[key] = lb
	case lb.share != want:
		lb.bucket.SetPolicy(now, want)
		lb.share = want
	}
	return lb
}

// annotate records the decision on the caller's span (the upstream
// attempt) when it is recording.
func annotate(ctx context.Context, mode string, kind pacing.Kind, wait, retryAfter time.Duration) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(
		attribute.String("clodex.admission.mode", mode),
		attribute.String("clodex.admission.decision", kind.String()),
		attribute.Int64("clodex.admission.wait_ms", wait.Milliseconds()),
		attribute.Int64("clodex.admission.retry_after_ms", retryAfter.Milliseconds()),
	)
}

// SetPolicy records the last policy seen for the account (the agent stream
// will feed it); the local bucket uses it from the next local decision.
func (c *Client) SetPolicy(accountKey string, p pacing.Policy) error {
	if !account.IsKey(accountKey) {
		return fmt.Errorf("set policy: %w", ErrInvalidKey)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	c.mu.Lock()
	c.policies[accountKey] = p
	c.mu.Unlock()
	return nil
}

// SetPause records that the control plane paused the account's new
// sockets until until (after an upstream 403; the zero time ends a
// pause). A request that has waited out a granted delay and finds the
// account paused does not dial: its reservation is cancelled and Admit
// returns a *RefusedError with Paused set and the pause's end as its hint.
func (c *Client) SetPause(accountKey string, until time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if until.IsZero() {
		delete(c.paused, accountKey)
		return
	}
	c.paused[accountKey] = until
}

// pausedUntil returns the end of the account's pause when it is paused now.
func (c *Client) pausedUntil(key string) (time.Time, bool) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	until, ok := c.paused[key]
	if !ok || !now.Before(until) {
		return time.Time{}, false
	}
	return until, true
}

// CentralMaybeBack tells a local client that the control plane may be
// reachable again (the agent's stream has just reconnected): the next
// Admit asks it at once instead of waiting out the probe backoff, and a
// probe that fails backs off from MinBackoff again. A central or closed
// client ignores it. It never blocks and never makes an RPC itself.
func (c *Client) CentralMaybeBack() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.mode != ModeLocal {
		return
	}
	c.backoff = 0
	c.nextProbe = time.Time{}
}

// Mode returns ModeCentral or ModeLocal.
func (c *Client) Mode() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode
}

// Stats returns the counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Close makes every later Admit return ErrClosed. The Client owns no
// goroutine (probes run inside Admit) and does not close Config.Conn.
// Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	return nil
}
