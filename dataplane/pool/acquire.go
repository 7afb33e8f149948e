package pool

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
)

// The decisions of docs/pool.md §5 and §6, in the order a request meets
// them: look for an idle head, ask for admission (watching for a head
// that frees up), look again, dial a new socket (the failure memory's
// ticket, the account's credential, the frame and 403 hooks); and last how
// a request finds the head it continues (§3). The rotation of an old
// socket and the unpartitioned socket are in rotate.go.

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
	var rec *decisionRecord
	if p.cfg.Diagnostics != nil {
		rec = p.newRecord(part, items)
	}
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
		return p.admit(ctx, part.Account) // nothing to wait for
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
	if h := p.keptLocked(pt, now); h != nil {
		// No head to continue, but a socket kept after a failed response:
		// the full context on it, without admission (kept.go).
		l := p.takeKeptLocked(h, full, now, rec)
		p.mu.Unlock()
		closeHeads(evicted)
		return l, true, nil
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
	if !p.nextSweep.IsZero() && !now.Before(p.nextSweep) { // an idle head may have expired
		*evicted = p.sweepLocked(now, *evicted, sweepRec)
	}
	pt := p.parts[part]
	for {
		m := p.bestMatchLocked(pt, full, items, matchRec, now)
		// The match is taken: its socket's watch ends here, or, when the
		// watch was told something already, the head is left to it.
		if m.h == nil || p.claimLocked(m.h) {
			return pt, m
		}
	}
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

// continueLocked hands the matched idle head to the request, promoting a
// nursery head (after the established cap's evictions).
func (p *Pool) continueLocked(m match, full []digest, now time.Time, rec *decisionRecord, evicted *[]*head) *Lease {
	h := m.h
	p.reserveLocked(h, now)
	promoted := false
	if h.gen == GenerationNursery {
		if limit := p.cfg.MaxConnections; limit > 0 {
			*evicted = p.evictCapLocked(GenerationEstablished, limit, h, *evicted, rec)
		}
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
		CachedTokens:       h.tokens,
		ConnectionID:       h.id,
		p:                  p,
		h:                  h,
		part:               h.part.key,
		req:                full,
	}
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
	if limit := p.cfg.MaxNurseryConnections; limit > 0 {
		*evicted = p.evictCapLocked(GenerationNursery, limit, nil, *evicted, rec)
	}
	h := p.registerLocked(part, decision == DecisionParallelHead, now)
	if rec != nil {
		rec.Decision = decision
		rec.CreatedConnectionID = h.id
		rec.Generation = GenerationNursery
		rec.fillCountsLocked(p)
	}
	return h, decision
}

func (p *Pool) missDecisionLocked(pt *partition) string {
	if pt == nil {
		return DecisionNewPartition
	}
	live := 0
	for _, h := range pt.heads {
		if h.busy {
			return DecisionParallelHead
		}
		if !h.dead { // a dead head is being dropped by its watch
			live++
		}
	}
	if live == 0 {
		return DecisionNewPartition
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
	switch decision {
	case DecisionContinuation:
		p.stats.Continuations++
	case DecisionKeptSocket:
		p.stats.KeptSocketReuses++
	default:
		p.stats.NewSockets++
	}
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
	p.setConnLocked(h, conn)
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

// admit asks for a new socket: an upstream known to be unreachable refuses
// it at once (Health.Down), before the Admitter, so that such a refusal
// does not spend the account's admission.
func (p *Pool) admit(ctx context.Context, account string) error {
	if p.cfg.Health != nil {
		if err := p.cfg.Health.Down(p.upstream); err != nil {
			return fmt.Errorf("admit new socket: %w", err)
		}
	}
	if p.cfg.Admitter == nil {
		return nil
	}
	if err := p.cfg.Admitter.Admit(ctx, account); err != nil {
		return fmt.Errorf("admit new socket: %w", err)
	}
	return nil
}

// dial opens a socket. When the dial fails for lack of file descriptors
// (the error says so, or a probe open fails with EMFILE/ENFILE) it closes
// every idle head, oldest first, and retries once.
func (p *Pool) dial(ctx context.Context, part Partition) (*upstream.Conn, error) {
	conn, err := p.dialUpstream(ctx, part)
	if err == nil {
		return conn, nil
	}
	if ctx.Err() != nil {
		return nil, err
	}
	errno, by := exhaustionErrno(err), detectedByErrorCode
	if errno == 0 {
		if perr := p.cfg.ProbeDescriptor(); perr != nil {
			errno, by = exhaustionErrno(perr), detectedByProbe
		}
	}
	if errno == 0 {
		return nil, err
	}
	held, shed := p.shedIdle()
	p.reportExhaustion(ctx, errno, by, held, len(shed))
	if len(shed) == 0 {
		return nil, &DescriptorExhaustionError{Errno: errno, DetectedBy: by, Held: held, Err: err}
	}
	conn, err = p.dialUpstream(ctx, part)
	if err != nil {
		return nil, &DescriptorExhaustionError{Errno: errno, DetectedBy: by, Held: held, Shed: len(shed), Err: err}
	}
	return conn, nil
}

// dialUpstream opens one socket for part: its account's current
// credential, the failure memory's ticket around the dial, and the hooks
// of Config (frames watched, a 403 reported).
func (p *Pool) dialUpstream(ctx context.Context, part Partition) (*upstream.Conn, error) {
	cred, err := p.cfg.Credentials.Credential(ctx, part.Account)
	if err != nil {
		return nil, &retry.CredentialError{Err: fmt.Errorf("dial upstream: get credential: %w", err)}
	}
	var ticket *retry.DialTicket // nil-safe: a nil Health gates nothing
	if p.cfg.Health != nil {
		if ticket, err = p.cfg.Health.Dial(p.upstream); err != nil {
			return nil, err
		}
		defer ticket.Done()
	}
	opts := p.cfg.Upstream
	opts.Credential = cred
	opts.OnFrame = p.frameHook(part.Account)
	c, err := upstream.Dial(ctx, opts)
	if err == nil {
		ticket.Reached()
		return c, nil
	}
	var unreach *upstream.UnreachableError
	var ue *upstream.UpgradeError
	refused := errors.As(err, &ue)
	switch {
	case ctx.Err() != nil:
	case errors.As(err, &unreach):
		ticket.Unreachable(err)
	case refused:
		ticket.Reached() // the backend answered: up
	}
	if refused && ue.Status == http.StatusForbidden && p.cfg.OnForbidden != nil && part.Account != "" {
		p.cfg.OnForbidden(part.Account, parseRetryAfter(ue.RetryAfter))
	}
	return nil, err
}

// parseRetryAfter reads a refused upgrade's Retry-After header: whole
// seconds, at most an hour; 0 when absent or not a positive number.
func parseRetryAfter(v string) time.Duration {
	if secs, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && secs > 0 {
		return time.Duration(min(secs, 3600)) * time.Second
	}
	return 0
}

// How a request finds the head it continues (docs/pool.md §3): heads keep
// the digests of their conversation's canonical items, and the best idle
// head is the one whose conversation is the longest strict prefix of the
// request's, exactly or with its reasoning items omitted.

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
		if h.busy || h.dead || h.responseID == "" {
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
		rec.addCandidatesLocked(p, pt, matching, best.h == nil, full, items, now)
	}
	return best
}

// match is the best candidate for a request.
type match struct {
	h       *head
	mode    string
	matched int // number of leading request items the head already holds
}

// matchHead reports whether h's conversation is a strict prefix of full,
// exactly or with its reasoning items omitted, and how many items matched.
func matchHead(h *head, full []digest) (mode string, matched int) {
	n := len(h.digests)
	if len(full) > n && equalDigests(h.digests, full[:n]) {
		return modeExact, n
	}
	if len(h.reasoning) == 0 {
		return "", 0
	}
	// requestInput ++ (expectedAssistant without reasoning items).
	m := n - len(h.reasoning)
	if len(full) <= m {
		return "", 0
	}
	ni := int(h.nInput)
	if !equalDigests(h.digests[:ni], full[:ni]) {
		return "", 0
	}
	j, r := ni, 0
	for i := ni; i < n; i++ {
		if r < len(h.reasoning) && int(h.reasoning[r]) == i {
			r++
			continue
		}
		if h.digests[i] != full[j] {
			return "", 0
		}
		j++
	}
	return modeOmittedReasoning, m
}

func equalDigests(a, b []digest) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// digest identifies one canonical conversation item: SHA-256 truncated to
// 16 bytes. Heads keep digests, never items.
type digest [16]byte

func digestOf(item []byte) digest {
	s := sha256.Sum256(item)
	var d digest
	copy(d[:], s[:16])
	return d
}

func digestAll(items [][]byte) []digest {
	out := make([]digest, len(items))
	for i, it := range items {
		out[i] = digestOf(it)
	}
	return out
}

// Match modes (docs/pool.md §3.2).
const (
	modeExact            = "exact"
	modeOmittedReasoning = "omitted_reasoning"
	kindReasoning        = "reasoning"
)

// itemKind returns an item's "type", else its "role", else "". It decodes
// only those two top-level fields.
func itemKind(item []byte) string {
	var k struct {
		Type string `json:"type"`
		Role string `json:"role"`
	}
	if json.Unmarshal(item, &k) != nil {
		return ""
	}
	if k.Type != "" {
		return k.Type
	}
	return k.Role
}

func isReasoning(item []byte) bool {
	// Cheap pre-check before decoding: a reasoning item names its type.
	if !bytes.Contains(item, []byte(`"reasoning"`)) {
		return false
	}
	return itemKind(item) == kindReasoning
}
