package pool

import (
	"context"
	"fmt"

	"github.com/clodex/clodex/dataplane/upstream"
)

// The acquisitions that always open a new socket outside the head
// lifecycle of acquire.go: a request without a partition gets a socket of
// its own (docs/pool.md §2), and a head whose socket reached RotateAge is
// moved to a new one carrying the full context (§9).

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
	var conn *upstream.Conn
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
			if dropped {
				closeSocket(h, h.conn)
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
			l := p.continueLocked(m, full, now, rec, &evicted) // h stays in flight, on its old socket
			l.admitted = admitted                              // admitted, but the dial failed
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
		closeSocket(h, old)
		if rec != nil {
			rec.Decision = DecisionRotation
			rec.Outcome = "rotation_failed"
		}
		return nil, fmt.Errorf("rotate socket: %w", err)
	}
	old := h.conn
	p.nextID++
	h.id = p.nextID
	p.setConnLocked(h, conn)
	h.created = now
	h.ttlPaused = 0
	h.inFlightSince = now
	gen := h.gen
	var evicted []*head
	if gen == GenerationNursery && !h.removed {
		if limit := p.cfg.MaxConnections; limit > 0 {
			evicted = p.evictCapLocked(GenerationEstablished, limit, h, evicted, rec)
		}
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
	closeSocket(h, old) // rotated: the socket reached its rotation age
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
