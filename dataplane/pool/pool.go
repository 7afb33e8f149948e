package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
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

// ReasonPoolClosed is the reason [Pool.Close] passes to Conn.Close.
const ReasonPoolClosed = "pool closed"

// ErrClosed is returned by [Pool.Acquire] after [Pool.Close].
var ErrClosed = errors.New("pool: closed")

// ErrReplaceSpent is returned by [Lease.Replace] on a lease that is itself
// a replacement: one replacement per request attempt.
var ErrReplaceSpent = errors.New("pool: replacement already used for this request")

// ErrLeaseDone is returned by [Lease.Replace] on a finished lease.
var ErrLeaseDone = errors.New("pool: lease already finished")

// Usage is the token usage of a completed response.
type Usage struct {
	InputTokens  int64
	CachedTokens int64
	OutputTokens int64
}

// head is one pooled socket and the conversation it completes.
type head struct {
	id   uint64
	part *partition
	conn *sock // nil while the socket is being dialled
	gen  string

	created       time.Time     // when the current socket opened (physical age)
	ttlPaused     time.Duration // time in flight, excluded from the hard TTL
	inFlightSince time.Time
	lastUsed      time.Time
	busy          bool
	removed       bool // no longer registered: its lease closes the socket

	responseID string
	// digests of requestInput ++ expectedAssistant; nInput is
	// len(requestInput); reasoning lists the indices (>= nInput) of the
	// assistant's reasoning items, for the omitted-reasoning match.
	digests   []digest
	nInput    int32
	reasoning []int32

	bornParallel bool
	reused       bool
}

type partition struct {
	key   Partition
	hash  string
	heads []*head
}

// Pool holds upstream sockets as continuation heads. Every decision runs
// on the requesting goroutine; the only goroutines the pool starts watch
// idle heads (watch.go), and Close waits for them.
type Pool struct {
	cfg     Config
	metrics *metrics

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
		cfg:     cfg.withDefaults(),
		parts:   make(map[Partition]*partition),
		waiting: make(map[Partition][]*admissionWait),
		stats:   newStats(),
	}
	m, err := newMetrics(cfg.Registerer, p)
	if err != nil {
		return nil, fmt.Errorf("pool metrics: %w", err)
	}
	p.metrics = m
	return p, nil
}

func (p *Pool) now() time.Time { return p.cfg.Clock() }

// Acquire returns a socket for one request whose full input, as canonical
// item bytes (docs/pool.md §3.1), is items. It reuses the idle head whose
// conversation is the longest strict prefix of items (exact, or with the
// head's reasoning items omitted), or asks the Admitter and dials. After
// the Admitter returns it matches again, so a head that freed up during
// the wait is used instead of a new socket. The caller must end the lease
// with exactly one of Complete, Discard or a successful Replace.
func (p *Pool) Acquire(ctx context.Context, part Partition, items [][]byte) (*Lease, error) {
	if len(items) == 0 {
		return nil, errors.New("acquire socket: empty input; want at least one item")
	}
	full := digestAll(items)
	rec := p.newRecord(part, items)
	l, err := p.acquire(ctx, part, items, full, rec)
	if rec != nil {
		if err != nil && rec.Outcome == "" {
			rec.Outcome = outcomeOf(err)
		}
		if rec.Outcome == "" {
			rec.Outcome = "ok"
		}
		p.writeRecord(rec)
	}
	return l, err
}

// acquire runs the three steps of a keyed request in order: look for an
// idle head, ask for admission, look again or dial. A head that frees up
// and matches while the request waits for admission ends the wait: the
// Admitter hands the reservation back (its context is cancelled), and the
// request takes the head without a new socket; if another request took
// the head first, it asks again.
func (p *Pool) acquire(ctx context.Context, part Partition, items [][]byte, full []digest, rec *decisionRecord) (*Lease, error) {
	if !part.keyed() {
		return p.acquireUnpartitioned(ctx, part, full, rec)
	}
	if l, found, err := p.firstLook(ctx, part, items, full, rec); found {
		return l, err
	}
	for {
		err := p.admitWatching(ctx, part, full)
		if errors.Is(err, errHeadFreed) {
			// Not admitted (the reservation went back): take the head.
			if l, found, err := p.lookAgain(ctx, part, items, full, rec); found {
				return l, err
			}
			continue
		}
		if err != nil {
			if rec != nil {
				rec.Outcome = "admission_refused"
			}
			return nil, err
		}
		return p.secondLook(ctx, part, items, full, rec)
	}
}

// errHeadFreed ends an admission wait because a head that matches the
// request freed up.
var errHeadFreed = errors.New("pool: a matching head freed up during the admission wait")

// admissionWait is a request waiting for admission of a new socket: a
// head of its partition that completes a response and matches it cancels
// the wait (headFreedLocked).
type admissionWait struct {
	full   []digest
	cancel context.CancelCauseFunc
}

// admitWatching asks the Admitter for a new socket of part while watching
// the partition's heads. It returns errHeadFreed when a matching head
// freed up before the admission returned (the Admitter saw its context
// cancelled and handed back what it had reserved).
func (p *Pool) admitWatching(ctx context.Context, part Partition, full []digest) error {
	if p.cfg.Admitter == nil {
		return nil
	}
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	w := &admissionWait{full: full, cancel: cancel}
	p.mu.Lock()
	p.waiting[part] = append(p.waiting[part], w)
	p.mu.Unlock()
	err := p.admit(actx, part.Account)
	p.mu.Lock()
	ws := slices.DeleteFunc(p.waiting[part], func(x *admissionWait) bool { return x == w })
	if len(ws) == 0 {
		delete(p.waiting, part)
	} else {
		p.waiting[part] = ws
	}
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errHeadFreed) {
		p.stats.ReturnedAdmissions++
		p.mu.Unlock()
		return errHeadFreed
	}
	p.mu.Unlock()
	return err
}

// headFreedLocked ends the admission waits of h's partition that h, idle
// with a completed response, now matches.
func (p *Pool) headFreedLocked(h *head) {
	if h.removed || h.busy || h.responseID == "" {
		return
	}
	for _, w := range p.waiting[h.part.key] {
		if mode, _ := matchHead(h, w.full); mode != "" {
			w.cancel(errHeadFreed)
		}
	}
}

// firstLook continues, or rotates, the idle head whose conversation the
// request extends. found is false when there is none: the request needs a
// new socket, and rec holds the miss's decision.
func (p *Pool) firstLook(ctx context.Context, part Partition, items [][]byte, full []digest, rec *decisionRecord) (l *Lease, found bool, err error) {
	now := p.now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, true, ErrClosed
	}
	var evicted []*head
	pt, m := p.lookLocked(now, part, full, items, rec, rec, &evicted)
	if m.h != nil {
		l, err := p.takeHeadUnlock(ctx, part, m, full, now, rec, evicted, false)
		return l, true, err
	}
	if rec != nil {
		rec.Decision = p.missDecisionLocked(pt)
	}
	p.mu.Unlock()
	closeHeads(evicted)
	return nil, false, nil
}

// secondLook runs after admission, which may have waited: a head that
// freed up meanwhile is used instead of a new socket (docs/pool.md §6);
// otherwise the new head is registered, in flight, and dialled.
func (p *Pool) secondLook(ctx context.Context, part Partition, items [][]byte, full []digest, rec *decisionRecord) (*Lease, error) {
	now := p.now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	var evicted []*head
	pt, m := p.lookLocked(now, part, full, items, rec, nil, &evicted)
	if m.h != nil {
		p.countRematchLocked(rec)
		return p.takeHeadUnlock(ctx, part, m, full, now, rec, evicted, true)
	}
	h, decision := p.newHeadLocked(part, pt, now, rec, &evicted)
	p.mu.Unlock()
	closeHeads(evicted)
	return p.dialHead(ctx, part, h, decision, full, rec)
}

// lookAgain takes a head that matches the request after its admission
// wait was ended by that head freeing up: the request holds no admission.
// found is false when another request took the head first.
func (p *Pool) lookAgain(ctx context.Context, part Partition, items [][]byte, full []digest, rec *decisionRecord) (l *Lease, found bool, err error) {
	now := p.now()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, true, ErrClosed
	}
	var evicted []*head
	_, m := p.lookLocked(now, part, full, items, rec, nil, &evicted)
	if m.h == nil {
		p.mu.Unlock()
		closeHeads(evicted)
		return nil, false, nil
	}
	p.countRematchLocked(rec)
	l, err = p.takeHeadUnlock(ctx, part, m, full, now, rec, evicted, false)
	return l, true, err
}

// lookLocked sweeps expired idle heads into *evicted, then returns the
// request's partition and its best idle match. sweepRec records the
// evictions, matchRec the candidates (the second look does not).
func (p *Pool) lookLocked(now time.Time, part Partition, full []digest, items [][]byte, sweepRec, matchRec *decisionRecord, evicted *[]*head) (*partition, match) {
	*evicted = p.sweepLocked(now, *evicted, sweepRec)
	pt := p.parts[part]
	return pt, p.bestMatchLocked(pt, full, items, matchRec, now)
}

// takeHeadUnlock gives the matched idle head to the request: a
// continuation on its socket, or a rotation when the socket reached
// RotateAge (admitted says whether the request already passed admission).
// It is called with p.mu held and unlocks it.
func (p *Pool) takeHeadUnlock(ctx context.Context, part Partition, m match, full []digest, now time.Time, rec *decisionRecord, evicted []*head, admitted bool) (*Lease, error) {
	if now.Sub(m.h.created) < p.cfg.RotateAge {
		l := p.continueLocked(m, full, now, rec, &evicted)
		l.admitted = admitted
		p.mu.Unlock()
		closeHeads(evicted)
		return l, nil
	}
	p.reserveLocked(m.h, now)
	p.mu.Unlock()
	closeHeads(evicted)
	return p.rotate(ctx, part, m, full, rec, admitted)
}

func (p *Pool) countRematchLocked(rec *decisionRecord) {
	p.stats.Rematches++
	p.metrics.rematches.Inc()
	if rec != nil {
		rec.RematchedAfterAdmission = true
		rec.Heads = nil
	}
}

// newHeadLocked counts the miss, makes room under the nursery cap and
// registers a new head, in flight, for the socket about to be dialled.
func (p *Pool) newHeadLocked(part Partition, pt *partition, now time.Time, rec *decisionRecord, evicted *[]*head) (*head, string) {
	decision := p.missDecisionLocked(pt)
	p.countMissLocked(decision)
	*evicted = p.evictCapLocked(GenerationNursery, p.cfg.MaxNurseryConnections, nil, *evicted, rec)
	h := p.registerLocked(part, decision == DecisionParallelHead, now)
	if rec != nil {
		rec.Decision = decision
		rec.CreatedConnectionID = h.id
		rec.Generation = GenerationNursery
		rec.fillCountsLocked(p)
	}
	return h, decision
}

// dialHead dials the socket of new head h; on failure h is unregistered.
func (p *Pool) dialHead(ctx context.Context, part Partition, h *head, decision string, full []digest, rec *decisionRecord) (*Lease, error) {
	conn, err := p.dial(ctx, part)
	p.mu.Lock()
	if err != nil {
		if !h.removed {
			p.removeLocked(h)
		}
		p.mu.Unlock()
		if rec != nil {
			rec.Outcome = "dial_failed"
		}
		return nil, fmt.Errorf("acquire socket: %w", err)
	}
	now := p.now()
	h.conn = p.newSock(h, conn)
	h.created = now
	h.inFlightSince = now
	p.countDecisionLocked(decision)
	p.mu.Unlock()
	return &Lease{
		Conn:         h.conn,
		Decision:     decision,
		Generation:   GenerationNursery,
		ConnectionID: h.id,
		p:            p,
		h:            h,
		part:         part,
		req:          full,
		admitted:     true,
	}, nil
}

func (p *Pool) acquireUnpartitioned(ctx context.Context, part Partition, full []digest, rec *decisionRecord) (*Lease, error) {
	if rec != nil {
		rec.Decision = DecisionUnpartitioned
		rec.Generation = GenerationIsolated
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	if err := p.admit(ctx, part.Account); err != nil {
		if rec != nil {
			rec.Outcome = "admission_refused"
		}
		return nil, err
	}
	conn, err := p.dial(ctx, part)
	if err != nil {
		if rec != nil {
			rec.Outcome = "dial_failed"
		}
		return nil, fmt.Errorf("acquire socket: %w", err)
	}
	p.mu.Lock()
	p.nextID++
	id := p.nextID
	p.countMissLocked(DecisionUnpartitioned)
	p.countDecisionLocked(DecisionUnpartitioned)
	p.mu.Unlock()
	if rec != nil {
		rec.CreatedConnectionID = id
	}
	return &Lease{
		Conn:         conn,
		Decision:     DecisionUnpartitioned,
		Generation:   GenerationIsolated,
		ConnectionID: id,
		p:            p,
		part:         part,
		req:          full,
		admitted:     true,
	}, nil
}

func (p *Pool) admit(ctx context.Context, account string) error {
	if p.cfg.Admitter == nil {
		return nil
	}
	if err := p.cfg.Admitter.Admit(ctx, account); err != nil {
		return fmt.Errorf("admit new socket: %w", err)
	}
	return nil
}

// rotate replaces the socket of m.h, which the caller reserved, with a new
// one carrying the full context. If admission is refused or the dial fails
// while the old socket is younger than MaxSocketAge, the turn continues on
// the old socket.
func (p *Pool) rotate(ctx context.Context, part Partition, m match, full []digest, rec *decisionRecord, admitted bool) (*Lease, error) {
	var err error
	if !admitted {
		err = p.admit(ctx, part.Account)
		admitted = err == nil
	}
	var conn Conn
	if err == nil {
		conn, err = p.dial(ctx, part)
	}
	now := p.now()
	h := m.h
	p.mu.Lock()
	if err != nil {
		if ctx.Err() != nil {
			// The request is gone; the head stays as it was, unless it
			// was dropped meanwhile (then nobody else will close it).
			p.releaseLocked(h)
			dropped := h.removed
			p.mu.Unlock()
			if dropped && h.conn != nil {
				_ = h.conn.Close("dropped")
			}
			if rec != nil {
				rec.Outcome = "cancelled"
			}
			return nil, err
		}
		if !h.removed && now.Sub(h.created) < p.cfg.MaxSocketAge {
			p.stats.RotationsDeferred++
			p.metrics.rotationsDeferred.Inc()
			var evicted []*head
			p.releaseLocked(h)
			l := p.continueLocked(m, full, now, rec, &evicted)
			l.admitted = admitted // admitted, but the dial failed
			p.mu.Unlock()
			closeHeads(evicted)
			if rec != nil {
				rec.Rotation = "deferred"
			}
			return l, nil
		}
		if !h.removed {
			p.removeLocked(h)
			p.countEvictionLocked(EvictMaxSocketAge, h, rec)
		}
		old := h.conn
		p.mu.Unlock()
		if old != nil {
			_ = old.Close(EvictMaxSocketAge)
		}
		if rec != nil {
			rec.Decision = DecisionRotation
			rec.Outcome = "rotation_failed"
		}
		return nil, fmt.Errorf("rotate socket: %w", err)
	}
	old := h.conn
	p.nextID++
	h.id = p.nextID
	h.conn = p.newSock(h, conn)
	h.created = now
	h.ttlPaused = 0
	h.inFlightSince = now
	gen := h.gen
	var evicted []*head
	if gen == GenerationNursery && !h.removed {
		evicted = p.evictCapLocked(GenerationEstablished, p.cfg.MaxConnections, h, evicted, rec)
		p.setGenLocked(h, GenerationEstablished)
		gen = GenerationEstablished
	}
	p.stats.Rotations++
	p.metrics.rotations.Inc()
	p.countDecisionLocked(DecisionRotation)
	if rec != nil {
		rec.Decision = DecisionRotation
		rec.Rotation = "rotated"
		rec.Generation = gen
		rec.CreatedConnectionID = h.id
		rec.ContinuationMatchMode = m.mode
		rec.fillCountsLocked(p)
	}
	p.mu.Unlock()
	closeHeads(evicted)
	if old != nil {
		_ = old.Close("rotated: socket reached rotation age")
	}
	return &Lease{
		Conn:         h.conn,
		Decision:     DecisionRotation,
		Generation:   gen,
		ConnectionID: h.id,
		p:            p,
		h:            h,
		part:         part,
		req:          full,
		admitted:     true,
	}, nil
}

// bestMatchLocked returns the idle head of pt whose conversation is the
// longest strict prefix of full; ties prefer an exact match. When rec is
// non-nil it records, for a miss, where each idle head diverged.
func (p *Pool) bestMatchLocked(pt *partition, full []digest, items [][]byte, rec *decisionRecord, now time.Time) match {
	var best match
	if pt == nil {
		return best
	}
	matching := 0
	for _, h := range pt.heads {
		if h.busy || h.responseID == "" {
			continue
		}
		mode, n := matchHead(h, full)
		if mode == "" {
			continue
		}
		matching++
		if best.h == nil || n > best.matched || (n == best.matched && mode == modeExact && best.mode != modeExact) {
			best = match{h: h, mode: mode, matched: n}
		}
	}
	if rec != nil {
		rec.CandidateCount = len(pt.heads)
		rec.MatchingCandidateCount = matching
		for _, h := range pt.heads {
			if !h.busy {
				rec.IdleCandidateCount++
			}
		}
		if best.h == nil {
			rec.addMismatchesLocked(p, pt, full, items, now)
		}
	}
	return best
}

func (p *Pool) missDecisionLocked(pt *partition) string {
	if pt == nil || len(pt.heads) == 0 {
		return DecisionNewPartition
	}
	for _, h := range pt.heads {
		if h.busy {
			return DecisionParallelHead
		}
	}
	return DecisionHistoryMismatch
}

func (p *Pool) countMissLocked(decision string) {
	reason := ""
	switch decision {
	case DecisionNewPartition:
		reason = MissNoHead
	case DecisionHistoryMismatch:
		reason = MissHistoryMismatch
	case DecisionParallelHead:
		reason = MissHeadBusy
	case DecisionUnpartitioned:
		reason = MissUnpartitioned
	default:
		return
	}
	p.stats.Misses[reason]++
	p.metrics.misses.WithLabelValues(reason).Inc()
}

func (p *Pool) countDecisionLocked(decision string) {
	p.stats.Acquires++
	p.stats.Decisions[decision]++
	p.metrics.decisions.WithLabelValues(decision).Inc()
	if decision == DecisionContinuation {
		p.stats.Continuations++
	} else {
		p.stats.NewSockets++
	}
}

// continueLocked hands the matched idle head to the request, promoting a
// nursery head (after the established cap's evictions).
func (p *Pool) continueLocked(m match, full []digest, now time.Time, rec *decisionRecord, evicted *[]*head) *Lease {
	h := m.h
	p.reserveLocked(h, now)
	promoted := false
	if h.gen == GenerationNursery {
		*evicted = p.evictCapLocked(GenerationEstablished, p.cfg.MaxConnections, h, *evicted, rec)
		p.setGenLocked(h, GenerationEstablished)
		promoted = true
	}
	if h.bornParallel && !h.reused {
		p.stats.SavedSockets++
		p.metrics.savedSockets.Inc()
	}
	h.reused = true
	p.countDecisionLocked(DecisionContinuation)
	if rec != nil {
		rec.Decision = DecisionContinuation
		rec.Generation = h.gen
		rec.SelectedConnectionID = h.id
		rec.ContinuationMatchMode = m.mode
		rec.IncrementalInputItems = len(full) - m.matched
		if promoted {
			rec.PromotedConnectionID = h.id
		}
		rec.Heads = nil
		rec.fillCountsLocked(p)
	}
	return &Lease{
		Conn:               h.conn,
		PreviousResponseID: h.responseID,
		Delta:              m.matched,
		Decision:           DecisionContinuation,
		Generation:         h.gen,
		Reused:             true,
		MatchMode:          m.mode,
		ConnectionID:       h.id,
		p:                  p,
		h:                  h,
		part:               h.part.key,
		req:                full,
	}
}

// reserveLocked marks h in flight; its socket's idle watch hands over to
// the request.
func (p *Pool) reserveLocked(h *head, now time.Time) {
	if !h.busy {
		h.busy = true
		if !h.removed {
			p.nBusy++
		}
		if h.conn != nil {
			h.conn.handOverLocked()
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
			if h.conn != nil {
				h.conn.watchLocked()
			}
		}
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
}

func closeHeads(hs []*head) {
	for _, h := range hs {
		if h.conn != nil {
			_ = h.conn.Close("evicted")
		}
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
	// Close the idle sockets side by side: each close may wait (bounded)
	// for the peer's close frame, and shutdown must not take that wait once
	// per socket. The goroutines are owned here and waited for.
	errs := make([]error, len(idle))
	var wg sync.WaitGroup
	for i, h := range idle {
		if h.conn == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = h.conn.Close(ReasonPoolClosed)
		}()
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
