package redisstore

import (
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// redisMetrics are the Redis store's metrics.
type redisMetrics struct {
	seconds         *prometheus.HistogramVec
	errors          *prometheus.CounterVec
	observers       sync.Map // op -> prometheus.Observer
	opened          prometheus.Counter
	handover        prometheus.Counter
	replicaHandover prometheus.Counter
	fallback        prometheus.Counter
	losses          prometheus.Counter
	restored        *prometheus.CounterVec
	restoreSeconds  prometheus.Gauge
	badRecords      *prometheus.CounterVec
	all             []prometheus.Collector
}

func newRedisMetrics(r *Store) *redisMetrics {
	m := &redisMetrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "clodex_controlplane_redis_call_seconds",
			Help:    "Latency of Redis calls by operation (each bounded by the Redis deadline).",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25},
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "clodex_controlplane_redis_errors_total",
			Help: "Failed Redis calls by operation (timeouts, connection errors, Redis errors).",
		}, []string{"op"}),
		opened: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_controlplane_redis_breaker_opened_total",
			Help: "Times the Redis breaker opened (this replica switched to its local share).",
		}),
		handover: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_controlplane_redis_handover_debits_total",
			Help: "Tokens debited in Redis for grants made elsewhere (hand-overs from data planes and from replicas after an outage).",
		}),
		replicaHandover: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_controlplane_redis_replica_handover_debits_total",
			Help: "Tokens this replica handed over to Redis for admissions it made from its local share while Redis was unreachable.",
		}),
		fallback: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "clodex_controlplane_redis_fallback_admissions_total",
			Help: "Admissions this replica decided from its local share because Redis could not be reached.",
		}),
	}
	m.losses = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_controlplane_store_losses_total",
		Help: "Times this replica found that Redis lost data (its epoch gone or changed, or its policy version gone back) and wrote its copy of the durable state back.",
	})
	m.restored = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clodex_controlplane_store_restored_records_total",
		Help: "Durable records this replica wrote back into Redis (after a loss, from a backup, or a restore), by kind: policy, sign_in, agent_credential, member.",
	}, []string{"kind"})
	for _, k := range []string{"policy", "sign_in", "agent_credential", "member"} {
		m.restored.WithLabelValues(k)
	}
	m.restoreSeconds = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clodex_controlplane_store_restore_seconds",
		Help: "How long this replica's last write-back after a loss took, from finding the loss to the durable state back in Redis.",
	})
	m.badRecords = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clodex_controlplane_store_unreadable_records_total",
		Help: "Records this replica found unreadable in Redis (each counted once until readable again), by kind: policy, sign_in, agent_credential, member, member_state, quota, account_state.",
	}, []string{"kind"})
	for _, k := range []string{"policy", "sign_in", "agent_credential", "member", "member_state", "quota", "account_state"} {
		m.badRecords.WithLabelValues(k)
	}
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_controlplane_redis_breaker_open",
		Help: "1 while the Redis breaker is open and this replica admits from its local share, else 0.",
	}, func() float64 {
		if r.breaker.isOpen() {
			return 1
		}
		return 0
	})
	replicas := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_controlplane_redis_replicas",
		Help: "Live control-plane replicas registered in Redis, as last read.",
	}, func() float64 { return float64(r.replicas.Load()) })
	deadline := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_controlplane_redis_deadline_seconds",
		Help: "The deadline of a Redis call now: 4 x the slowest call of the last 10 s, between --redis-timeout and --redis-max-timeout.",
	}, func() float64 { return r.deadline.get().Seconds() })
	m.all = []prometheus.Collector{m.seconds, m.errors, m.opened, m.handover, m.replicaHandover, m.fallback, open, replicas, deadline,
		m.losses, m.restored, m.restoreSeconds, m.badRecords}
	return m
}

func (m *redisMetrics) register(reg prometheus.Registerer) error {
	for _, c := range m.all {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *redisMetrics) observe(op string, d time.Duration, err error) {
	o, ok := m.observers.Load(op)
	if !ok {
		o, _ = m.observers.LoadOrStore(op, m.seconds.WithLabelValues(op))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
	if err != nil && !errors.Is(err, redis.Nil) {
		m.errors.WithLabelValues(op).Inc()
	}
}

func (m *redisMetrics) breakerOpen() { m.opened.Inc() }
