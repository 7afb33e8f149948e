package controlplane

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// CapabilityVersion is the highest protocol version this control plane
// implements. The numbers and their history are
// controlplanev1.CapabilityVersion (proto/clodex/controlplane/v1/agent.proto).
const CapabilityVersion = int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_BROKER)

const (
	// AgentLiveWindow is how long an agent counts as live after its last
	// hello or heartbeat (while its stream is open).
	AgentLiveWindow = 15 * time.Second
	// maxAgentIDLen bounds agent ids.
	maxAgentIDLen = 128
	// maxAgentAccounts bounds the accounts one agent may register.
	maxAgentAccounts = 1000
	// maxAgentField bounds host and version.
	maxAgentField = 256
)

// Close reasons sent to agents.
const (
	reasonExpired  = "no heartbeat for 15s"
	reasonReplaced = "replaced by a newer stream with the same agent id"
)

// agentConn is one connected agent. Fields above mu are immutable.
type agentConn struct {
	id, host, version string
	credential        string // the agent credential its token names
	stream            string // a nonce of this stream (store.AgentStream)
	capability        int
	connected         time.Time
	wake              chan struct{} // size 1: there is something to send

	// Guarded by registry.mu:
	accounts []string        // sorted, distinct
	lastSeen time.Time       // last hello or heartbeat
	dirty    map[string]bool // accounts whose policy must be (re)pushed
	closed   string          // the close reason; "" while open
}

func (c *agentConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// registry tracks the connected agents.
type registry struct {
	now func() time.Time

	mu      sync.Mutex // guards the following fields and every agentConn's guarded fields
	agents  map[string]*agentConn
	closing string // set by closeAll: no new agents
}

func newRegistry(now func() time.Time) *registry {
	return &registry{now: now, agents: map[string]*agentConn{}}
}

func (c *agentConn) liveLocked(now time.Time) bool {
	return c.closed == "" && now.Sub(c.lastSeen) < AgentLiveWindow
}

// liveCountLocked counts the live agents serving key.
func (r *registry) liveCountLocked(key string, now time.Time) int {
	n := 0
	for _, c := range r.agents {
		if c.liveLocked(now) {
			if _, ok := slices.BinarySearch(c.accounts, key); ok {
				n++
			}
		}
	}
	return n
}

// markLocked marks keys dirty on every open agent serving any of them.
func (r *registry) markLocked(keys []string) {
	if len(keys) == 0 {
		return
	}
	for _, c := range r.agents {
		if c.closed != "" {
			continue
		}
		marked := false
		for _, k := range keys {
			if _, ok := slices.BinarySearch(c.accounts, k); ok {
				c.dirty[k] = true
				marked = true
			}
		}
		if marked {
			c.signal()
		}
	}
}

// add registers c, replacing (and closing) an agent with the same id, and
// marks its accounts for every agent that serves them. After closeAll it
// registers nothing and returns the close reason.
func (r *registry) add(c *agentConn) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing != "" {
		return r.closing
	}
	affected := slices.Clone(c.accounts)
	if old := r.agents[c.id]; old != nil {
		old.closed = reasonReplaced
		old.signal()
		affected = append(affected, old.accounts...)
	}
	for _, k := range c.accounts {
		c.dirty[k] = true
	}
	r.agents[c.id] = c
	slices.Sort(affected)
	r.markLocked(slices.Compact(affected))
	c.signal()
	return ""
}

// remove deregisters c (if still registered) and re-pushes its accounts'
// live counts to the others.
func (r *registry) remove(c *agentConn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.agents[c.id] != c {
		return
	}
	delete(r.agents, c.id)
	r.markLocked(c.accounts)
}

// heartbeat records a heartbeat at now and the agent's current accounts.
func (r *registry) heartbeat(c *agentConn, accounts []string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	wasLive := c.liveLocked(now)
	c.lastSeen = now
	if slices.Equal(accounts, c.accounts) && wasLive {
		return
	}
	affected := append(slices.Clone(c.accounts), accounts...)
	slices.Sort(affected)
	affected = slices.Compact(affected)
	for _, k := range accounts {
		c.dirty[k] = true
	}
	c.accounts = accounts
	r.markLocked(affected)
	c.signal()
}

// reap closes the agents whose last heartbeat is AgentLiveWindow old.
func (r *registry) reap(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, c := range r.agents {
		if c.closed == "" && !c.liveLocked(now) {
			c.closed = reasonExpired
			c.signal()
			delete(r.agents, id)
			r.markLocked(c.accounts)
		}
	}
}

// served returns the accounts the open agents serve, sorted, with this
// registry's live count of each.
func (r *registry) served(now time.Time) (keys []string, live []int) {
	r.mu.Lock()
	counts := map[string]int{}
	for _, c := range r.agents {
		if c.closed != "" {
			continue
		}
		isLive := c.liveLocked(now)
		for _, k := range c.accounts {
			if isLive {
				counts[k]++
			} else if _, ok := counts[k]; !ok {
				counts[k] = 0
			}
		}
	}
	r.mu.Unlock()
	keys = make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	live = make([]int, len(keys))
	for i, k := range keys {
		live[i] = counts[k]
	}
	return keys, live
}

// closeAll closes every agent stream with reason.
func (r *registry) closeAll(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closing = reason
	for _, c := range r.agents {
		if c.closed == "" {
			c.closed = reason
		}
		c.signal()
	}
}

// push marks key dirty on every agent serving it.
func (r *registry) push(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.markLocked([]string{key})
}

// pushAll marks every account of every open agent dirty.
func (r *registry) pushAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.agents {
		if c.closed != "" {
			continue
		}
		for _, k := range c.accounts {
			c.dirty[k] = true
		}
		c.signal()
	}
}

// take returns c's dirty accounts with this registry's live counts, and
// its close reason.
func (r *registry) take(c *agentConn) (keys []string, live []int, closed string) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range c.dirty {
		keys = append(keys, k)
	}
	clear(c.dirty)
	slices.Sort(keys)
	for _, k := range keys {
		live = append(live, r.liveCountLocked(k, now))
	}
	return keys, live, c.closed
}

// len returns the number of registered agents.
func (r *registry) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.agents)
}

// list returns every registered agent, ordered by id.
func (r *registry) list() []*controlplanev1.Agent {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*controlplanev1.Agent, 0, len(r.agents))
	for _, c := range r.agents {
		out = append(out, &controlplanev1.Agent{
			Id:                c.id,
			Host:              c.host,
			Version:           c.version,
			CapabilityVersion: int32(c.capability),
			Accounts:          slices.Clone(c.accounts),
			LastSeenUnixMs:    c.lastSeen.UnixMilli(),
			ConnectedUnixMs:   c.connected.UnixMilli(),
			Live:              c.liveLocked(now),
		})
	}
	slices.SortFunc(out, func(a, b *controlplanev1.Agent) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return out
}

// validAgentString checks a free-form display field.
func validAgentString(field, v string) error {
	if len(v) > maxAgentField {
		return invalidf("%s is %d bytes; allowed 0..%d", field, len(v), maxAgentField)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return invalidf("%s has a byte 0x%02x at %d; allowed printable ASCII", field, c, i)
		}
	}
	return nil
}

// validAccounts checks and sorts an agent's account keys.
func validAccounts(keys []string) ([]string, error) {
	if len(keys) > maxAgentAccounts {
		return nil, invalidf("accounts lists %d keys; allowed at most %d", len(keys), maxAgentAccounts)
	}
	for i, k := range keys {
		if !account.IsKey(k) {
			return nil, invalidf("accounts[%d] %q is not an account key; want acct_ followed by 16 lowercase hex digits", i, k)
		}
	}
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// validHello checks a hello and returns its sorted accounts.
func validHello(h *controlplanev1.AgentHello) ([]string, error) {
	id := h.GetAgentId()
	switch {
	case id == "":
		return nil, invalidf("hello: agent_id is empty; want 1..%d printable ASCII bytes without spaces (host-pid-random)", maxAgentIDLen)
	case len(id) > maxAgentIDLen:
		return nil, invalidf("hello: agent_id is %d bytes; allowed 1..%d", len(id), maxAgentIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return nil, invalidf("hello: agent_id has a byte 0x%02x at %d; allowed printable ASCII without spaces", c, i)
		}
	}
	if err := errors.Join(validAgentString("hello: host", h.GetHost()), validAgentString("hello: version", h.GetVersion())); err != nil {
		return nil, invalidf("%v", err)
	}
	if cv := h.GetCapabilityVersion(); cv < 1 {
		return nil, invalidf("hello: capability_version %d is invalid; allowed 1..%d (this control plane implements %d)", cv, CapabilityVersion, CapabilityVersion)
	}
	accts, err := validAccounts(h.GetAccounts())
	if err != nil {
		return nil, invalidf("hello: %v", err)
	}
	return accts, nil
}

type agentService struct {
	controlplanev1.UnimplementedAgentServiceServer
	s *Server
}

type agentStream = grpc.BidiStreamingServer[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]

// Connect registers the agent from its hello, then pushes its accounts'
// policies whenever they (or their live counts) change, until the agent
// says goodbye, its stream fails, its heartbeats stop or the server shuts
// down (AgentClose with the reason, then Unavailable).
func (a *agentService) Connect(stream agentStream) error {
	s := a.s
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return s.toStatus(ctx, "Connect", invalidf("the first message must be a hello; got %T", first.GetMsg()))
	}
	accts, err := validHello(hello)
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	if err := s.checkScopes(ctx, "Connect", accts); err != nil {
		return err
	}
	cred := s.auth.credential(ctx)
	if err := s.accounts.register(cred, accts, s.now()); err != nil {
		s.denied.record(ctx, controlplanev1.AgentService_Connect_FullMethodName, DenyAccountCap)
		return status.Error(codes.ResourceExhausted, "hello: "+err.Error())
	}
	// A newer agent is served as the newest version this server knows.
	capability := min(int(hello.GetCapabilityVersion()), CapabilityVersion)
	now := s.now()
	c := &agentConn{
		id: hello.GetAgentId(), host: hello.GetHost(), version: hello.GetVersion(), credential: cred,
		stream: rand.Text(), capability: capability, connected: now, wake: make(chan struct{}, 1),
		accounts: accts, lastSeen: now, dirty: map[string]bool{},
	}
	// Registered in the store before the first push, so the counts it
	// carries include this agent on every replica.
	s.touchAgent(ctx, c, accts, now)
	if reason := s.agents.add(c); reason != "" {
		_ = stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Close{Close: &controlplanev1.AgentClose{Reason: reason}}})
		s.dropAgent(ctx, c, accts)
		s.leaveRoster(ctx, c)
		return status.Error(codes.Unavailable, reason)
	}
	defer func() {
		s.dropAgent(ctx, c, c.accountsNow(s.agents))
		s.leaveRoster(ctx, c)
		s.agents.remove(c)
	}()
	s.log.InfoContext(ctx, "agent connected", "agent_id", c.id, "host", c.host, "version", c.version,
		"capability_version", capability, "accounts", len(accts))

	recvDone := make(chan error, 1) // buffered: recvLoop never blocks on exit
	s.streams.Add(1)
	go a.recvLoop(ctx, stream, c, recvDone)

	for {
		select {
		case err := <-recvDone:
			if err == nil {
				s.log.InfoContext(ctx, "agent said goodbye", "agent_id", c.id)
			}
			return err
		case <-c.wake:
			if err := a.flush(ctx, stream, c); err != nil {
				return err
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// flush sends c's pending pushes, or its close.
func (a *agentService) flush(ctx context.Context, stream agentStream, c *agentConn) error {
	s := a.s
	keys, live, closed := s.agents.take(c)
	if closed != "" {
		_ = stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Close{Close: &controlplanev1.AgentClose{Reason: closed}}})
		s.log.InfoContext(ctx, "closing agent stream", "agent_id", c.id, "reason", closed)
		return status.Error(codes.Unavailable, closed)
	}
	live = s.liveCounts(ctx, keys, live)
	for i, k := range keys {
		push, err := s.policyPush(ctx, k, live[i])
		if err != nil {
			return s.toStatus(ctx, "Connect", err)
		}
		if err := stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Policy{Policy: push}}); err != nil {
			return err
		}
	}
	return nil
}

// policyPush builds key's push: its stored account, or the default policy
// for an account the store does not know yet.
func (s *Server) policyPush(ctx context.Context, key string, live int) (*controlplanev1.PolicyPush, error) {
	acct, err := s.opts.Policies.Account(ctx, key, s.now())
	if errors.Is(err, store.ErrNotFound) {
		d := s.opts.Policies.Defaults()
		acct, err = store.Account{Key: key, Policy: d, EffectiveRate: d.RatePerMinute}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy push: %w", err)
	}
	p := acct.Policy
	return &controlplanev1.PolicyPush{
		Account:                key,
		RatePerMinute:          int32(p.RatePerMinute),
		EffectiveRatePerMinute: int32(acct.EffectiveRate),
		Burst:                  int32(p.Burst),
		IdleTimeoutMs:          p.Budget.IdleTimeout.Milliseconds(),
		TotalTimeoutMs:         p.Budget.TotalTimeout.Milliseconds(),
		MaxRetries:             int32(p.Budget.MaxRetries),
		WaitBoundMs:            p.Budget.WaitBound.Milliseconds(),
		PolicyVersion:          acct.PolicyVersion,
		LiveAgents:             int32(live),
		Adaptive:               acct.Adaptive,
		PausedUntilUnixMs:      unixMs(acct.PausedUntil),
	}, nil
}

// recvLoop handles the agent's messages until the stream ends; it sends
// nil on done after a goodbye, else the error. Its owner is the server
// (s.streams): it exits when Connect returns, which ends the stream.
func (a *agentService) recvLoop(ctx context.Context, stream agentStream, c *agentConn, done chan<- error) {
	s := a.s
	defer s.streams.Done()
	for {
		msg, err := stream.Recv()
		if err != nil {
			done <- err
			return
		}
		switch m := msg.GetMsg().(type) {
		case *controlplanev1.ConnectRequest_Heartbeat:
			accts, err := validAccounts(m.Heartbeat.GetAccounts())
			if err != nil {
				done <- s.toStatus(ctx, "Connect", invalidf("heartbeat: %v", err))
				return
			}
			if err := s.checkScopes(ctx, "Connect", accts); err != nil {
				done <- err
				return
			}
			// The directory first, so the pushes the registry triggers
			// count the change.
			now := s.now()
			if err := s.accounts.register(c.credential, accts, now); err != nil {
				s.denied.record(ctx, controlplanev1.AgentService_Connect_FullMethodName, DenyAccountCap)
				done <- status.Error(codes.ResourceExhausted, "heartbeat: "+err.Error())
				return
			}
			s.touchAgent(ctx, c, accts, now)
			s.dropAgent(ctx, c, missing(c.accountsNow(s.agents), accts))
			s.agents.heartbeat(c, accts, now)
		case *controlplanev1.ConnectRequest_Upstream_403:
			if err := s.upstream403(ctx, c, m.Upstream_403); err != nil {
				done <- err
				return
			}
		case *controlplanev1.ConnectRequest_RateLimits:
			if err := s.rateLimits(ctx, c, m.RateLimits); err != nil {
				done <- err
				return
			}
		case *controlplanev1.ConnectRequest_Goodbye:
			done <- nil
			return
		case *controlplanev1.ConnectRequest_Hello:
			done <- s.toStatus(ctx, "Connect", invalidf("a second hello on one stream; send heartbeats to change the accounts"))
			return
		default:
			done <- s.toStatus(ctx, "Connect", invalidf("unknown agent message %T; this control plane implements capability version %d", msg.GetMsg(), CapabilityVersion))
			return
		}
	}
}

// QuotaNotice is the share of a window at which the control plane logs,
// once per crossing, that an account is about to reach its limit.
const QuotaNotice = 90.0

// maxQuotaWindows bounds the windows of one RateLimits report.
const maxQuotaWindows = 8

// validRateLimits checks a RateLimits report and converts it.
func validRateLimits(agentID string, r *controlplanev1.RateLimits) (store.Quota, error) {
	key := r.GetAccount()
	if !account.IsKey(key) {
		return store.Quota{}, invalidf("rate_limits: account %q is not an account key; want acct_ followed by 16 lowercase hex digits", key)
	}
	if err := printable("rate_limits.plan_type", r.GetPlanType(), 0, 64); err != nil {
		return store.Quota{}, err
	}
	if n := len(r.GetWindows()); n > maxQuotaWindows {
		return store.Quota{}, invalidf("rate_limits lists %d windows; allowed 0..%d", n, maxQuotaWindows)
	}
	q := store.Quota{Key: key, PlanType: r.GetPlanType(), LimitReached: r.GetLimitReached(), AgentID: agentID,
		ReportedAt: time.UnixMilli(max(r.GetAtUnixMs(), 0)).UTC()}
	for i, w := range r.GetWindows() {
		if err := printable(fmt.Sprintf("rate_limits.windows[%d].name", i), w.GetName(), 1, 32); err != nil {
			return store.Quota{}, err
		}
		if slices.ContainsFunc(q.Windows, func(o store.QuotaWindow) bool { return o.Name == w.GetName() }) {
			return store.Quota{}, invalidf("rate_limits.windows[%d].name %q is listed twice; report each window once", i, w.GetName())
		}
		if u := w.GetUsedPercent(); !(u >= 0 && u <= 1000) {
			return store.Quota{}, invalidf("rate_limits.windows[%d].used_percent %v is out of range; allowed 0..1000", i, u)
		}
		if m := w.GetWindowMinutes(); m < 0 || m > 366*24*60 {
			return store.Quota{}, invalidf("rate_limits.windows[%d].window_minutes %d is out of range; allowed 0..527040", i, m)
		}
		if ms := w.GetResetsAtUnixMs(); ms < 0 {
			return store.Quota{}, invalidf("rate_limits.windows[%d].resets_at_unix_ms %d is negative; want 0 (unknown) or Unix milliseconds", i, ms)
		}
		qw := store.QuotaWindow{Name: w.GetName(), UsedPercent: w.GetUsedPercent(), Window: time.Duration(w.GetWindowMinutes()) * time.Minute}
		if ms := w.GetResetsAtUnixMs(); ms > 0 {
			qw.ResetsAt = time.UnixMilli(ms).UTC()
		}
		q.Windows = append(q.Windows, qw)
	}
	return q, nil
}

// printable checks a field holds lo..hi printable ASCII bytes.
func printable(field, v string, lo, hi int) error {
	if len(v) < lo || len(v) > hi {
		return invalidf("%s is %d bytes; allowed %d..%d printable ASCII bytes", field, len(v), lo, hi)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return invalidf("%s has a byte 0x%02x at %d; allowed printable ASCII", field, c, i)
		}
	}
	return nil
}

// rateLimits records an agent's report of an account's plan usage, sets
// the gauges, and logs once when a window passes QuotaNotice percent.
func (s *Server) rateLimits(ctx context.Context, c *agentConn, r *controlplanev1.RateLimits) error {
	q, err := validRateLimits(c.id, r)
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	qs, ok := s.opts.Policies.(QuotaStore)
	if !ok {
		return nil
	}
	prev, next, err := qs.PutQuota(ctx, q)
	if err != nil {
		s.log.WarnContext(ctx, "plan usage report not recorded", "account", q.Key, "agent_id", c.id, "err", err)
		return nil
	}
	s.metrics.quota(q.Key, next.Windows)
	for _, w := range q.Windows {
		if w.UsedPercent < QuotaNotice {
			continue
		}
		i := slices.IndexFunc(prev.Windows, func(o store.QuotaWindow) bool { return o.Name == w.Name })
		if i >= 0 && prev.Windows[i].UsedPercent >= QuotaNotice && sameReset(prev.Windows[i].ResetsAt, w.ResetsAt) {
			continue // already above in this window
		}
		if i >= 0 && prev.Windows[i].ReportedAt.After(q.ReportedAt) {
			continue // an older report
		}
		args := []any{"account", q.Key, "window", w.Name, "used_percent", w.UsedPercent,
			"window_length", w.Window, "plan_type", q.PlanType, "agent_id", c.id}
		if !w.ResetsAt.IsZero() {
			args = append(args, "resets_at", w.ResetsAt.Format(time.RFC3339))
		}
		s.log.WarnContext(ctx, fmt.Sprintf("account passed %.0f%% of its plan's %s usage window", QuotaNotice, w.Name), args...)
	}
	return nil
}

// sameReset reports whether two reset instants are one window's: within a
// minute (a reset computed from reset_after_seconds moves with the clock).
func sameReset(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Minute && d < time.Minute
}

// maxPause bounds the retry-after a 403 report may pause an account for.
const maxPause = time.Hour

// unixMs is t in Unix milliseconds, 0 for the zero time.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// upstream403 applies an agent's 403 report to the account's adaptive
// state and pushes a changed effective rate.
func (s *Server) upstream403(ctx context.Context, c *agentConn, r *controlplanev1.Upstream403) error {
	key := r.GetAccount()
	if !account.IsKey(key) {
		return s.toStatus(ctx, "Connect", invalidf("upstream_403: account %q is not an account key; want acct_ followed by 16 lowercase hex digits", key))
	}
	if err := s.checkScope(ctx, "Connect", key); err != nil {
		return err
	}
	n := max(int(r.GetCount()), 1)
	s.metrics.reported403(key, n)
	retryAfter := time.Duration(max(r.GetRetryAfterMs(), 0)) * time.Millisecond
	acct, changed, err := s.opts.Policies.Report403(ctx, key, s.now(), min(retryAfter, maxPause))
	if errors.Is(err, store.ErrNotFound) {
		return nil // no bucket yet, so nothing adaptive to lower
	}
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	if changed {
		args := []any{"account", key, "agent_id", c.id, "count", n,
			"effective_rate_per_minute", acct.EffectiveRate, "rate_per_minute", acct.Policy.RatePerMinute}
		if !acct.PausedUntil.IsZero() {
			args = append(args, "paused_until", acct.PausedUntil.UTC().Format(time.RFC3339), "retry_after", retryAfter)
		}
		s.log.InfoContext(ctx, "learned the upgrade throttle from an upstream 403: pausing new sockets and lowering the rate", args...)
		s.agents.push(key)
	}
	return nil
}

// fleetLoop applies adaptive raises and expires silent agents every
// Options.FleetTick until ctx ends, then closes stopped. Its owner is Serve.
func (s *Server) fleetLoop(ctx context.Context, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTicker(s.opts.FleetTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.fleetTick(ctx)
		}
	}
}

// fleetTick runs one round of fleetLoop.
func (s *Server) fleetTick(ctx context.Context) {
	now := s.now()
	s.denied.flush(ctx)
	if s.opts.AgentCreds != nil {
		rctx, cancel := context.WithTimeout(ctx, scopeReloadTimeout)
		if err := s.reloadScopes(rctx); err != nil {
			s.log.DebugContext(ctx, "reload agent credentials", "err", err)
		}
		cancel()
	}
	s.agents.reap(now)
	// Open streams keep their accounts registered; the rest lapse.
	s.agents.eachOpen(func(c *agentConn, accounts []string) { _ = s.accounts.register(c.credential, accounts, now) })
	s.accounts.sweep(now)
	s.recount(ctx, now)
	s.reportStoreHealth()
	changed, err := s.opts.Policies.Adapt(ctx, now)
	if err != nil {
		s.log.ErrorContext(ctx, "adaptive rates", "err", err)
		return
	}
	for _, a := range changed {
		s.log.InfoContext(ctx, "adaptive rate raised", "account", a.Key, "effective_rate_per_minute", a.EffectiveRate,
			"rate_per_minute", a.Policy.RatePerMinute)
		s.agents.push(a.Key)
	}
}

// missing returns the keys of prev (sorted) that cur (sorted) lacks.
func missing(prev, cur []string) []string {
	var out []string
	for _, k := range prev {
		if _, ok := slices.BinarySearch(cur, k); !ok {
			out = append(out, k)
		}
	}
	return out
}

// accountsNow returns c's current accounts.
// eachOpen calls fn with every open agent and a copy of its accounts,
// outside the registry's lock.
func (r *registry) eachOpen(fn func(c *agentConn, accounts []string)) {
	type open struct {
		c        *agentConn
		accounts []string
	}
	r.mu.Lock()
	var all []open
	for _, c := range r.agents {
		if c.closed == "" {
			all = append(all, open{c, slices.Clone(c.accounts)})
		}
	}
	r.mu.Unlock()
	for _, o := range all {
		fn(o.c, o.accounts)
	}
}

func (c *agentConn) accountsNow(r *registry) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(c.accounts)
}

// agentDirTimeout bounds a directory write made after the agent's stream
// ended (its context is done by then).
const agentDirTimeout = time.Second

// touchAgent registers c's stream in the store's agent directory as live
// for AgentLiveWindow from now, for every replica to count. A failure
// (the shared store is unreachable) is logged at debug level: the next
// heartbeat touches again, and pushes fall back to the last counts.
func (s *Server) touchAgent(ctx context.Context, c *agentConn, keys []string, now time.Time) {
	s.putRoster(ctx, c, keys, now)
	if s.dir == nil || len(keys) == 0 {
		return
	}
	err := s.dir.TouchAgent(ctx, store.AgentStream{Agent: c.id, Stream: c.stream}, keys, now.Add(AgentLiveWindow))
	if err != nil {
		s.log.DebugContext(ctx, "register agent in the store", "agent_id", c.id, "err", err)
	}
}

// putRoster records c in the fleet's roster, for every replica to list.
// A failure is logged at debug level: the next heartbeat writes again.
func (s *Server) putRoster(ctx context.Context, c *agentConn, keys []string, now time.Time) {
	if s.roster == nil {
		return
	}
	err := s.roster.PutAgent(ctx, store.AgentStream{Agent: c.id, Stream: c.stream}, store.AgentInfo{
		ID: c.id, Host: c.host, Version: c.version, CapabilityVersion: c.capability,
		Accounts: slices.Clone(keys), ConnectedUnixMs: c.connected.UnixMilli(),
		LastSeenUnixMs: now.UnixMilli(), UntilUnixMs: now.Add(AgentLiveWindow).UnixMilli(),
	})
	if err != nil {
		s.log.DebugContext(ctx, "record agent in the roster", "agent_id", c.id, "err", err)
	}
}

// leaveRoster removes c's stream from the fleet's roster (its stream
// ended), unless a newer stream of the agent has written it since.
func (s *Server) leaveRoster(ctx context.Context, c *agentConn) {
	if s.roster == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentDirTimeout)
	defer cancel()
	if err := s.roster.RemoveAgent(dctx, store.AgentStream{Agent: c.id, Stream: c.stream}); err != nil {
		s.log.DebugContext(ctx, "remove agent from the roster", "agent_id", c.id, "err", err)
	}
}

// fleetAgents is every agent of the fleet, ordered by id: this replica's
// own (whose state it knows first-hand) and the ones the roster holds for
// other replicas. When the roster cannot be read, this replica's own.
func (s *Server) fleetAgents(ctx context.Context) []*controlplanev1.Agent {
	own := s.agents.list()
	if s.roster == nil {
		return own
	}
	now := s.now()
	infos, err := s.roster.Agents(ctx, now)
	if err != nil {
		s.log.DebugContext(ctx, "list the fleet's agents", "err", err)
		return own
	}
	seen := make(map[string]bool, len(own))
	for _, a := range own {
		seen[a.GetId()] = true
	}
	out := own
	for _, in := range infos {
		if seen[in.ID] {
			continue
		}
		accts := slices.Clone(in.Accounts)
		slices.Sort(accts)
		out = append(out, &controlplanev1.Agent{
			Id: in.ID, Host: in.Host, Version: in.Version, CapabilityVersion: int32(in.CapabilityVersion),
			Accounts: accts, LastSeenUnixMs: in.LastSeenUnixMs, ConnectedUnixMs: in.ConnectedUnixMs,
			Live: now.Before(time.UnixMilli(in.UntilUnixMs)),
		})
	}
	slices.SortFunc(out, func(a, b *controlplanev1.Agent) int { return cmp.Compare(a.GetId(), b.GetId()) })
	return out
}

// dropAgent removes c's stream from the directory for keys (after its
// stream ended, or for accounts it no longer serves).
func (s *Server) dropAgent(ctx context.Context, c *agentConn, keys []string) {
	if s.dir == nil || len(keys) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentDirTimeout)
	defer cancel()
	if err := s.dir.DropAgent(dctx, store.AgentStream{Agent: c.id, Stream: c.stream}, keys); err != nil {
		s.log.DebugContext(ctx, "deregister agent in the store", "agent_id", c.id, "err", err)
	}
}

// liveCounts returns the fleet-wide live agents of each key, at least 1:
// the store directory's count (agents on every replica) and never below
// this replica's own count (local). When the directory cannot be read,
// the last count seen for the key stands in.
func (s *Server) liveCounts(ctx context.Context, keys []string, local []int) []int {
	out := make([]int, len(keys))
	var fleet []int
	if s.dir != nil && len(keys) > 0 {
		n, err := s.dir.LiveAgents(ctx, keys, s.now())
		if err != nil {
			s.log.DebugContext(ctx, "count live agents in the store", "err", err)
		} else {
			fleet = n
		}
	}
	s.liveMu.Lock()
	defer s.liveMu.Unlock()
	for i, k := range keys {
		n := local[i]
		switch {
		case fleet != nil:
			n = max(n, fleet[i])
			s.lastLive[k] = n
		default:
			n = max(n, s.lastLive[k])
		}
		out[i] = max(n, 1)
	}
	return out
}

// recount re-reads the fleet-wide live counts of the accounts this
// replica's agents serve and re-pushes those that changed: agents joining
// or leaving through other replicas, and the agents of a replica that
// died, whose liveness lapses in the store.
func (s *Server) recount(ctx context.Context, now time.Time) {
	if s.dir == nil {
		return
	}
	keys, local := s.agents.served(now)
	if len(keys) == 0 {
		s.liveMu.Lock()
		clear(s.lastLive)
		s.liveMu.Unlock()
		return
	}
	fleet, err := s.dir.LiveAgents(ctx, keys, now)
	if err != nil {
		return
	}
	var changed []string
	s.liveMu.Lock()
	for k := range s.lastLive {
		if _, ok := slices.BinarySearch(keys, k); !ok {
			delete(s.lastLive, k)
		}
	}
	for i, k := range keys {
		if n := max(fleet[i], local[i]); n != s.lastLive[k] {
			changed = append(changed, k)
		}
	}
	s.liveMu.Unlock()
	for _, k := range changed {
		s.agents.push(k)
	}
}
