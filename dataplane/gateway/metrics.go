package gateway

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec   // by HTTP status
	turns    *prometheus.HistogramVec // by outcome
	dials    *prometheus.CounterVec   // by result
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
			Help: "Upstream WebSocket dials, by result (ok, refused, error).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.turns, m.dials} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register gateway metrics: %w", err)
		}
	}
	return m, nil
}
