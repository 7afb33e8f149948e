package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// agentStream is the client side of AgentService.Connect.
type agentStream = grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]

// streamLoop holds the agent stream until ctx ends, reconnecting with
// backoff; the last session says goodbye. It is owned by Run.
func (c *Client) streamLoop(ctx context.Context) {
	var backoff time.Duration
	confirmed := false // the first refusal of a token not known to be revoked was asked again
	for {
		start := time.Now()
		established, err := c.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if !established {
			// The stream never got an answer: whether the control plane
			// answered at all is the reachability's to judge.
			c.observed(ctx, err)
		}
		backoff = nextBackoff(backoff, established, time.Since(start))
		if e, ok := c.refusal(err); ok && !e.Revoked && !confirmed && !c.settled() {
			// A token created moments ago on another replica reaches this
			// one within its fleet tick: ask once more before the start is
			// told the token is refused.
			confirmed = true
			backoff = confirmRefusal
		} else if e, refused := c.refuse(ctx, err); refused {
			c.settle(e)
			backoff = refusedBackoff
		} else if !established {
			c.settle(firstFailure(c.target, err))
		}
		d := jitter(backoff, c.rand())
		c.log.WarnContext(ctx, "agent stream ended; reconnecting", "err", errString(err), "retry_in", d)
		if d == 0 {
			continue
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// nextBackoff is the delay before the next connect, given the last one,
// whether the stream that just ended had been established and how long it
// lasted. A stream that was up for MaxBackoff or longer reconnects at
// once: with several replicas another one answers (the connection
// balances over the live ones), so the agent is back long before its
// heartbeat would lapse. A stream that ended sooner starts over at
// MinBackoff, so a control plane that keeps closing streams is not
// hammered; a connect that fails doubles the delay up to MaxBackoff.
func nextBackoff(last time.Duration, established bool, lasted time.Duration) time.Duration {
	switch {
	case established && lasted >= MaxBackoff:
		return 0
	case established || last == 0:
		return MinBackoff
	}
	return min(2*last, MaxBackoff)
}

// firstFailure is Accepted's answer when the first agent stream failed
// without a refusal of the credential.
func firstFailure(target string, err error) error {
	if err == nil || unreachable(err) {
		return fmt.Errorf("the control plane at %s cannot be reached: %s", target, errString(err))
	}
	return fmt.Errorf("the control plane at %s refused the agent stream: %s", target, errString(err))
}

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// session runs one stream. established reports that the hello was sent
// and the control plane answered.
func (c *Client) session(ctx context.Context) (established bool, err error) {
	// The stream outlives ctx so the goodbye can be sent after ctx ends.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := c.api().agents.Connect(sctx)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	accounts := c.served()
	hello := &controlplanev1.AgentHello{
		AgentId:           c.id,
		Host:              c.host,
		Version:           c.version,
		CapabilityVersion: int32(CapabilityVersion),
		Accounts:          accounts,
	}
	recvDone := make(chan error, 1) // buffered: recvLoop never blocks on exit
	got := make(chan struct{})      // closed once the control plane accepted the hello
	sess := c.sessions.Add(1)       // names this stream for the usage batches sent on it
	var capable atomic.Bool         // the control plane reads usage reports (set before got is closed)
	go c.recvLoop(ctx, stream, recvDone, got, &capable)
	// Whatever happens, the receive loop has exited when session returns.
	recvErr := func() error { cancel(); return <-recvDone }
	if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		return false, sendErr(recvErr(), err)
	}
	// The control plane is reachable again: admission asks it at once
	// instead of waiting out its backoff, and the outage's grants are
	// handed over.
	c.log.InfoContext(ctx, "agent stream connected", "accounts", len(accounts))
	c.alive()
	if err := c.sendReports(stream); err != nil { // reports queued while disconnected
		return false, sendErr(recvErr(), err)
	}
	tick := time.NewTicker(c.heartbeat)
	defer tick.Stop()
	usageTick := time.NewTicker(c.usageFlush)
	defer usageTick.Stop()
	for {
		select {
		case <-got:
			established, got = true, nil
			c.accept(ctx)
			if err := c.sendUsage(stream, sess, capable.Load()); err != nil { // batches unacknowledged on the last stream
				return established, sendErr(recvErr(), err)
			}
		case <-usageTick.C:
			if err := c.sendUsage(stream, sess, capable.Load()); err != nil {
				return established, sendErr(recvErr(), err)
			}
		case err := <-recvDone:
			return established, err
		case <-tick.C:
			hb := &controlplanev1.AgentHeartbeat{Accounts: c.served()}
			if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Heartbeat{Heartbeat: hb}}); err != nil {
				return established, sendErr(recvErr(), err)
			}
		case <-c.reported:
			if err := c.sendReports(stream); err != nil {
				return established, sendErr(recvErr(), err)
			}
		case <-ctx.Done():
			c.goodbye(ctx, stream, recvDone, cancel, sess, capable.Load())
			return established, nil
		}
	}
}

// sendErr prefers the stream's status (from Recv) over Send's io.EOF.
func sendErr(recv, send error) error {
	if recv != nil && !errors.Is(recv, context.Canceled) && status.Code(recv) != codes.Canceled {
		return recv
	}
	return fmt.Errorf("send: %w", send)
}

// goodbye deregisters: it sends the queued reports and usage and the
// goodbye, half-closes and waits up to GoodbyeTimeout for the control
// plane to end the stream (it stores the usage before it reads the
// goodbye, and acknowledges it); then it cancels the stream and waits
// for the receive loop. Usage still unacknowledged then is logged.
func (c *Client) goodbye(ctx context.Context, stream agentStream, recvDone <-chan error, cancel context.CancelFunc, sess uint64, capable bool) {
	ctx = context.WithoutCancel(ctx)
	defer c.logUnackedUsage(ctx)
	c.sendReports(stream)              //nolint:errcheck // best effort: the goodbye follows
	c.sendUsage(stream, sess, capable) //nolint:errcheck // best effort: the goodbye follows
	bye := &controlplanev1.AgentGoodbye{Reason: "data plane stopping"}
	if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Goodbye{Goodbye: bye}}); err == nil {
		_ = stream.CloseSend()
	}
	t := time.NewTimer(GoodbyeTimeout)
	defer t.Stop()
	select {
	case err := <-recvDone:
		if err != nil {
			c.log.WarnContext(ctx, "the agent stream failed after the goodbye", "err", err)
			return
		}
		c.log.InfoContext(ctx, "deregistered from the control plane")
	case <-t.C:
		c.log.WarnContext(ctx, "the control plane did not end the stream after the goodbye", "timeout", GoodbyeTimeout)
		cancel()
		if err := <-recvDone; err != nil && status.Code(err) != codes.Canceled {
			c.log.WarnContext(ctx, "the agent stream failed after the goodbye", "err", err)
		}
	}
}

// recvLoop receives until the stream ends and sends the error (nil for a
// clean end) on done. It is owned by session, which waits for it.
func (c *Client) recvLoop(ctx context.Context, stream agentStream, done chan<- error, got chan<- struct{}, capable *atomic.Bool) {
	ctx = context.WithoutCancel(ctx) // for the logs: the stream outlives ctx
	// The control plane sends the headers once it accepted the hello (an
	// older one with its first push), naming its capability version since
	// CAPABILITY_VERSION_USAGE; nil headers: the stream failed, and Recv
	// says how.
	first := true
	if md, _ := stream.Header(); md != nil {
		capable.Store(usageCapable(md))
		close(got)
		first = false
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			done <- err
			return
		}
		if first {
			close(got)
			first = false
		}
		switch m := msg.GetMsg().(type) {
		case *controlplanev1.ConnectResponse_Policy:
			c.applyPolicy(ctx, m.Policy)
		case *controlplanev1.ConnectResponse_Members:
			c.applyMembers(ctx, m.Members)
		case *controlplanev1.ConnectResponse_UsageAck:
			c.usageAcked(ctx, m.UsageAck)
		case *controlplanev1.ConnectResponse_Quotas:
			c.fleetQuotas(m.Quotas)
		case *controlplanev1.ConnectResponse_Close:
			c.streamMu.Lock()
			c.reason = m.Close.GetReason()
			c.streamMu.Unlock()
			c.log.InfoContext(ctx, "the control plane is closing the agent stream", "reason", m.Close.GetReason())
		}
	}
}

// applyPolicy records a push: its live count, the policy the local
// fallback paces the account at and the turn budget (Budget), and its
// pause (the learned upgrade throttle: a 403 anywhere in the fleet paused
// the account, so requests that were granted a slot and still wait give
// it back).
func (c *Client) applyPolicy(ctx context.Context, p *controlplanev1.PolicyPush) {
	key := p.GetAccount()
	if !account.IsKey(key) {
		c.log.WarnContext(ctx, "ignoring a policy push for an invalid account key")
		return
	}
	live := max(int(p.GetLiveAgents()), 1)
	now := c.now()
	c.streamMu.Lock()
	l := c.live[key]
	if l == nil {
		l = &liveCount{}
		c.live[key] = l
	}
	l.set(live, now)
	c.streamMu.Unlock()
	pol := toPolicy(p)
	if err := c.setPolicy(key, pol); err != nil {
		c.log.WarnContext(ctx, "ignoring an invalid policy push", "account", key, "err", err)
		return
	}
	c.pushLog.LogAttrs(ctx, slog.LevelInfo, "policy from the control plane", slog.String("account", key),
		slog.Int("rate_per_minute", pol.RatePerMinute), slog.Int("burst", pol.Burst), slog.Int("live_agents", live),
		slog.Int("max_retries", pol.Budget.MaxRetries), slog.Duration("idle_timeout", pol.Budget.IdleTimeout),
		slog.Duration("total_timeout", pol.Budget.TotalTimeout))
	var until time.Time
	if ms := p.GetPausedUntilUnixMs(); ms > 0 {
		until = time.UnixMilli(ms)
	}
	c.setPause(key, until)
}

// toPolicy converts a push into the policy to pace at: the effective rate,
// the burst, and the budget with its wait bound derived locally. setPolicy
// validates it.
func toPolicy(p *controlplanev1.PolicyPush) pacing.Policy {
	idle := time.Duration(p.GetIdleTimeoutMs()) * time.Millisecond
	total := time.Duration(p.GetTotalTimeoutMs()) * time.Millisecond
	retries := int(p.GetMaxRetries())
	b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	return pacing.Policy{RatePerMinute: int(p.GetEffectiveRatePerMinute()), Burst: int(p.GetBurst()), Budget: b}
}

// CloseReason returns the reason the control plane gave when it last
// closed the agent stream, or "".
func (c *Client) CloseReason() string {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	return c.reason
}

// liveCount is one account's live-agent counts: the last pushed one and
// the higher ones it replaced within the last LiveWindow.
type liveCount struct {
	cur   int
	peaks []peak
}

// peak is a count that was replaced by a lower one; it still counts until
// until.
type peak struct {
	n     int
	until time.Time
}

// set records a push of n at now.
func (l *liveCount) set(n int, now time.Time) {
	if l.cur > n {
		l.peaks = append(l.peaks, peak{n: l.cur, until: now.Add(LiveWindow)})
	}
	l.cur = n
	// A peak at or below the current count, or expired, no longer matters.
	l.peaks = slices.DeleteFunc(l.peaks, func(p peak) bool { return p.n <= n || !now.Before(p.until) })
}

// max returns the highest count seen within LiveWindow before now.
func (l *liveCount) max(now time.Time) int {
	n := l.cur
	for _, p := range l.peaks {
		if now.Before(p.until) {
			n = max(n, p.n)
		}
	}
	return n
}

// LiveAgents returns the number of live agents to divide accountKey's
// policy by for a local share, at least 1: the highest count the control
// plane pushed within the last LiveWindow (by Config.Clock), which is the
// last pushed count unless a higher one was replaced less than LiveWindow
// ago.
//
// A count that drops does not count at once because it is not always a
// smaller fleet: a restarted control plane knows only the agents that have
// registered again, and pushes 1, 2, 3 as they come back. A data plane
// still admitting locally would otherwise take the whole account's rate
// and burst for a moment. Agents that really left stop counting after
// LiveWindow, the same window in which the control plane forgets them.
func (c *Client) LiveAgents(accountKey string) int {
	now := c.now()
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	l := c.live[accountKey]
	if l == nil {
		return 1
	}
	return max(l.max(now), 1)
}

// maxLive returns the highest LiveAgents of any account, at least 1.
func (c *Client) maxLive() int {
	now := c.now()
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	n := 1
	for _, l := range c.live {
		n = max(n, l.max(now))
	}
	return n
}
