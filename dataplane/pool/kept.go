package pool

import "time"

// A socket kept after a failed response (docs/pool.md §7.1): a response
// that failed with a frame that ended it (response.failed, an error event)
// leaves a healthy socket. Closing it would make the retry, and the
// conversation's next turn, dial again: during an outage every failed
// request would spend one of the account's new connections. Instead the
// lease ends with Release: the socket stays registered in its partition,
// idle and watched, without a conversation (no response id: the failed
// response cannot be continued). The partition's next request that
// continues no head takes it (DecisionKeptSocket) and sends the full
// context on it, without admission.

// DecisionKeptSocket reuses a socket kept after a failed response
// ([Lease.Release]): no head matched, and the request sends the full
// context on the kept socket instead of dialing.
const DecisionKeptSocket = "kept_socket"

// DiscardSocketFailed is the [Lease.Discard] reason of an attempt whose
// socket itself failed (a send or a read failed, the backend closed it);
// it is counted in clodex_dataplane_pool_failed_attempt_sockets_total.
const DiscardSocketFailed = "socket failed"

// Reasons of clodex_dataplane_pool_failed_attempt_sockets_total: what
// became of the socket of an attempt that failed.
const (
	// SocketKept: the response failed on a healthy socket, kept
	// ([Lease.Release]).
	SocketKept = "kept_after_failed_response"
	// SocketFailed: the socket itself failed or the backend closed it
	// ([DiscardSocketFailed], a Replace for [ReplaceTransport]).
	SocketFailed = "closed_socket_failed"
	// KeptSocketFailed: a socket kept after a failed response failed
	// later, on its next attempt or while idle (closed by the backend,
	// lost, an unexpected frame). A backend that dislikes the reuse of a
	// socket whose response failed shows here.
	KeptSocketFailed = "closed_kept_socket_failed"
)

// Release ends the lease after a response that failed with a frame that
// ended it, on a socket that is still healthy: the socket is kept, idle,
// in its partition, without its head's conversation, and the partition's
// next request that continues no head resends its full context on it
// (DecisionKeptSocket) instead of dialing. An unpartitioned socket, or one
// whose head was dropped meanwhile, is closed instead. It is counted in
// [Stats.KeptSockets].
func (l *Lease) Release() {
	p := l.p
	now := p.now()
	p.mu.Lock()
	if l.done {
		p.mu.Unlock()
		return
	}
	l.done = true
	h := l.h
	if h == nil || h.removed || h.conn != l.Conn {
		p.mu.Unlock()
		closeSocket(h, l.Conn)
		return
	}
	h.ttlPaused += now.Sub(h.inFlightSince)
	h.lastUsed = now
	h.responseID = ""
	h.digests, h.nInput, h.reasoning, h.tokens = nil, 0, nil, 0
	h.kept = true
	p.setGenLocked(h, GenerationNursery) // no cached conversation to keep long
	p.stats.KeptSockets++
	p.metrics.failedAttemptSockets.WithLabelValues(SocketKept).Inc()
	p.releaseLocked(h)
	p.mu.Unlock()
}

// countSocketFailedLocked counts the close of h's socket (nil: an
// unpartitioned socket) because it failed.
func (p *Pool) countSocketFailedLocked(h *head) {
	reason := SocketFailed
	if h != nil && h.kept {
		reason = KeptSocketFailed
		p.stats.KeptSocketsFailed++
	}
	p.metrics.failedAttemptSockets.WithLabelValues(reason).Inc()
}

// keptLocked claims an idle socket of pt kept after a failed response and
// younger than RotateAge, or returns nil.
func (p *Pool) keptLocked(pt *partition, now time.Time) *head {
	if pt == nil {
		return nil
	}
	for _, h := range pt.heads {
		if !h.kept || h.busy || h.dead || h.responseID != "" || h.conn == nil || now.Sub(h.created) >= p.cfg.RotateAge {
			continue
		}
		if p.claimLocked(h) {
			return h
		}
	}
	return nil
}

// takeKeptLocked hands kept socket h (claimed) to the request: the full
// context on it.
func (p *Pool) takeKeptLocked(h *head, full []digest, now time.Time, rec *decisionRecord) *Lease {
	p.reserveLocked(h, now)
	p.countDecisionLocked(DecisionKeptSocket)
	if rec != nil {
		rec.Decision = DecisionKeptSocket
		rec.Generation = h.gen
		rec.SelectedConnectionID = h.id
		rec.fillCountsLocked(p)
	}
	return &Lease{
		Conn:         h.conn,
		Decision:     DecisionKeptSocket,
		Generation:   h.gen,
		Reused:       true,
		ConnectionID: h.id,
		p:            p,
		h:            h,
		part:         h.part.key,
		req:          full,
	}
}
