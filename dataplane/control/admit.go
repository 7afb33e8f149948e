package control

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Counts are the decisions of one mode.
type Counts struct {
	Admits   int64 // admitted at once
	Waits    int64 // admitted after a granted delay (counted when granted)
	Refusals int64 // refused with a retry-after hint
}

// Stats are the admission counters since New.
type Stats struct {
	Central Counts // decided by the control plane
	Local   Counts // decided by a local bucket
	// Fallbacks counts switches from central to local admission.
	Fallbacks int64
	// Recoveries counts switches back from local to central admission.
	Recoveries int64
	// Probes counts requests (and hand-overs) that asked the control plane
	// while local.
	Probes int64
	// Errors counts control-plane answers that were errors of another kind
	// than unreachable (e.g. PermissionDenied); each was decided locally.
	Errors int64
	// Cancels counts requests whose context ended while they waited out a
	// granted delay; Refunds counts the reservations that were refunded.
	Cancels, Refunds int64
	// HandOvers counts the reports of local grants the control plane
	// accepted (ReportGrants); HandedOver is how many grants it debited.
	HandOvers, HandedOver int64
}

// Stats returns the admission counters.
func (c *Client) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// localBucket is one account's local bucket; guarded by Client.mu.
type localBucket struct {
	bucket *pacing.Bucket
	share  pacing.Policy // the policy bucket was last set to
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
	m := accounts.MemberFrom(ctx) // the turn's member: its cap comes first
	ask, probe, err := c.route()
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	if !ask {
		return c.local(ctx, accountKey, m, true)
	}
	// A probe hands the outage's grants over before it asks, so the
	// account's bucket counts them before this host admits centrally.
	if probe {
		if err := c.handOver(ctx); err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil {
				c.endProbe(probe)
				return ctxErr
			}
			if e, ok := c.refuse(ctx, err); ok {
				c.endProbe(probe)
				return fmt.Errorf("admit: %w", e)
			}
			c.failed(ctx, accountKey, err, probe)
			return c.local(ctx, accountKey, m, true)
		}
	}
	resp, err := c.ask(ctx, accountKey, m)
	if err == nil {
		return c.central(ctx, accountKey, m, resp, probe)
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		c.endProbe(probe)
		return ctxErr
	}
	if e, ok := c.refuse(ctx, err); ok {
		c.endProbe(probe)
		return fmt.Errorf("admit: %w", e)
	}
	c.failed(ctx, accountKey, err, probe)
	return c.local(ctx, accountKey, m, unreachable(err))
}

// route reports whether this Admit asks the control plane and whether it
// is the probe of a local client.
func (c *Client) route() (ask, probe bool, err error) {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return false, false, ErrClosed
	case !c.reach.local:
		return true, false, nil
	case c.reach.probing || now.Before(c.reach.nextProbe):
		return false, false, nil
	}
	c.reach.probing = true
	c.stats.Probes++
	return true, true, nil
}

// endProbe ends this Admit's probe, when it is one, without a verdict:
// ctx ended before the control plane answered.
func (c *Client) endProbe(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	c.reach.probing = false
	c.mu.Unlock()
}

// ask sends one Admit RPC bounded by the timeout, naming the turn's
// member (m, nil for none). An answer with an unknown decision is returned
// as an Unknown status error.
func (c *Client) ask(ctx context.Context, key string, m *accounts.Member) (*controlplanev1.AdmitResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	req := &controlplanev1.AdmitRequest{Account: key, AgentId: c.id}
	if m != nil {
		req.Member = m.Name
	}
	api, viaShares := c.via()
	resp, err := api.admission.Admit(rctx, req)
	if err != nil && c.sharesInstead(viaShares, err) {
		resp, err = c.shares.admission.Admit(rctx, req)
	}
	if err != nil {
		return nil, err
	}
	switch resp.GetDecision() {
	case controlplanev1.Decision_DECISION_ADMIT, controlplanev1.Decision_DECISION_WAIT, controlplanev1.Decision_DECISION_REFUSE:
		return resp, nil
	}
	return nil, status.Errorf(codes.Unknown, "admit answered decision %v; want ADMIT, WAIT or REFUSE", resp.GetDecision())
}

// central acts on a control-plane answer.
func (c *Client) central(ctx context.Context, key string, m *accounts.Member, resp *controlplanev1.AdmitResponse, probe bool) error {
	c.mu.Lock()
	back := false
	if probe {
		c.reach.probing = false
		back = c.backLocked()
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
		e := &RefusedError{
			RetryAfter:   retryAfter,
			RequiredWait: time.Duration(resp.GetRequiredWaitMs()) * time.Millisecond,
		}
		if resp.GetMemberLimited() && m != nil {
			e.Member, e.MemberRate = m.Name, m.RatePerMinute
		}
		return e
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
	api, viaShares := c.via()
	req := &controlplanev1.CancelRequest{Account: key, ReservationId: reservation}
	resp, err := api.admission.Cancel(cctx, req)
	if err != nil && c.sharesInstead(viaShares, err) {
		resp, err = c.shares.admission.Cancel(cctx, req)
	}
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

// local decides with the account's local bucket, after the member's (m,
// nil for none) when it has a cap. When outage is set (the control plane
// is unreachable, not merely refusing this data plane) a debited grant is
// tallied for the hand-over.
func (c *Client) local(ctx context.Context, key string, m *accounts.Member, outage bool) error {
	live := c.LiveAgents(key)
	now := c.now()
	c.mu.Lock()
	var md pacing.Decision // the member's
	var mb *pacing.Bucket
	if m != nil && m.RatePerMinute > 0 {
		mb = c.memberBucketLocked(m, now)
		if md = mb.Take(now); md.Kind == pacing.KindRefuse {
			c.stats.Local.Refusals++
			c.mu.Unlock()
			annotate(ctx, ModeLocal, md.Kind, 0, md.RetryAfter)
			return &RefusedError{RetryAfter: md.RetryAfter, RequiredWait: md.RequiredWait, Local: true, Member: m.Name, MemberRate: m.RatePerMinute}
		}
	}
	lb := c.bucketLocked(key, live, now)
	d := lb.bucket.Take(now)
	pol := lb.share
	switch {
	case d.Kind == pacing.KindRefuse && md.Debited:
		mb.RefundReservation(now, md.ID) // the account refused: the member keeps its token
	case d.Kind != pacing.KindRefuse && md.Kind == pacing.KindWait && md.Wait > d.Wait:
		d.Kind, d.Wait = pacing.KindWait, md.Wait // the member's slot comes later
	}
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
			if d.Debited && lb.bucket.RefundReservation(now, d.ID) {
				c.stats.Refunds++
				if outage {
					c.untallyLocked(key)
				}
			}
			if md.Debited {
				mb.RefundReservation(now, md.ID)
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

// memberBucketLocked returns the member's local bucket at its cap (rate
// and burst the member's rate, the fallback's budget). A new one starts
// full: the member's cap bounds what one person opens, and the account's
// local bucket, which starts empty, still bounds the account.
func (c *Client) memberBucketLocked(m *accounts.Member, now time.Time) *pacing.Bucket {
	want := pacing.Policy{RatePerMinute: m.RatePerMinute, Burst: max(m.RatePerMinute, 1), Budget: c.fallback.Budget}
	b := c.memberBuckets[m.Name]
	switch {
	case b == nil:
		b = pacing.NewBucket(want, now)
		c.memberBuckets[m.Name] = b
	case b.Policy() != want:
		b.SetPolicy(now, want)
	}
	return b
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
	want := share(c.policyLocked(key), live)
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

// policyLocked returns the last policy pushed for the account, else the
// fallback.
func (c *Client) policyLocked(key string) pacing.Policy {
	if p, ok := c.policies[key]; ok {
		return p
	}
	return c.fallback
}

// setPolicy records the last policy pushed for the account; the local
// bucket uses it from the next local decision, and the turns
// (Config.Budgets) at once.
func (c *Client) setPolicy(accountKey string, p pacing.Policy) error {
	if !account.IsKey(accountKey) {
		return fmt.Errorf("set policy: %w", ErrInvalidKey)
	}
	if err := p.Validate(); err != nil {
		return fmt.Errorf("set policy: %w", err)
	}
	c.mu.Lock()
	c.policies[accountKey] = p
	c.mu.Unlock()
	if c.budgets != nil {
		return c.budgets.Set(accountKey, p.Budget)
	}
	return nil
}

// setPause records that the control plane paused the account's new
// sockets until until (after an upstream 403; the zero time ends a
// pause). A request that has waited out a granted delay and finds the
// account paused does not dial: its reservation is cancelled and Admit
// returns a *RefusedError with Paused set and the pause's end as its hint.
func (c *Client) setPause(accountKey string, until time.Time) {
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
