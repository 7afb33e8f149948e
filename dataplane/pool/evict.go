package pool

import (
	"time"
)

// expiryLocked returns why idle head h must go at now, or "".
func (p *Pool) expiryLocked(h *head, now time.Time) string {
	physical := now.Sub(h.created)
	switch {
	case physical-h.ttlPaused >= p.cfg.HardTTL:
		return EvictHardTTL
	case physical >= p.cfg.MaxSocketAge:
		return EvictMaxSocketAge
	}
	idle := now.Sub(h.lastUsed)
	if h.gen == GenerationNursery {
		if idle >= p.cfg.NurseryIdleTTL {
			return EvictNurseryIdleTTL
		}
		return ""
	}
	if idle >= p.cfg.IdleTTL {
		return EvictIdleTTL
	}
	return ""
}

// sweepLocked unregisters every expired idle head of the pool and appends
// it to evicted (the caller closes their sockets after unlocking). The
// caller calls it only when the earliest idle deadline (nextSweep) has
// passed, so a request costs O(1) while nothing expires.
func (p *Pool) sweepLocked(now time.Time, evicted []*head, rec *decisionRecord) []*head {
	p.nextSweep = time.Time{}
	for key, pt := range p.parts {
		kept := pt.heads[:0]
		for _, h := range pt.heads {
			if !h.busy {
				if reason := p.expiryLocked(h, now); reason != "" {
					h.removed = true
					p.adjustGenLocked(h.gen, -1)
					p.disarmLocked(h)
					p.countEvictionLocked(reason, h, rec)
					evicted = append(evicted, h)
					continue
				}
				p.noteIdleLocked(h)
			}
			kept = append(kept, h)
		}
		clear(pt.heads[len(kept):])
		pt.heads = kept
		if len(kept) == 0 {
			delete(p.parts, key)
		}
	}
	return evicted
}

// evictCapLocked evicts idle heads of generation gen, least recently used
// first, while the generation holds at least limit heads (busy or idle).
// except is never evicted. The caller calls it only for a cap (limit > 0;
// 0 means unbounded).
func (p *Pool) evictCapLocked(gen string, limit int, except *head, evicted []*head, rec *decisionRecord) []*head {
	reason := EvictNurseryCap
	count := &p.nNursery
	if gen == GenerationEstablished {
		reason = EvictEstablishedCap
		count = &p.nEstablish
	}
	for *count >= limit {
		var oldest *head
		for _, pt := range p.parts {
			for _, h := range pt.heads {
				if h.busy || h == except || h.gen != gen {
					continue
				}
				if oldest == nil || h.lastUsed.Before(oldest.lastUsed) {
					oldest = h
				}
			}
		}
		if oldest == nil {
			break
		}
		p.removeLocked(oldest)
		p.countEvictionLocked(reason, oldest, rec)
		evicted = append(evicted, oldest)
	}
	return evicted
}

func (p *Pool) countEvictionLocked(reason string, h *head, rec *decisionRecord) {
	p.stats.Evictions[reason]++
	p.metrics.evictions.WithLabelValues(reason).Inc()
	if rec != nil {
		rec.Evictions = append(rec.Evictions, evictionRecord{
			ConnectionID:  h.id,
			PartitionHash: h.part.hash,
			Generation:    h.gen,
			Reason:        reason,
		})
	}
}
