package gateway

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests      *prometheus.CounterVec   // by HTTP status
	turns         *prometheus.HistogramVec // by outcome
	dials         *prometheus.CounterVec   // by result
	failedTurns   *prometheus.CounterVec   // by what the client got
	pacerRefusals prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_dataplane_requests_total",
			Help: "HTTP requests answered by the data plane, by status code.",
		}, []string{"status"}),
		turns: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "clodex_dataplane_turn_seconds",
			Help:    "Duration of /v1/messages turns from dial to the end of the response, by outcome.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600},
		}, []string{"outcome"}),
		dials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_dataplane_upstream_dials_total",
			Help: "Upstream WebSocket dials, by result (ok; refused: by the pacer or with an upgrade status; error: no socket opened; skipped: not tried, the upstream is known unreachable).",
		}, []string{"result"}),
		failedTurns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_dataplane_failed_turns_total",
			Help: "/v1/messages turns that ended in an error the client saw, by the HTTP status it got, or \"stream\" for an SSE error event after a 200.",
		}, []string{"status"}),
		pacerRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_dataplane_pacer_refusals_total",
			Help: "Attempts the pacer refused a new upstream socket (each is retried after its hint, or answered 429 when the retries are spent).",
		}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.turns, m.dials, m.failedTurns, m.pacerRefusals} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	return m, nil
}
