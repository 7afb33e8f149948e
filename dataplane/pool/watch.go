package pool

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/clodex/clodex/dataplane/upstream"
)

// Losing an idle head (docs/pool.md §9.4): its socket's own reader hands
// what the socket says next to idleLost, or its keepalive ping goes
// unanswered, and the head is dropped. The watch and the timer are started
// as a head is released and stopped as it is reserved (watchLocked,
// armLocked, claimLocked and disarmLocked, with the heads in pool.go).

// idleLost is h's watch: the idle socket c closed, failed or sent a frame.
// It runs on c's reader, which stopped reading.
func (p *Pool) idleLost(h *head, c *upstream.Conn, err error) {
	l := classifyIdle(err)
	p.mu.Lock()
	rec, ok := p.dropLocked(h, c, l)
	p.mu.Unlock()
	if ok {
		p.finishDrop(h, c, rec, true)
	}
}

// keepalive is a timer callback (owned by h: whoever closes its socket
// waits for it). It pings the idle socket c; on a pong it schedules the
// next ping, without one it drops the head.
func (p *Pool) keepalive(h *head, c *upstream.Conn, seq uint64) {
	defer h.pings.Done()
	p.mu.Lock()
	stale := seq != h.pingSeq
	p.mu.Unlock()
	if stale {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.KeepaliveTimeout) // not a request's
	err := c.Ping(ctx)
	cancel()
	p.mu.Lock()
	if seq != h.pingSeq {
		// A request took the head, or it was closed: not ours to judge.
		p.mu.Unlock()
		return
	}
	if err == nil {
		p.armLocked(h)
		p.mu.Unlock()
		return
	}
	l := lostHow{reason: EvictConnectionLost}
	if errors.Is(err, context.DeadlineExceeded) {
		l.reason = EvictKeepaliveTimeout
	}
	rec, ok := p.dropLocked(h, c, l)
	p.mu.Unlock()
	if ok {
		p.finishDrop(h, c, rec, false)
	}
}

// lostHow is why an idle head is dropped.
type lostHow struct {
	reason    string // EvictPeerClosed, EvictConnectionLost, EvictUnexpectedFrame or EvictKeepaliveTimeout
	closeCode int    // the peer's close code (EvictPeerClosed)
	frameType string // the unexpected frame's "type", bounded (EvictUnexpectedFrame)
}

// classifyIdle says what the watch of an idle socket was told.
func classifyIdle(err error) lostHow {
	var uf *upstream.UnexpectedFrameError
	if errors.As(err, &uf) {
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(uf.Frame, &ev)
		return lostHow{reason: EvictUnexpectedFrame, frameType: boundedID(ev.Type)}
	}
	if code := upstream.CloseStatus(err); code != -1 {
		return lostHow{reason: EvictPeerClosed, closeCode: int(code)}
	}
	return lostHow{reason: EvictConnectionLost}
}

// dropLocked unregisters h if it is still idle and served by c. The caller
// then calls finishDrop.
func (p *Pool) dropLocked(h *head, c *upstream.Conn, l lostHow) (*lostRecord, bool) {
	if h.removed || h.busy || h.conn != c {
		return nil, false
	}
	now := p.now()
	p.removeLocked(h)
	p.countEvictionLocked(l.reason, h, nil)
	if h.kept {
		p.countSocketFailedLocked(h)
	}
	p.drops.Add(1)
	return &lostRecord{
		Event:                      "ws_head_lost",
		Time:                       now.UTC(),
		Reason:                     l.reason,
		CloseCode:                  l.closeCode,
		FrameType:                  l.frameType,
		ConnectionID:               h.id,
		PartitionHash:              h.part.hash,
		Generation:                 h.gen,
		IdleMs:                     now.Sub(h.lastUsed).Milliseconds(),
		PhysicalAgeMs:              now.Sub(h.created).Milliseconds(),
		NurseryConnectionCount:     p.nNursery,
		EstablishedConnectionCount: p.nEstablish,
	}, true
}

// finishDrop closes a dropped head's socket, waits for its keepalive
// (unless it runs in it) and reports the drop. Pool.Close waits for it.
func (p *Pool) finishDrop(h *head, c *upstream.Conn, rec *lostRecord, waitPings bool) {
	defer p.drops.Done()
	_ = c.CloseNow()
	if waitPings {
		h.pings.Wait()
	}
	p.cfg.Logger.Debug("idle head dropped", "reason", rec.Reason, "connection_id", rec.ConnectionID,
		"close_code", rec.CloseCode, "frame_type", rec.FrameType, "idle_ms", rec.IdleMs)
	if p.cfg.Diagnostics != nil {
		p.writeJSON(rec)
	}
}
