package control

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/pacing"
)

// Modes reported by Client.Mode.
const (
	ModeCentral = "central" // the control plane answers; decisions come from it
	ModeLocal   = "local"   // the control plane is unreachable; local buckets decide
)

// reach is the client's one view of whether the control plane answers.
// Admission routes on it (Client.route, in admit.go: central or local,
// and when a local client asks again); every RPC outcome and the agent
// stream's connects update it; each change is announced once. It is
// guarded by Client.mu.
type reach struct {
	local     bool          // the control plane did not answer; admission decides locally
	probing   bool          // a probe or a hand-over is asking the control plane
	nextProbe time.Time     // while local: when the next Admit may probe
	backoff   time.Duration // the last probe delay; reset by each fallback and each sign of life
}

// schedule doubles the backoff (from MinBackoff, up to MaxBackoff) and
// sets the next probe time with jitter r in [0, 1).
func (r *reach) schedule(now time.Time, rnd float64) {
	if r.backoff == 0 {
		r.backoff = MinBackoff
	} else {
		r.backoff = min(2*r.backoff, MaxBackoff)
	}
	r.nextProbe = now.Add(jitter(r.backoff, rnd))
}

// jitter spreads d uniformly over [0.8 d, 1.2 d) for r in [0, 1).
func jitter(d time.Duration, r float64) time.Duration {
	r = min(max(r, 0), 1)
	return time.Duration(math.Round(float64(d) * (1 + jitterFraction*(2*r-1))))
}

// Mode returns ModeCentral while the control plane answers, ModeLocal
// while admission decides locally.
func (c *Client) Mode() string {
	if c.Reachable() {
		return ModeCentral
	}
	return ModeLocal
}

// Reachable reports whether the control plane answers: the last RPC that
// asked it was answered, or a hand-over since has been.
func (c *Client) Reachable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.reach.local
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

// failed records an admission RPC's failure: an unreachable control plane
// switches a central client to local admission (announced once per
// outage) and a failed probe extends the backoff. An error of another kind
// is announced once per code and leaves the mode alone.
func (c *Client) failed(ctx context.Context, key string, err error, probe bool) {
	unreach := unreachable(err)
	code := status.Code(err)
	now := c.now()
	c.mu.Lock()
	switched := false
	switch {
	case probe:
		c.reach.probing = false
		c.reach.schedule(now, c.rand())
	case unreach:
		switched = c.fallBackLocked(now)
	}
	if !unreach {
		c.stats.Errors++
	}
	c.mu.Unlock()

	switch {
	case switched:
		c.announceLost(ctx, key, code)
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

// observed records the outcome of an RPC other than admission's: the
// agent stream's opening and the broker's ServedAccounts and GetToken. An
// answer (a success, or an error the control plane sent) is a sign of life
// (alive). A failure that says it did not answer switches a central client
// to local admission only when the connection has no replica ready: the
// broker's Unavailable may be its identity provider's, and with several
// replicas a stream may fail on one while the next RPC goes to another.
func (c *Client) observed(ctx context.Context, err error) {
	if err == nil || !unreachable(err) {
		c.alive()
		return
	}
	if c.answering() {
		return
	}
	now := c.now()
	c.mu.Lock()
	switched := !c.closed && c.fallBackLocked(now)
	c.mu.Unlock()
	if switched {
		c.announceLost(ctx, "", status.Code(err))
	}
}

// fallBackLocked switches a central client to local admission and reports
// whether it did. Each outage starts with new, empty buckets (see
// bucketLocked) and the probe backoff from MinBackoff.
func (c *Client) fallBackLocked(now time.Time) bool {
	if c.reach.local {
		return false
	}
	c.reach.local = true
	c.stats.Fallbacks++
	c.reach.backoff = 0
	c.reach.schedule(now, c.rand())
	clear(c.buckets)
	clear(c.memberBuckets)
	return true
}

// backLocked switches a local client back to central admission and reports
// whether it did; the caller announces it (announceBack).
func (c *Client) backLocked() bool {
	if !c.reach.local || c.closed {
		return false
	}
	c.reach.local = false
	c.stats.Recoveries++
	return true
}

// announceLost logs and announces the switch to local admission. The share
// it names is that of the account whose request found the control plane
// gone, or (found by the stream or the broker) the largest.
func (c *Client) announceLost(ctx context.Context, key string, code codes.Code) {
	live := c.maxLive()
	if key != "" {
		live = c.LiveAgents(key)
	}
	c.log.LogAttrs(ctx, slog.LevelWarn, "control plane unreachable; admitting locally",
		slog.String("code", code.String()), slog.Int("live_agents", live))
	c.notify(fmt.Sprintf("control plane unreachable (%v): admitting new upstream connections locally "+
		"at this host's share of each account's policy (1/%d of its rate and burst) until it is back", code, live))
}

// announceBack logs and announces the return to central admission.
func (c *Client) announceBack(ctx context.Context) {
	c.log.InfoContext(ctx, "control plane reachable again; admission is central")
	c.notify("control plane reachable again: admission is central")
}

// alive records a sign that the control plane answers again (the agent
// stream has connected, the broker answered): a local client's next Admit
// asks at once, and the hand-over loop reports the outage's grants and
// returns admission to the control plane without waiting for a request.
// It never blocks.
func (c *Client) alive() {
	if !c.cutBackoff() {
		return
	}
	select {
	case c.answered <- struct{}{}:
	default:
	}
}

// cutBackoff makes a local client's next Admit ask the control plane at
// once instead of waiting out the probe backoff; a probe that fails backs
// off from MinBackoff again. It reports whether the client is local (a
// central or closed one is left alone).
func (c *Client) cutBackoff() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || !c.reach.local {
		return false
	}
	c.reach.backoff = 0
	c.reach.nextProbe = time.Time{}
	return true
}

// rejectedNotice says why the control plane refused an admission request
// and what to check: the server's own message (it names the account or
// the credential's scope). A refused token never gets here: it refuses
// the data plane (refused.go).
func rejectedNotice(err error) string {
	st := status.Convert(err)
	hint := ""
	switch st.Code() {
	case codes.PermissionDenied:
		hint = "; an operator must grant this data plane's credential the account (see the control plane's message)"
	}
	return fmt.Sprintf("control plane rejected an admission request (%v: %s): admitting new upstream connections locally%s",
		st.Code(), st.Message(), hint)
}
