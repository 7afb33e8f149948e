package agent

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// CapabilityVersion is the protocol version the data plane implements (this
// package, admission and the broker client, dataplane/brokered); it is
// sent in every hello. The numbers and their history are
// controlplanev1.CapabilityVersion (proto/clodex/controlplane/v1/agent.proto).
const CapabilityVersion = int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_BROKER)

const (
	// DefaultHeartbeat is the default interval between heartbeats.
	DefaultHeartbeat = 5 * time.Second
	// LiveWindow is how long the control plane counts an agent live after
	// its last heartbeat; Config.Heartbeat must be shorter.
	LiveWindow = 15 * time.Second
	// MinBackoff is the first delay before reconnecting; each failed
	// attempt doubles it up to MaxBackoff. Delays are jittered by ±20%.
	MinBackoff = 250 * time.Millisecond
	// MaxBackoff caps the reconnect delay. It is short so that every data
	// plane of a fleet is back within about 2 s of a control plane
	// restart (and calls Config.OnConnect), matching the admission
	// client's probe backoff and the connection's (admission.DialOption).
	MaxBackoff = 2 * time.Second
	// GoodbyeTimeout bounds the wait for the control plane to end the
	// stream after the goodbye.
	GoodbyeTimeout = time.Second
	// maxIDLen is the longest agent id the control plane accepts.
	maxIDLen = 128
)

// Config configures New. New copies it and never modifies it.
type Config struct {
	// Conn is the connection to the control plane, dialed with the agent
	// token's per-RPC credentials. The Agent never closes it. (Required)
	Conn grpc.ClientConnInterface
	// ID names this process uniquely in the fleet; NewID builds one.
	// 1..128 printable ASCII bytes without spaces. (Required)
	ID string
	// Host is the host name shown by clodexctl agents. (Optional)
	Host string
	// Version is the data plane's release string. (Optional)
	Version string
	// Accounts returns the account keys this data plane serves; it is
	// called on every hello and heartbeat and must not block. Keys that
	// are not account keys are dropped with a warning. (Optional; default
	// none)
	Accounts func() []string
	// OnPolicy receives every policy push: the account key, the policy to
	// pace at (RatePerMinute is the effective rate) and the live agents
	// serving the account (at least 1). It runs synchronously on the
	// stream's receive loop and must not block. (Optional)
	OnPolicy func(accountKey string, p pacing.Policy, liveAgents int)
	// OnPause receives every push's pause: the account's new sockets are
	// paused until until after an upstream 403 (the zero time: not
	// paused). It runs synchronously on the stream's receive loop, after
	// OnPolicy, and must not block. (Optional)
	OnPause func(accountKey string, until time.Time)
	// OnConnect is called each time a stream is opened and its hello
	// sent: the control plane is reachable again. The data plane uses it
	// to make admission ask the control plane at once instead of waiting
	// out its own backoff. It runs synchronously on Run's goroutine and
	// must not block. (Optional)
	OnConnect func()
	// Clock stamps 403 reports and times LiveAgents' window. (Optional;
	// default time.Now)
	Clock func() time.Time
	// Logger receives the agent's logs. (Optional; default discards)
	Logger *slog.Logger
	// Rand returns a uniform value in [0, 1) for the backoff jitter.
	// (Optional; default math/rand/v2)
	Rand func() float64
	// Heartbeat is the interval between heartbeats; below LiveWindow.
	// (Optional; default 5s)
	Heartbeat time.Duration
}

// Validate reports every invalid field at once.
func (cfg *Config) Validate() error {
	var errs []error
	if cfg.Conn == nil {
		errs = append(errs, errors.New("field Conn is required: a connection to the control plane"))
	}
	if err := ValidateID(cfg.ID); err != nil {
		errs = append(errs, err)
	}
	if cfg.Heartbeat < 0 || cfg.Heartbeat >= LiveWindow {
		errs = append(errs, fmt.Errorf("field Heartbeat %v is invalid; allowed 0 (default %v) or more, below the %v liveness window", cfg.Heartbeat, DefaultHeartbeat, LiveWindow))
	}
	return errors.Join(errs...)
}

// ValidateID checks an agent id: 1..128 printable ASCII bytes without
// spaces.
func ValidateID(id string) error {
	if id == "" {
		return errors.New("agent id is empty; want 1..128 printable ASCII bytes without spaces, such as NewID's host-pid-random")
	}
	if len(id) > maxIDLen {
		return fmt.Errorf("agent id is %d bytes; allowed 1..%d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("agent id %q has a byte 0x%02x at %d; allowed printable ASCII without spaces", id, c, i)
		}
	}
	return nil
}

// NewID returns a process-unique agent id, "host-pid-random" (8 random hex
// digits). Bytes of host other than letters, digits, '.', '_' and '-'
// become '_', and host is cut to 64 bytes.
func NewID(host string, pid int) string {
	var b strings.Builder
	for i := 0; i < len(host) && b.Len() < 64; i++ {
		c := host[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
		} else {
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		b.WriteString("host")
	}
	var r [4]byte
	_, _ = crand.Read(r[:])
	return fmt.Sprintf("%s-%d-%s", b.String(), pid, hex.EncodeToString(r[:]))
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

// report is the queued 403s of one account.
type report struct {
	first      time.Time
	count      int
	retryAfter time.Duration // the longest retry-after among them
}

// Agent is one data plane's registration with the control plane.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	client controlplanev1.AgentServiceClient
	kick   chan struct{} // size 1: a report was queued

	mu      sync.Mutex // guards the following fields
	reports map[string]report
	limits  map[string]*controlplanev1.RateLimits // the latest unsent per account
	live    map[string]*liveCount
	reason  string // the last close reason the control plane gave
}

// New returns an Agent ready to Run.
func New(cfg Config) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new agent: %w", err)
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Agent{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "dataplane/agent", "agent_id", cfg.ID),
		client:  controlplanev1.NewAgentServiceClient(cfg.Conn),
		kick:    make(chan struct{}, 1),
		reports: map[string]report{},
		limits:  map[string]*controlplanev1.RateLimits{},
		live:    map[string]*liveCount{},
	}, nil
}

// ID returns the agent's id.
func (a *Agent) ID() string { return a.cfg.ID }

// Report403 queues one upstream 403 for accountKey with its retry-after
// (0: none); it never blocks. A key that is not an account key is dropped
// with a warning.
func (a *Agent) Report403(accountKey string, retryAfter time.Duration) {
	if !account.IsKey(accountKey) {
		a.log.Warn("dropping a 403 report for an invalid account key; want acct_ followed by 16 lowercase hex digits")
		return
	}
	now := a.cfg.Clock()
	a.mu.Lock()
	r := a.reports[accountKey]
	if r.count == 0 {
		r.first = now
	}
	r.count++
	r.retryAfter = max(r.retryAfter, retryAfter)
	a.reports[accountKey] = r
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// ReportRateLimits queues the latest plan usage read for the account
// (rl.Account); it never blocks. A report not yet sent is replaced by a
// newer one for the same account. An invalid account key is dropped with
// a warning.
func (a *Agent) ReportRateLimits(rl *controlplanev1.RateLimits) {
	if !account.IsKey(rl.GetAccount()) {
		a.log.Warn("dropping a rate-limits report for an invalid account key; want acct_ followed by 16 lowercase hex digits")
		return
	}
	a.mu.Lock()
	a.limits[rl.GetAccount()] = rl
	a.mu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default:
	}
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
func (a *Agent) LiveAgents(accountKey string) int {
	now := a.cfg.Clock()
	a.mu.Lock()
	defer a.mu.Unlock()
	l := a.live[accountKey]
	if l == nil {
		return 1
	}
	return max(l.max(now), 1)
}

// CloseReason returns the reason the control plane gave when it last
// closed the stream, or "".
func (a *Agent) CloseReason() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reason
}

// Run holds the stream until ctx ends, reconnecting with backoff, then says
// goodbye and returns nil.
func (a *Agent) Run(ctx context.Context) error {
	var backoff time.Duration
	for {
		start := time.Now()
		established, err := a.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		backoff = nextBackoff(backoff, established, time.Since(start))
		d := jitter(backoff, a.cfg.Rand())
		a.log.WarnContext(ctx, "agent stream ended; reconnecting", "err", errString(err), "retry_in", d)
		if d == 0 {
			continue
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
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

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	if st, ok := status.FromError(err); ok {
		return st.Code().String() + ": " + st.Message()
	}
	return err.Error()
}

// jitter spreads d uniformly over [0.8 d, 1.2 d) for r in [0, 1).
func jitter(d time.Duration, r float64) time.Duration {
	r = min(max(r, 0), 1)
	return time.Duration(math.Round(float64(d) * (1 + 0.2*(2*r-1))))
}

// accounts returns the valid, sorted, distinct account keys.
func (a *Agent) accounts() []string {
	if a.cfg.Accounts == nil {
		return nil
	}
	var out []string
	for _, k := range a.cfg.Accounts() {
		if !account.IsKey(k) {
			a.log.Warn("not registering an invalid account key; want acct_ followed by 16 lowercase hex digits")
			continue
		}
		out = append(out, k)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// session runs one stream. established reports that the hello was sent
// and the control plane answered.
func (a *Agent) session(ctx context.Context) (established bool, err error) {
	// The stream outlives ctx so the goodbye can be sent after ctx ends.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stream, err := a.client.Connect(sctx)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	hello := &controlplanev1.AgentHello{
		AgentId:           a.cfg.ID,
		Host:              a.cfg.Host,
		Version:           a.cfg.Version,
		CapabilityVersion: int32(CapabilityVersion),
		Accounts:          a.accounts(),
	}
	recvDone := make(chan error, 1) // buffered: recvLoop never blocks on exit
	got := make(chan struct{})      // closed on the first message received
	go a.recvLoop(stream, recvDone, got)
	// Whatever happens, the receive loop has exited when session returns.
	recvErr := func() error { cancel(); return <-recvDone }
	if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: hello}}); err != nil {
		return false, sendErr(recvErr(), err)
	}
	if a.cfg.OnConnect != nil {
		a.cfg.OnConnect()
	}
	if err := a.sendReports(stream); err != nil { // reports queued while disconnected
		return false, sendErr(recvErr(), err)
	}
	tick := time.NewTicker(a.cfg.Heartbeat)
	defer tick.Stop()
	for {
		select {
		case <-got:
			established, got = true, nil
		case err := <-recvDone:
			return established, err
		case <-tick.C:
			hb := &controlplanev1.AgentHeartbeat{Accounts: a.accounts()}
			if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Heartbeat{Heartbeat: hb}}); err != nil {
				return established, sendErr(recvErr(), err)
			}
		case <-a.kick:
			if err := a.sendReports(stream); err != nil {
				return established, sendErr(recvErr(), err)
			}
		case <-ctx.Done():
			a.goodbye(ctx, stream, recvDone, cancel)
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

// goodbye deregisters: it sends the goodbye, half-closes and waits up to
// GoodbyeTimeout for the control plane to end the stream; then it cancels
// the stream and waits for the receive loop.
func (a *Agent) goodbye(ctx context.Context, stream grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse], recvDone <-chan error, cancel context.CancelFunc) {
	a.sendReports(stream) //nolint:errcheck // best effort: the goodbye follows
	bye := &controlplanev1.AgentGoodbye{Reason: "data plane stopping"}
	if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Goodbye{Goodbye: bye}}); err == nil {
		_ = stream.CloseSend()
	}
	t := time.NewTimer(GoodbyeTimeout)
	defer t.Stop()
	select {
	case err := <-recvDone:
		if err != nil {
			a.log.WarnContext(context.WithoutCancel(ctx), "the agent stream failed after the goodbye", "err", err)
			return
		}
		a.log.InfoContext(context.WithoutCancel(ctx), "deregistered from the control plane")
	case <-t.C:
		a.log.WarnContext(context.WithoutCancel(ctx), "the control plane did not end the stream after the goodbye", "timeout", GoodbyeTimeout)
		cancel()
		if err := <-recvDone; err != nil && status.Code(err) != codes.Canceled {
			a.log.WarnContext(context.WithoutCancel(ctx), "the agent stream failed after the goodbye", "err", err)
		}
	}
}

// sendReports sends every queued 403 report, then the queued rate limits.
func (a *Agent) sendReports(stream grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]) error {
	if err := a.send403s(stream); err != nil {
		return err
	}
	return a.sendLimits(stream)
}

// sendLimits sends the queued rate limits; an unsent one goes back to the
// queue unless a newer one replaced it.
func (a *Agent) sendLimits(stream grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]) error {
	a.mu.Lock()
	queued := a.limits
	if len(queued) == 0 {
		a.mu.Unlock()
		return nil
	}
	a.limits = map[string]*controlplanev1.RateLimits{}
	a.mu.Unlock()
	keys := make([]string, 0, len(queued))
	for k := range queued {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_RateLimits{RateLimits: queued[k]}}); err != nil {
			a.mu.Lock()
			for _, k := range keys[i:] {
				if _, newer := a.limits[k]; !newer {
					a.limits[k] = queued[k]
				}
			}
			a.mu.Unlock()
			return err
		}
	}
	return nil
}

// send403s sends every queued 403 report.
func (a *Agent) send403s(stream grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]) error {
	a.mu.Lock()
	queued := a.reports
	if len(queued) == 0 {
		a.mu.Unlock()
		return nil
	}
	a.reports = map[string]report{}
	a.mu.Unlock()
	keys := make([]string, 0, len(queued))
	for k := range queued {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		r := queued[k]
		msg := &controlplanev1.Upstream403{Account: k, AtUnixMs: r.first.UnixMilli(), Count: int32(min(r.count, math.MaxInt32)),
			RetryAfterMs: r.retryAfter.Milliseconds()}
		if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Upstream_403{Upstream_403: msg}}); err != nil {
			a.requeue(keys[i:], queued)
			return err
		}
	}
	return nil
}

// requeue puts unsent reports back, merged with any queued since.
func (a *Agent) requeue(keys []string, queued map[string]report) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, k := range keys {
		r, cur := queued[k], a.reports[k]
		if cur.count > 0 && cur.first.Before(r.first) {
			r.first = cur.first
		}
		r.count += cur.count
		r.retryAfter = max(r.retryAfter, cur.retryAfter)
		a.reports[k] = r
	}
}

// recvLoop receives until the stream ends and sends the error (nil for a
// clean end) on done. It is owned by session, which waits for it.
func (a *Agent) recvLoop(stream grpc.BidiStreamingClient[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse], done chan<- error, got chan<- struct{}) {
	first := true
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
			a.applyPolicy(m.Policy)
		case *controlplanev1.ConnectResponse_Close:
			a.mu.Lock()
			a.reason = m.Close.GetReason()
			a.mu.Unlock()
			a.log.Info("the control plane is closing the agent stream", "reason", m.Close.GetReason())
		}
	}
}

// applyPolicy records a push's live count and hands its policy to OnPolicy.
func (a *Agent) applyPolicy(p *controlplanev1.PolicyPush) {
	key := p.GetAccount()
	if !account.IsKey(key) {
		a.log.Warn("ignoring a policy push for an invalid account key")
		return
	}
	live := max(int(p.GetLiveAgents()), 1)
	now := a.cfg.Clock()
	a.mu.Lock()
	l := a.live[key]
	if l == nil {
		l = &liveCount{}
		a.live[key] = l
	}
	l.set(live, now)
	a.mu.Unlock()
	pol, err := toPolicy(p)
	if err != nil {
		a.log.Warn("ignoring an invalid policy push", "account", key, "err", err)
		return
	}
	if a.cfg.OnPolicy != nil {
		a.cfg.OnPolicy(key, pol, live)
	}
	if a.cfg.OnPause != nil {
		var until time.Time
		if ms := p.GetPausedUntilUnixMs(); ms > 0 {
			until = time.UnixMilli(ms)
		}
		a.cfg.OnPause(key, until)
	}
}

// toPolicy converts a push into the policy to pace at: the effective rate,
// the burst, and the budget with its wait bound derived locally.
func toPolicy(p *controlplanev1.PolicyPush) (pacing.Policy, error) {
	idle := time.Duration(p.GetIdleTimeoutMs()) * time.Millisecond
	total := time.Duration(p.GetTotalTimeoutMs()) * time.Millisecond
	retries := int(p.GetMaxRetries())
	b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	pol := pacing.Policy{RatePerMinute: int(p.GetEffectiveRatePerMinute()), Burst: int(p.GetBurst()), Budget: b}
	if err := pol.Validate(); err != nil {
		return pacing.Policy{}, err
	}
	return pol, nil
}
