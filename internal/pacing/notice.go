package pacing

import "sync"

// Fixed notice keys. Keys derived from a value always carry a namespace prefix ending in ':',
// so no value can equal one of these.
const (
	KeyPacingDisabled = "pacing.disabled" // the wait bound is zero; pacing turned itself off
	KeyPacingOff      = "pacing.off"      // the rate is a literal 0
	KeyPacingNoRefuse = "pacing.norefuse" // pacing without refusals (low rate or no retries)
	KeyCeilingRelaxed = "pacing.relaxed"  // an admission past the ceiling
)

// Notice is a one-time operator message; Key is namespaced ("rate.malformed:<value>",
// "pacing.disabled", ...).
type Notice struct {
	Key     string
	Message string
}

// Notices deduplicates notices by Key; safe for concurrent use. The zero value is ready.
type Notices struct {
	mu   sync.Mutex // guards the following field
	seen map[string]struct{}
}

// Emit calls emit with the notice's message the first time its key is seen and reports
// whether it did. emit runs synchronously, outside the lock; a nil emit only records the key.
func (n *Notices) Emit(notice Notice, emit func(message string)) bool {
	n.mu.Lock()
	if _, ok := n.seen[notice.Key]; ok {
		n.mu.Unlock()
		return false
	}
	if n.seen == nil {
		n.seen = make(map[string]struct{})
	}
	n.seen[notice.Key] = struct{}{}
	n.mu.Unlock()
	if emit != nil {
		emit(notice.Message)
	}
	return true
}
