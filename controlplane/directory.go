package controlplane

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// AgentLiveWindow is how long an agent counts as live after its last
// hello or heartbeat (while its stream is open).
const AgentLiveWindow = 15 * time.Second

// Close reasons sent to agents.
const (
	reasonExpired  = "no heartbeat for 15s"
	reasonReplaced = "replaced by a newer stream with the same agent id"
)

// agentDirTimeout bounds a directory write made after the agent's stream
// ended (its context is done by then).
const agentDirTimeout = time.Second

// AgentCounter records the live agents of every replica sharing a store,
// per account, so the live counts pushed to agents (the divisor of their
// local share) count the whole fleet. *store.Memory and *redisstore.Store
// implement it.
type AgentCounter interface {
	// TouchAgent records that stream s serves keys and counts as live
	// until until.
	TouchAgent(ctx context.Context, s store.AgentStream, keys []string, until time.Time) error
	// DropAgent forgets stream s for keys (not a newer stream of its
	// agent).
	DropAgent(ctx context.Context, s store.AgentStream, keys []string) error
	// LiveAgents counts, per key, the agents live at now.
	LiveAgents(ctx context.Context, keys []string, now time.Time) ([]int, error)
}

// AgentRoster holds every agent of a fleet of replicas sharing a store,
// with what ListAgents shows of it, so that any replica lists the whole
// fleet and not only the agents whose streams it holds.
// *redisstore.Store implements it.
type AgentRoster interface {
	PutAgent(ctx context.Context, s store.AgentStream, info store.AgentInfo) error
	RemoveAgent(ctx context.Context, s store.AgentStream) error
	Agents(ctx context.Context, now time.Time) ([]store.AgentInfo, error)
}

// agentConn is one connected agent. Fields above the guarded ones are
// immutable.
type agentConn struct {
	id, host, version string
	credential        string      // the agent credential its token names
	scope             *scopedCred // the scoped credential it connected with; nil for the fleet's tokens
	stream            string      // a nonce of this stream (store.AgentStream)
	capability        int
	takesMembers      bool // it gets the member pushes (Server.takesMembers)
	connected         time.Time
	wake              chan struct{} // size 1: there is something to send

	// Guarded by directory.mu:
	accounts []string                   // sorted, distinct
	lastSeen time.Time                  // last hello or heartbeat
	dirty    map[string]bool            // accounts whose policy must be (re)pushed
	members  bool                       // the member list must be (re)pushed
	closed   string                     // the close reason; "" while open
	closeErr error                      // the status the stream ends with once closed; nil: Unavailable with the reason
	acks     []*controlplanev1.UsageAck // usage acks to send (usage.go)

	// Only the stream's sending goroutine (flush) uses quotaSent: the
	// report time of each account's plan usage it last pushed
	// (quotaview.go).
	quotaSent map[string]time.Time
}

func (c *agentConn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *agentConn) liveLocked(now time.Time) bool {
	return c.closed == "" && now.Sub(c.lastSeen) < AgentLiveWindow
}

// streamID names c's stream in the store.
func (c *agentConn) streamID() store.AgentStream {
	return store.AgentStream{Agent: c.id, Stream: c.stream}
}

// directory is the agent directory: the agents whose streams this
// replica holds (their accounts, liveness and owed pushes), and, through
// the store, the agents of every replica sharing it: the live count of
// each account (counter) and the fleet's roster (roster).
type directory struct {
	now     func() time.Time
	log     *slog.Logger
	counter AgentCounter // nil: count this replica's agents only
	roster  AgentRoster  // nil: list this replica's agents only

	liveMu   sync.Mutex     // guards lastLive
	lastLive map[string]int // the last fleet-wide live count per account

	mu      sync.Mutex // guards the following fields and every agentConn's guarded fields
	agents  map[string]*agentConn
	closing string // set by closeAll: no new agents
}

func newDirectory(now func() time.Time, log *slog.Logger, counter AgentCounter, roster AgentRoster) *directory {
	return &directory{now: now, log: log, counter: counter, roster: roster,
		lastLive: map[string]int{}, agents: map[string]*agentConn{}}
}

// join records c in the store's directory and roster as live for
// AgentLiveWindow, then registers it, replacing (and closing) an agent
// with the same id. It returns the close reason when the directory is
// closed to new agents; the caller then leaves.
func (d *directory) join(ctx context.Context, c *agentConn) string {
	// Registered in the store before the first push, so the counts it
	// carries include this agent on every replica.
	d.touch(ctx, c, c.accounts, c.lastSeen)
	return d.add(c)
}

// beat records a heartbeat of c at now naming accounts: in the store
// first (so the pushes it triggers count the change), then here.
func (d *directory) beat(ctx context.Context, c *agentConn, accounts []string, now time.Time) {
	d.touch(ctx, c, accounts, now)
	d.drop(ctx, c, missing(d.accountsOf(c), accounts))
	d.heartbeat(c, accounts, now)
}

// leave removes c (its stream ended) from the store's directory and
// roster, then from this replica's agents, re-pushing its accounts' live
// counts to the others.
func (d *directory) leave(ctx context.Context, c *agentConn) {
	d.drop(ctx, c, d.accountsOf(c))
	d.leaveRoster(ctx, c)
	d.remove(c)
}

// liveCountLocked counts the live agents serving key.
func (d *directory) liveCountLocked(key string, now time.Time) int {
	n := 0
	for _, c := range d.agents {
		if c.liveLocked(now) {
			if _, ok := slices.BinarySearch(c.accounts, key); ok {
				n++
			}
		}
	}
	return n
}

// markLocked marks keys dirty on every open agent serving any of them.
func (d *directory) markLocked(keys []string) {
	if len(keys) == 0 {
		return
	}
	for _, c := range d.agents {
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
func (d *directory) add(c *agentConn) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closing != "" {
		return d.closing
	}
	affected := slices.Clone(c.accounts)
	if old := d.agents[c.id]; old != nil {
		old.closed = reasonReplaced
		old.signal()
		affected = append(affected, old.accounts...)
	}
	for _, k := range c.accounts {
		c.dirty[k] = true
	}
	d.agents[c.id] = c
	slices.Sort(affected)
	d.markLocked(slices.Compact(affected))
	c.signal()
	return ""
}

// remove deregisters c (if still registered) and re-pushes its accounts'
// live counts to the others.
func (d *directory) remove(c *agentConn) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.agents[c.id] != c {
		return
	}
	delete(d.agents, c.id)
	d.markLocked(c.accounts)
}

// heartbeat records a heartbeat at now and the agent's current accounts.
func (d *directory) heartbeat(c *agentConn, accounts []string, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
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
	d.markLocked(affected)
	c.signal()
}

// reap closes the agents whose last heartbeat is AgentLiveWindow old.
func (d *directory) reap(now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, c := range d.agents {
		if c.closed == "" && !c.liveLocked(now) {
			c.closed = reasonExpired
			c.signal()
			delete(d.agents, id)
			d.markLocked(c.accounts)
		}
	}
}

// served returns the accounts the open agents serve, sorted, with this
// replica's live count of each.
func (d *directory) served(now time.Time) (keys []string, live []int) {
	d.mu.Lock()
	counts := map[string]int{}
	for _, c := range d.agents {
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
	d.mu.Unlock()
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
func (d *directory) closeAll(reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closing = reason
	for _, c := range d.agents {
		if c.closed == "" {
			c.closed = reason
		}
		c.signal()
	}
}

// pushMembers marks the member list dirty on every open agent that takes
// it (agentConn.takesMembers).
func (d *directory) pushMembers() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.agents {
		if c.closed == "" && c.takesMembers {
			c.members = true
			c.signal()
		}
	}
}

// takeMembers reports whether c's member list must be pushed, and clears
// it.
func (d *directory) takeMembers(c *agentConn) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := c.members
	c.members = false
	return m
}

// push marks key dirty on every agent serving it.
func (d *directory) push(key string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.markLocked([]string{key})
}

// pushAll marks every account of every open agent dirty.
func (d *directory) pushAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.agents {
		if c.closed != "" {
			continue
		}
		for _, k := range c.accounts {
			c.dirty[k] = true
		}
		c.signal()
	}
}

// take returns c's dirty accounts with their fleet-wide live counts
// (liveCounts), and its close reason with the status its stream ends
// with.
func (d *directory) take(ctx context.Context, c *agentConn) (keys []string, live []int, closed string, closeErr error) {
	now := d.now()
	d.mu.Lock()
	for k := range c.dirty {
		keys = append(keys, k)
	}
	clear(c.dirty)
	slices.Sort(keys)
	for _, k := range keys {
		live = append(live, d.liveCountLocked(k, now))
	}
	closed, closeErr = c.closed, c.closeErr
	d.mu.Unlock()
	if closed != "" {
		if closeErr == nil {
			closeErr = status.Error(codes.Unavailable, closed)
		}
		return keys, live, closed, closeErr
	}
	return keys, d.liveCounts(ctx, keys, live), "", nil
}

// closedAgent is an agent closeWhere closed, and why.
type closedAgent struct {
	c      *agentConn
	reason string
}

// closeWhere closes every open agent for which why returns a reason,
// ending its stream with the status it returns, and re-pushes its
// accounts' live counts to the others. It returns the agents closed.
func (d *directory) closeWhere(why func(c *agentConn) (reason string, end error)) []closedAgent {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []closedAgent
	for id, c := range d.agents {
		if c.closed != "" {
			continue
		}
		reason, end := why(c)
		if reason == "" {
			continue
		}
		c.closed, c.closeErr = reason, end
		c.signal()
		delete(d.agents, id)
		d.markLocked(c.accounts)
		out = append(out, closedAgent{c, reason})
	}
	return out
}

// len returns the number of registered agents.
func (d *directory) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.agents)
}

// list returns every agent this replica holds, ordered by id.
func (d *directory) list() []*controlplanev1.Agent {
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*controlplanev1.Agent, 0, len(d.agents))
	for _, c := range d.agents {
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

// eachOpen calls fn with every open agent and a copy of its accounts,
// outside the directory's lock.
func (d *directory) eachOpen(fn func(c *agentConn, accounts []string)) {
	type open struct {
		c        *agentConn
		accounts []string
	}
	d.mu.Lock()
	var all []open
	for _, c := range d.agents {
		if c.closed == "" {
			all = append(all, open{c, slices.Clone(c.accounts)})
		}
	}
	d.mu.Unlock()
	for _, o := range all {
		fn(o.c, o.accounts)
	}
}

// accountsOf returns c's current accounts.
func (d *directory) accountsOf(c *agentConn) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(c.accounts)
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

// touch registers c's stream in the store's directory as live for
// AgentLiveWindow from now, for every replica to count, and records c in
// the fleet's roster. A failure (the shared store is unreachable) is
// logged at debug level: the next heartbeat touches again, and pushes
// fall back to the last counts.
func (d *directory) touch(ctx context.Context, c *agentConn, keys []string, now time.Time) {
	d.putRoster(ctx, c, keys, now)
	if d.counter == nil || len(keys) == 0 {
		return
	}
	err := d.counter.TouchAgent(ctx, c.streamID(), keys, now.Add(AgentLiveWindow))
	if err != nil {
		d.log.DebugContext(ctx, "register agent in the store", "agent_id", c.id, "err", err)
	}
}

// putRoster records c in the fleet's roster, for every replica to list.
// A failure is logged at debug level: the next heartbeat writes again.
func (d *directory) putRoster(ctx context.Context, c *agentConn, keys []string, now time.Time) {
	if d.roster == nil {
		return
	}
	err := d.roster.PutAgent(ctx, c.streamID(), store.AgentInfo{
		ID: c.id, Host: c.host, Version: c.version, CapabilityVersion: c.capability,
		Accounts: slices.Clone(keys), ConnectedUnixMs: c.connected.UnixMilli(),
		LastSeenUnixMs: now.UnixMilli(), UntilUnixMs: now.Add(AgentLiveWindow).UnixMilli(),
	})
	if err != nil {
		d.log.DebugContext(ctx, "record agent in the roster", "agent_id", c.id, "err", err)
	}
}

// leaveRoster removes c's stream from the fleet's roster (its stream
// ended), unless a newer stream of the agent has written it since.
func (d *directory) leaveRoster(ctx context.Context, c *agentConn) {
	if d.roster == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentDirTimeout)
	defer cancel()
	if err := d.roster.RemoveAgent(dctx, c.streamID()); err != nil {
		d.log.DebugContext(ctx, "remove agent from the roster", "agent_id", c.id, "err", err)
	}
}

// drop removes c's stream from the store's directory for keys (after its
// stream ended, or for accounts it no longer serves).
func (d *directory) drop(ctx context.Context, c *agentConn, keys []string) {
	if d.counter == nil || len(keys) == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), agentDirTimeout)
	defer cancel()
	if err := d.counter.DropAgent(dctx, c.streamID(), keys); err != nil {
		d.log.DebugContext(ctx, "deregister agent in the store", "agent_id", c.id, "err", err)
	}
}

// fleet is every agent of the fleet, ordered by id: this replica's own
// (whose state it knows first-hand) and the ones the roster holds for
// other replicas. When the roster cannot be read, this replica's own.
func (d *directory) fleet(ctx context.Context) []*controlplanev1.Agent {
	own := d.list()
	if d.roster == nil {
		return own
	}
	now := d.now()
	infos, err := d.roster.Agents(ctx, now)
	if err != nil {
		d.log.DebugContext(ctx, "list the fleet's agents", "err", err)
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

// servedInFleet reports whether the store's directory counts a live agent
// serving key at now (on any replica).
func (d *directory) servedInFleet(ctx context.Context, key string, now time.Time) bool {
	if d.counter == nil {
		return false
	}
	live, err := d.counter.LiveAgents(ctx, []string{key}, now)
	return err == nil && len(live) == 1 && live[0] > 0
}

// liveCounts returns the fleet-wide live agents of each key, at least 1:
// the store directory's count (agents on every replica) and never below
// this replica's own count (local). When the directory cannot be read,
// the last count seen for the key stands in.
func (d *directory) liveCounts(ctx context.Context, keys []string, local []int) []int {
	out := make([]int, len(keys))
	var fleet []int
	if d.counter != nil && len(keys) > 0 {
		n, err := d.counter.LiveAgents(ctx, keys, d.now())
		if err != nil {
			d.log.DebugContext(ctx, "count live agents in the store", "err", err)
		} else {
			fleet = n
		}
	}
	d.liveMu.Lock()
	defer d.liveMu.Unlock()
	for i, k := range keys {
		n := local[i]
		switch {
		case fleet != nil:
			n = max(n, fleet[i])
			d.lastLive[k] = n
		default:
			n = max(n, d.lastLive[k])
		}
		out[i] = max(n, 1)
	}
	return out
}

// recount re-reads the fleet-wide live counts of the accounts this
// replica's agents serve and re-pushes those that changed: agents joining
// or leaving through other replicas, and the agents of a replica that
// died, whose liveness lapses in the store.
func (d *directory) recount(ctx context.Context, now time.Time) {
	if d.counter == nil {
		return
	}
	keys, local := d.served(now)
	if len(keys) == 0 {
		d.liveMu.Lock()
		clear(d.lastLive)
		d.liveMu.Unlock()
		return
	}
	fleet, err := d.counter.LiveAgents(ctx, keys, now)
	if err != nil {
		return
	}
	var changed []string
	d.liveMu.Lock()
	for k := range d.lastLive {
		if _, ok := slices.BinarySearch(keys, k); !ok {
			delete(d.lastLive, k)
		}
	}
	for i, k := range keys {
		if n := max(fleet[i], local[i]); n != d.lastLive[k] {
			changed = append(changed, k)
		}
	}
	d.liveMu.Unlock()
	for _, k := range changed {
		d.push(k)
	}
}
