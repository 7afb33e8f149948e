package pool

import (
	"context"
	"fmt"

	"github.com/clodex/clodex/dataplane/upstream"
)

// Lease is one request's use of a socket. The caller sends on Conn:
// PreviousResponseID (when non-empty) and items[Delta:] as the input, with
// the current request's instructions, tools and other fields (the backend
// requires them on every frame). It ends the lease with exactly one of
// Complete, Discard, or a successful Replace (which returns the lease that
// takes over), or [Lease.Release] after a response that failed on a
// healthy socket. The exported fields are read-only.
type Lease struct {
	// Conn is the socket to send the turn on and read the response from
	// (Frames or Next). The lease's end closes it or keeps it as a head.
	Conn *upstream.Conn
	// PreviousResponseID is the head's response id on a continuation, ""
	// when the full context must be sent.
	PreviousResponseID string
	// Delta is the index into the request's items where the sent input
	// starts: 0 means the full input.
	Delta int
	// Decision is one of the Decision* constants.
	Decision string
	// Generation is the socket's generation after this decision.
	Generation string
	// Reused reports a continuation on an existing socket.
	Reused bool
	// MatchMode is "exact" or "omitted_reasoning" on a continuation.
	MatchMode string
	// CachedTokens is, on a continuation, the conversation the socket
	// holds in the backend's tokens (the input plus output of the response
	// it continues, as Complete was told); 0 otherwise.
	CachedTokens int64
	// ConnectionID is the socket's process-unique id (diagnostics).
	ConnectionID uint64

	p    *Pool
	h    *head // nil for an unpartitioned socket
	part Partition
	req  []digest // digests of the request's full input
	// admitted reports that the request was admitted for a new socket
	// (and kept that admission): its replacement does not ask again.
	admitted bool

	// guarded by p.mu
	done     bool
	replaced bool // this lease is a replacement: no second one
}

// Complete records a completed response: the socket becomes (or stays) a
// head whose conversation is the request's full input followed by output,
// the response's output items in canonical echo shape (docs/pool.md §4, in
// output_index order). An empty responseID, an unpartitioned socket or a
// head dropped meanwhile closes the socket instead.
func (l *Lease) Complete(responseID string, output [][]byte, usage Usage) {
	p := l.p
	out := digestAll(output)
	var reasoning []int32
	for i, it := range output {
		if isReasoning(it) {
			reasoning = append(reasoning, int32(len(l.req)+i))
		}
	}
	now := p.now()
	p.mu.Lock()
	if l.done {
		p.mu.Unlock()
		return
	}
	l.done = true
	p.stats.InputTokens += usage.InputTokens
	p.stats.CachedTokens += usage.CachedTokens
	p.metrics.inputTokens.Add(float64(max(usage.InputTokens, 0)))
	p.metrics.cachedTokens.Add(float64(max(usage.CachedTokens, 0)))
	h := l.h
	if h == nil || h.removed || responseID == "" {
		if h != nil && !h.removed {
			p.removeLocked(h)
		}
		p.mu.Unlock()
		closeSocket(h, l.Conn) // response done; the socket is not kept
		return
	}
	h.ttlPaused += now.Sub(h.inFlightSince)
	h.lastUsed = now
	h.responseID = responseID
	h.kept = false
	h.tokens = usage.InputTokens + usage.OutputTokens
	d := make([]digest, 0, len(l.req)+len(out))
	h.digests = append(append(d, l.req...), out...)
	h.nInput = int32(len(l.req))
	h.reasoning = reasoning
	p.releaseLocked(h)
	p.headFreedLocked(h)
	p.mu.Unlock()
}

// Discard ends the lease after a failure or cancellation: the socket is
// closed at once and its head dropped. reason is counted in
// [Stats.Discards]; [DiscardSocketFailed] also in
// clodex_dataplane_pool_failed_attempt_sockets_total. A response that
// failed on a healthy socket ends with [Lease.Release] instead.
func (l *Lease) Discard(reason string) {
	p := l.p
	p.mu.Lock()
	if l.done {
		p.mu.Unlock()
		return
	}
	l.done = true
	if reason == DiscardSocketFailed {
		p.countSocketFailedLocked(l.h)
	}
	if l.h != nil && !l.h.removed {
		p.removeLocked(l.h)
	}
	p.stats.Discards[reason]++
	p.mu.Unlock()
	closeSocket(l.h, l.Conn)
}

// Replace closes the lease's socket and opens a new one for the same
// request with the full context: after previous_response_not_found, a
// transport failure before any output, or
// websocket_connection_limit_reached. Every new socket asks the Admitter
// first, except the replacement of a socket this request was itself
// admitted for (a new head, a rotation, an unpartitioned socket): a turn
// that continued a held socket asks like any new request, so a storm of
// dropped sockets is paced like new conversations. Replace does not evict
// for caps. A persistent socket stays registered as a fresh nursery head.
// One replacement per request: Replace on a replacement returns
// ErrReplaceSpent and leaves the lease as it is. When admission refuses
// (the error wraps the Admitter's) or the dial fails, the head is dropped
// and the lease is finished.
func (l *Lease) Replace(ctx context.Context, reason string) (*Lease, error) {
	p := l.p
	p.mu.Lock()
	if l.done {
		p.mu.Unlock()
		return nil, ErrLeaseDone
	}
	if l.replaced {
		p.mu.Unlock()
		return nil, ErrReplaceSpent
	}
	l.done = true
	h := l.h
	if reason == ReplaceTransport {
		p.countSocketFailedLocked(h)
	}
	if h != nil && !h.removed {
		p.setGenLocked(h, GenerationNursery)
		h.conn = nil
		h.responseID = ""
	}
	p.stats.Replacements++
	p.metrics.replacements.WithLabelValues(metricLabel(reason)).Inc()
	p.mu.Unlock()
	closeSocket(h, l.Conn) // replaced

	var err error
	outcome := "dial_failed"
	if !l.admitted {
		if err = p.admit(ctx, l.part.Account); err != nil {
			outcome = "admission_refused"
		}
	}
	var conn *upstream.Conn
	if err == nil {
		conn, err = p.dial(ctx, l.part)
	}
	now := p.now()
	p.mu.Lock()
	if err != nil {
		if h != nil && !h.removed {
			p.removeLocked(h)
		}
		p.mu.Unlock()
		if p.cfg.Diagnostics != nil {
			p.writeReplacement(l, 0, reason, outcome)
		}
		return nil, fmt.Errorf("replace socket: %w", err)
	}
	p.nextID++
	id := p.nextID
	gen := GenerationIsolated
	if h != nil {
		h.id = id
		p.setConnLocked(h, conn)
		h.created = now
		h.ttlPaused = 0
		h.inFlightSince = now
		gen = GenerationNursery
	}
	p.stats.NewSockets++
	p.mu.Unlock()
	if p.cfg.Diagnostics != nil {
		p.writeReplacement(l, id, reason, "ok")
	}
	return &Lease{
		Conn:         conn,
		Decision:     DecisionReplacement,
		Generation:   gen,
		ConnectionID: id,
		p:            p,
		h:            h,
		part:         l.part,
		req:          l.req,
		replaced:     true,
		admitted:     true,
	}, nil
}
