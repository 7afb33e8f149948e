package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/upstream"
)

// Generations of a socket.
const (
	// GenerationNursery is a head that has not been reused yet (idle TTL
	// NurseryIdleTTL). Parallel heads are nursery heads too.
	GenerationNursery = "nursery"
	// GenerationEstablished is a head reused at least once (idle TTL IdleTTL).
	GenerationEstablished = "established"
	// GenerationIsolated is an unpartitioned socket: never a head.
	GenerationIsolated = "isolated"
)

// Decisions of [Pool.Acquire] and [Lease.Replace].
const (
	// DecisionContinuation reuses an idle head: send PreviousResponseID and
	// items[Delta:].
	DecisionContinuation = "continuation"
	// DecisionParallelHead opens a new socket because the partition has a
	// request in flight and no idle head matches; it becomes a head for its
	// own conversation when its response completes.
	DecisionParallelHead = "parallel_head"
	// DecisionHistoryMismatch opens a new head: heads exist, none matches.
	DecisionHistoryMismatch = "history_mismatch_new_head"
	// DecisionNewPartition opens the partition's first head.
	DecisionNewPartition = "new_partition_head"
	// DecisionUnpartitioned opens a socket that never becomes a head.
	DecisionUnpartitioned = "unpartitioned_socket"
	// DecisionRotation replaces a matching head's socket that reached
	// RotateAge: a new socket with full context.
	DecisionRotation = "rotation"
	// DecisionReplacement is [Lease.Replace]: a new socket with full
	// context after a failure before any output, not paced.
	DecisionReplacement = "replacement"
)

// Miss reasons (metrics and [Stats.Misses]).
const (
	MissNoHead          = "no_head"
	MissHistoryMismatch = "history_mismatch"
	MissHeadBusy        = "head_busy"
	MissUnpartitioned   = "unpartitioned"
)

// Eviction reasons.
const (
	EvictHardTTL        = "hard_ttl"
	EvictIdleTTL        = "idle_ttl"
	EvictNurseryIdleTTL = "nursery_idle_ttl"
	EvictMaxSocketAge   = "max_socket_age"
	EvictNurseryCap     = "nursery_lru_cap"
	EvictEstablishedCap = "established_lru_cap"
	EvictDescriptorShed = "descriptor_shed"
	EvictCredentials    = "credentials_rejected"
	EvictPoolClosed     = "pool_closed"
	// Reasons an idle head is dropped the moment its socket says so
	// (watch.go), instead of being found dead by its next request.
	EvictPeerClosed       = "peer_closed"       // the backend sent a close frame
	EvictConnectionLost   = "connection_lost"   // the socket failed without a close frame
	EvictUnexpectedFrame  = "unexpected_frame"  // a data frame arrived with no request in flight
	EvictKeepaliveTimeout = "keepalive_timeout" // no pong within KeepaliveTimeout
)

// ReasonPoolClosed is the reason of the 1001 close frame [Pool.Close]
// sends on every idle socket.
const ReasonPoolClosed = "pool closed"

// ErrClosed is returned by [Pool.Acquire] after [Pool.Close].
var ErrClosed = errors.New("pool: closed")

// ErrReplaceSpent is returned by [Lease.Replace] on a lease that is itself
// a replacement: one replacement per request attempt.
var ErrReplaceSpent = errors.New("pool: replacement already used for this request")

// ErrLeaseDone is returned by [Lease.Replace] on a finished lease.
var ErrLeaseDone = errors.New("pool: lease already finished")

// Usage is the token usage of a completed response: InputTokens the whole
// input, cached tokens included.
type Usage struct {
	InputTokens  int64
	CachedTokens int64
	OutputTokens int64
}

// head is one pooled socket and the conversation it completes.
type head struct {
	id   uint64
	part *partition
	conn *upstream.Conn // nil while the socket is being dialled
	lost func(error)    // conn's watch (watch.go)
	gen  string

	created       time.Time     // when the current socket opened (physical age)
	ttlPaused     time.Duration // time in flight, excluded from the hard TTL
	inFlightSince time.Time
	lastUsed      time.Time
	busy          bool
	removed       bool // no longer registered: its lease closes the socket

	responseID string
	// tokens is the head's conversation in the backend's tokens: its last
	// response's input plus output, what a continuation finds cached.
	tokens int64
	// digests of requestInput ++ expectedAssistant; nInput is
	// len(requestInput); reasoning lists the indices (>= nInput) of the
	// assistant's reasoning items, for the omitted-reasoning match.
	digests   []digest
	nInput    int32
	reasoning []int32

	bornParallel bool
	reused       bool
	dead         bool // the idle socket's watch fired: it drops the head (watch.go)
	// kept: the socket was kept after a failed response (Lease.Release,
	// kept.go) and has completed none since; it has no conversation.
	kept bool

	// the keepalive of the idle socket (armLocked, keepalive), guarded by Pool.mu
	ping    *time.Timer
	pingSeq uint64         // bumped on every arm and disarm; a stale callback does nothing
	pings   sync.WaitGroup // keepalive callbacks armed or running; closers of the socket wait for them
}

// Partition identifies the heads a request may continue. Credentials are
// deliberately not part of it: an access-token refresh keeps the heads
// (call [Pool.DropAccount] when the backend rejects a socket's
// credentials). An empty Model or PromptCacheKey means unpartitioned: the
// request runs on a socket that never becomes a head.
type Partition struct {
	Account        string
	Model          string
	Effort         string
	PromptCacheKey string
}

func (p Partition) keyed() bool { return p.Model != "" && p.PromptCacheKey != "" }

// hash is the partition's diagnostic identity: the first 16 hex digits of
// SHA-256 over its fields joined with 0x1F. It reveals no account id.
func (p Partition) hash() string {
	h := sha256.New()
	for i, s := range []string{p.Account, p.Model, p.Effort, p.PromptCacheKey} {
		if i > 0 {
			h.Write([]byte{0x1f})
		}
		h.Write([]byte(s))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

type partition struct {
	key   Partition
	hash  string
	heads []*head
}

// Pool holds upstream sockets as continuation heads. Every decision runs
// on the requesting goroutine; the only goroutines the pool starts ping
// idle heads (watch.go), and Close waits for them.
type Pool struct {
	cfg      Config
	upstream string // upstream.Key of cfg.Upstream.URL: the failure memory's key
	metrics  *metrics

	diagMu sync.Mutex     // serialises writes to cfg.Diagnostics
	drops  sync.WaitGroup // idle heads being dropped by their watchers

	mu          sync.Mutex // guards the following fields
	closed      bool
	parts       map[Partition]*partition
	waiting     map[Partition][]*admissionWait // requests waiting for admission of a new socket
	nextID      uint64
	nNursery    int       // registered nursery heads, busy or idle
	nEstablish  int       // registered established heads, busy or idle
	nBusy       int       // registered heads in flight
	nextSweep   time.Time // no idle head expires before it; zero: none idle
	stats       Stats
	fdAnnounced bool
}

// New returns a pool. It fails only on an invalid [Config] or a metrics
// registration conflict.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:      cfg.withDefaults(),
		upstream: upstream.Key(cfg.Upstream.URL),
		parts:    make(map[Partition]*partition),
		waiting:  make(map[Partition][]*admissionWait),
		stats:    newStats(),
	}
	m, err := newMetrics(cfg.Registerer, p)
	if err != nil {
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	p.metrics = m
	return p, nil
}

func (p *Pool) now() time.Time { return p.cfg.Clock() }

// A head's lifecycle: registered in flight before its socket is dialled
// (registerLocked), released when its response completes (releaseLocked:
// it notes when the head can next expire and watches its socket), reserved
// by the request that continues it (reserveLocked), and unregistered
// (removeLocked) by an eviction, a drop, a lease that does not keep it or
// Close.

// reserveLocked marks h in flight (lookLocked claimed its socket).
func (p *Pool) reserveLocked(h *head, now time.Time) {
	if !h.busy {
		h.busy = true
		if !h.removed {
			p.nBusy++
		}
	}
	h.inFlightSince = now
}

// releaseLocked marks h idle again and starts watching its socket.
func (p *Pool) releaseLocked(h *head) {
	if h.busy {
		h.busy = false
		if !h.removed {
			p.nBusy--
			p.noteIdleLocked(h)
			p.watchLocked(h)
		}
	}
}

// deadlineLocked is when idle head h next expires (the earliest of its
// hard TTL, maximum socket age and idle TTL).
func (p *Pool) deadlineLocked(h *head) time.Time {
	d := h.created.Add(h.ttlPaused + p.cfg.HardTTL)
	if m := h.created.Add(p.cfg.MaxSocketAge); m.Before(d) {
		d = m
	}
	ttl := p.cfg.IdleTTL
	if h.gen == GenerationNursery {
		ttl = p.cfg.NurseryIdleTTL
	}
	if i := h.lastUsed.Add(ttl); i.Before(d) {
		d = i
	}
	return d
}

// noteIdleLocked keeps nextSweep a lower bound of every idle head's
// deadline after h became idle.
func (p *Pool) noteIdleLocked(h *head) {
	if d := p.deadlineLocked(h); p.nextSweep.IsZero() || d.Before(p.nextSweep) {
		p.nextSweep = d
	}
}

func (p *Pool) registerLocked(part Partition, parallel bool, now time.Time) *head {
	pt := p.parts[part]
	if pt == nil {
		pt = &partition{key: part, hash: part.hash()}
		p.parts[part] = pt
	}
	p.nextID++
	h := &head{
		id:            p.nextID,
		part:          pt,
		gen:           GenerationNursery,
		created:       now,
		inFlightSince: now,
		lastUsed:      now,
		busy:          true,
		bornParallel:  parallel,
	}
	pt.heads = append(pt.heads, h)
	p.nNursery++
	p.nBusy++
	if parallel {
		p.stats.ParallelHeads++
	}
	return h
}

func (p *Pool) setGenLocked(h *head, gen string) {
	if h.gen == gen {
		return
	}
	if !h.removed {
		p.adjustGenLocked(h.gen, -1)
		p.adjustGenLocked(gen, +1)
	}
	h.gen = gen
}

func (p *Pool) adjustGenLocked(gen string, d int) {
	switch gen {
	case GenerationNursery:
		p.nNursery += d
	case GenerationEstablished:
		p.nEstablish += d
	}
}

// removeLocked unregisters h. Its socket is closed by the caller: now if
// idle, at the end of its lease if busy.
func (p *Pool) removeLocked(h *head) {
	if h.removed {
		return
	}
	pt := h.part
	if i := slices.Index(pt.heads, h); i >= 0 {
		pt.heads = slices.Delete(pt.heads, i, i+1)
	}
	if len(pt.heads) == 0 && p.parts[pt.key] == pt {
		delete(p.parts, pt.key)
	}
	p.adjustGenLocked(h.gen, -1)
	if h.busy {
		p.nBusy--
	}
	h.removed = true
	p.disarmLocked(h)
}

// The socket of a head changes state as the head does (docs/pool.md
// §9.4): when it goes idle the pool watches the socket (upstream.Conn.Watch:
// its own reader hands what it says next to idleLost, watch.go) and arms a
// keepalive timer; a request takes it back with claimLocked
// (upstream.Conn.Claim), which decides once, under the Conn's lock, whether
// a frame goes to the watch or to the request. Every frame the socket reads
// also goes to its frame hook, for as long as the socket lives.

// frameHook is the upstream.DialOptions.OnFrame dialUpstream gives a new
// socket of account: Config.OnFrame with the account, or nil.
func (p *Pool) frameHook(account string) func(frame []byte) {
	onFrame := p.cfg.OnFrame
	if onFrame == nil || account == "" {
		return nil
	}
	return func(frame []byte) { onFrame(account, frame) }
}

// setConnLocked makes c the socket of h.
func (p *Pool) setConnLocked(h *head, c *upstream.Conn) {
	h.conn, h.dead, h.kept = c, false, false
	h.lost = func(err error) { p.idleLost(h, c, err) }
}

// watchLocked starts watching h, whose head just became idle.
func (p *Pool) watchLocked(h *head) {
	if h.removed || h.conn == nil {
		return
	}
	h.conn.Watch(h.lost)
	p.armLocked(h)
}

// claimLocked takes idle h's socket for a request: the keepalive stops and
// the watch ends. It reports false when the socket is no longer live: its
// watch was told something and drops the head (idleLost), which stays out
// of every match until then (h.dead).
func (p *Pool) claimLocked(h *head) bool {
	p.disarmLocked(h)
	if h.conn.Claim() {
		return true
	}
	h.dead = true
	return false
}

// armLocked schedules the next keepalive ping of idle h.
func (p *Pool) armLocked(h *head) {
	if p.cfg.KeepaliveInterval <= 0 || h.removed || h.conn == nil {
		return
	}
	h.pingSeq++
	seq, c := h.pingSeq, h.conn
	h.pings.Add(1)
	h.ping = time.AfterFunc(p.cfg.KeepaliveInterval, func() { p.keepalive(h, c, seq) })
}

// disarmLocked cancels h's scheduled keepalive; one already running finds
// its arming stale and does nothing.
func (p *Pool) disarmLocked(h *head) {
	h.pingSeq++
	if h.ping != nil && h.ping.Stop() {
		h.pings.Done()
	}
	h.ping = nil
}

// closeSocket hard-closes c, a socket of h (nil for an unpartitioned
// socket), and waits for h's keepalive callbacks.
func closeSocket(h *head, c *upstream.Conn) {
	if c == nil {
		return
	}
	_ = c.CloseNow()
	if h != nil {
		h.pings.Wait()
	}
}

// closeHeads hard-closes the sockets of unregistered idle heads.
func closeHeads(hs []*head) {
	for _, h := range hs {
		closeSocket(h, h.conn)
	}
}

// DropAccount unregisters every head of account, for when the backend
// rejected a socket's credentials. Idle sockets close now; busy ones when
// their lease ends. It returns how many heads were dropped.
func (p *Pool) DropAccount(account string) int {
	var idle []*head
	n := 0
	p.mu.Lock()
	for key, pt := range p.parts {
		if key.Account != account {
			continue
		}
		for _, h := range slices.Clone(pt.heads) {
			p.removeLocked(h)
			p.countEvictionLocked(EvictCredentials, h, nil)
			n++
			if !h.busy {
				idle = append(idle, h)
			}
		}
	}
	p.mu.Unlock()
	closeHeads(idle)
	return n
}

// Close unregisters every head and closes every idle socket, stopping the
// goroutines that watch them; sockets in flight close when their lease
// ends. Acquire fails with ErrClosed after.
func (p *Pool) Close() error {
	var idle []*head
	p.mu.Lock()
	p.closed = true
	for _, pt := range p.parts {
		for _, h := range slices.Clone(pt.heads) {
			p.removeLocked(h)
			if !h.busy {
				idle = append(idle, h)
			}
		}
	}
	p.mu.Unlock()
	// Close the idle sockets side by side, each with a 1001 close frame:
	// each close may wait (upstream.CloseTimeout) for the peer's answer,
	// and shutdown must not take that wait once per socket. The goroutines
	// are owned here and waited for.
	errs := make([]error, len(idle))
	var wg sync.WaitGroup
	for i, h := range idle {
		if h.conn == nil {
			continue
		}
		wg.Go(func() {
			errs[i] = h.conn.Close(websocket.StatusGoingAway, ReasonPoolClosed)
			h.pings.Wait()
		})
	}
	wg.Wait()
	p.drops.Wait()
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close pool: %w", err)
	}
	return nil
}

// EvictMoved is the eviction reason of a head dropped by [Pool.Forget]:
// its conversation moved to another account.
const EvictMoved = "moved_account"

// Holder returns the account, among accounts, of the idle head that items
// continue in part's model, effort and prompt cache key (part.Account is
// ignored): the account a continuing conversation lives on. It reports
// false when no idle head matches (a new conversation, or one whose head
// expired or is in flight). It takes nothing and dials nothing.
func (p *Pool) Holder(part Partition, items [][]byte, accounts []string) (string, bool) {
	if !part.keyed() || len(items) == 0 {
		return "", false
	}
	full := digestAll(items)
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	best, found := match{}, ""
	for _, a := range accounts {
		part.Account = a
		m := p.bestMatchLocked(p.parts[part], full, items, nil, now)
		if m.h != nil && (best.h == nil || m.matched > best.matched) {
			best, found = m, a
		}
	}
	return found, best.h != nil
}

// Forget drops the idle head that items continue in part, for a
// conversation that moved to another account. It reports whether a head
// was dropped.
func (p *Pool) Forget(part Partition, items [][]byte) bool {
	if !part.keyed() || len(items) == 0 {
		return false
	}
	full := digestAll(items)
	now := p.now()
	p.mu.Lock()
	m := p.bestMatchLocked(p.parts[part], full, items, nil, now)
	if m.h == nil {
		p.mu.Unlock()
		return false
	}
	p.removeLocked(m.h)
	p.countEvictionLocked(EvictMoved, m.h, nil)
	p.mu.Unlock()
	closeHeads([]*head{m.h})
	return true
}
