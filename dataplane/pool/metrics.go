package pool

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons for [Lease.Replace] (metric label values; anything else counts
// as "other").
const (
	ReplacePreviousResponseNotFound = "previous_response_not_found"
	ReplaceTransport                = "transport"
	ReplaceConnectionLimit          = "websocket_connection_limit_reached"
)

func metricLabel(reason string) string {
	switch reason {
	case ReplacePreviousResponseNotFound, ReplaceTransport, ReplaceConnectionLimit:
		return reason
	}
	return "other"
}

// Stats is a snapshot of the pool's counters since New.
type Stats struct {
	// Acquires counts requests that got a socket (including rotations),
	// Continuations those that reused a head, NewSockets every socket
	// opened (new heads, parallel heads, unpartitioned, rotations,
	// replacements).
	Acquires, Continuations, NewSockets uint64
	// Decisions counts successful acquisitions by decision.
	Decisions map[string]uint64
	// Misses counts requests that needed a new socket, by Miss* reason.
	Misses map[string]uint64
	// Evictions counts heads removed, by Evict* reason.
	Evictions map[string]uint64
	// ParallelHeads counts sockets opened for a parallel request (kept as
	// heads); SavedSockets those that were later reused, each a new socket
	// the original design (close parallel sockets) would have opened.
	ParallelHeads, SavedSockets uint64
	// Rematches counts requests that found a head after waiting for
	// admission and so did not dial; ReturnedAdmissions those whose wait
	// the freed head ended, so the Admitter handed the reservation back.
	Rematches, ReturnedAdmissions uint64
	// Rotations counts sockets replaced for age; RotationsDeferred turns
	// that stayed on the old socket because the new one was refused.
	Rotations, RotationsDeferred uint64
	// Replacements counts Lease.Replace calls.
	Replacements uint64
	// KeptSockets counts sockets kept after a failed response
	// (Lease.Release); KeptSocketReuses the requests that then sent their
	// full context on one instead of dialing (DecisionKeptSocket);
	// KeptSocketsFailed kept sockets that failed later, on their next
	// attempt or while idle.
	KeptSockets, KeptSocketReuses, KeptSocketsFailed uint64
	// Discards counts Lease.Discard calls, by the reason given.
	Discards map[string]uint64
	// DescriptorExhaustions counts dials that ran out of descriptors;
	// ShedConnections the idle heads closed to make room.
	DescriptorExhaustions, ShedConnections uint64
	// InputTokens and CachedTokens sum the usage given to Complete.
	InputTokens, CachedTokens int64
	// Nursery, Established and InFlight count registered heads now.
	Nursery, Established, InFlight int
}

// ReuseRatio is Continuations / Acquires (0 with no acquisitions).
func (s Stats) ReuseRatio() float64 {
	if s.Acquires == 0 {
		return 0
	}
	return float64(s.Continuations) / float64(s.Acquires)
}

// CachedRatio is CachedTokens / InputTokens (0 with no input).
func (s Stats) CachedRatio() float64 {
	if s.InputTokens <= 0 {
		return 0
	}
	return float64(s.CachedTokens) / float64(s.InputTokens)
}

func newStats() Stats {
	return Stats{
		Decisions: map[string]uint64{},
		Misses:    map[string]uint64{},
		Evictions: map[string]uint64{},
		Discards:  map[string]uint64{},
	}
}

// Stats returns a snapshot of the counters.
func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Decisions = maps.Clone(p.stats.Decisions)
	s.Misses = maps.Clone(p.stats.Misses)
	s.Evictions = maps.Clone(p.stats.Evictions)
	s.Discards = maps.Clone(p.stats.Discards)
	s.Nursery, s.Established, s.InFlight = p.nNursery, p.nEstablish, p.nBusy
	return s
}

type metrics struct {
	decisions    *prometheus.CounterVec
	misses       *prometheus.CounterVec
	evictions    *prometheus.CounterVec
	replacements *prometheus.CounterVec
	// failedAttemptSockets: what became of a failed attempt's socket (kept.go)
	failedAttemptSockets *prometheus.CounterVec
	rematches            prometheus.Counter
	savedSockets         prometheus.Counter
	rotations            prometheus.Counter
	rotationsDeferred    prometheus.Counter
	shed                 prometheus.Counter
	inputTokens          prometheus.Counter
	cachedTokens         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, p *Pool) (*metrics, error) {
	const ns, sub = "clodex", "dataplane_pool"
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "decisions_total",
			Help: "Requests given a socket, by head decision; reuse ratio = continuation / all."}, []string{"decision"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "misses_total",
			Help: "Requests that needed a new socket, by reason."}, []string{"reason"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "evictions_total",
			Help: "Heads removed, by reason."}, []string{"reason"}),
		replacements: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "replacements_total",
			Help: "Sockets replaced before any output, by reason."}, []string{"reason"}),
		failedAttemptSockets: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "failed_attempt_sockets_total",
			Help: "Sockets of failed attempts: kept after a response failed on a healthy socket, closed because the socket failed, or closed because a kept socket failed later (a backend that dislikes reuse)."}, []string{"reason"}),
		rematches: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rematches_after_admission_total",
			Help: "Requests that reused a head freed while they waited for admission."}),
		savedSockets: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "saved_sockets_total",
			Help: "Parallel sockets kept as heads and later reused (new sockets saved)."}),
		rotations: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rotations_total",
			Help: "Head sockets replaced at a turn boundary for age."}),
		rotationsDeferred: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "rotations_deferred_total",
			Help: "Rotations refused or failed; the turn used the old socket."}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "descriptor_shed_connections_total",
			Help: "Idle heads closed because a dial ran out of file descriptors."}),
		inputTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "input_tokens_total",
			Help: "Input tokens of completed responses."}),
		cachedTokens: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "cached_input_tokens_total",
			Help: "Cached input tokens of completed responses; cached ratio = this / input_tokens_total."}),
	}
	for _, r := range []string{SocketKept, SocketFailed, KeptSocketFailed} {
		m.failedAttemptSockets.WithLabelValues(r) // shown as 0 until it happens
	}
	if reg == nil {
		return m, nil
	}
	heads := func(gen string, get func(s Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "heads",
			Help: "Registered heads by generation (in_flight counts busy heads of both).", ConstLabels: prometheus.Labels{"generation": gen}},
			func() float64 { return float64(get(p.Stats())) })
	}
	for _, c := range []prometheus.Collector{
		m.decisions, m.misses, m.evictions, m.replacements, m.failedAttemptSockets, m.rematches, m.savedSockets, m.rotations,
		m.rotationsDeferred, m.shed, m.inputTokens, m.cachedTokens,
		heads(GenerationNursery, func(s Stats) int { return s.Nursery }),
		heads(GenerationEstablished, func(s Stats) int { return s.Established }),
		heads("in_flight", func(s Stats) int { return s.InFlight }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
