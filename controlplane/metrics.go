package controlplane

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// MaxTrackedAccounts bounds the accounts with per-account gauges: the
// first this many distinct keys the server admits.
const MaxTrackedAccounts = 100

type metrics struct {
	admissions [pacing.KindRefuse + 1]prometheus.Counter // indexed by pacing.Kind
	wait       prometheus.Histogram
	cancels    [2]prometheus.Counter // [refunded=false, refunded=true]
	accounts   *accountCollector
	// upstream403 counts the upgrade 403s agents reported.
	upstream403 prometheus.Counter
	// handover counts tokens debited for grants data planes handed over.
	handover prometheus.Counter
	// memberRefusals counts admissions a member's cap refused.
	memberRefusals prometheus.Counter
	// quotaUsed and quotaResets are the latest plan usage reported per
	// account and window (at most MaxTrackedAccounts accounts).
	quotaUsed, quotaResets *prometheus.GaugeVec
	quotaMu                sync.Mutex // guards quotaKeys
	quotaKeys              map[string]bool

	all []prometheus.Collector
}

func newMetrics(policies PolicyReader, info StoreInfo, now func() time.Time, agents *directory) *metrics {
	m := &metrics{}
	admissions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clodex_controlplane_admissions_total",
		Help: "Admission decisions by kind: admit (dial now), wait (admitted after a wait), refuse (nothing debited).",
	}, []string{"decision"})
	for _, k := range []pacing.Kind{pacing.KindAdmit, pacing.KindWait, pacing.KindRefuse} {
		m.admissions[k] = admissions.WithLabelValues(k.String())
	}
	m.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "clodex_controlplane_admission_wait_seconds",
		Help:    "Waits granted with wait decisions, in seconds.",
		Buckets: []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 7.5, 10, 15},
	})
	cancels := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clodex_controlplane_cancels_total",
		Help: "Cancel calls by whether they refunded a pending reservation.",
	}, []string{"refunded"})
	m.cancels[0] = cancels.WithLabelValues("false")
	m.cancels[1] = cancels.WithLabelValues("true")
	m.accounts = &accountCollector{
		policies: policies,
		now:      now,
		since:    now(),
		tokens: prometheus.NewDesc("clodex_controlplane_account_tokens",
			"Bucket level per account (negative while admitted requests wait); only the first 100 accounts admitted.",
			[]string{"account"}, nil),
		rate: prometheus.NewDesc("clodex_controlplane_account_rate_per_minute",
			"Sustained rate per account; only the first 100 accounts admitted.",
			[]string{"account"}, nil),
		effective: prometheus.NewDesc("clodex_controlplane_account_effective_rate_per_minute",
			"Rate the bucket paces at (below the sustained rate while adaptive mode backs off); only the first 100 accounts admitted.",
			[]string{"account"}, nil),
	}
	m.upstream403 = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_controlplane_upstream_403_total",
		Help: "Upstream upgrade 403s reported by agents.",
	})
	m.handover = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_controlplane_handover_debits_total",
		Help: "Tokens debited for grants data planes made locally during an outage and handed over (ReportGrants).",
	})
	m.memberRefusals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_controlplane_member_cap_refusals_total",
		Help: "Admissions refused because the member's cap (clodexctl member create --rate) was spent; the account's bucket was not asked.",
	})
	degraded := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_controlplane_store_degraded",
		Help: "1 while the store cannot be reached and this replica admits from its local share, else 0.",
	}, func() float64 {
		if info.Info().Degraded {
			return 1
		}
		return 0
	})
	liveAgents := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_controlplane_agents",
		Help: "Registered agents with an open stream.",
	}, func() float64 { return float64(agents.len()) })
	m.accounts.admissions = prometheus.NewDesc("clodex_controlplane_account_admissions_total",
		"Admission decisions per account and kind (admit, wait, refuse) made by this replica; only the first 100 accounts admitted.",
		[]string{"account", "decision"}, nil)
	m.accounts.upstream403 = prometheus.NewDesc("clodex_controlplane_account_upstream_403_total",
		"Upstream upgrade 403s per account reported by agents to this replica; only the first 100 accounts admitted.",
		[]string{"account"}, nil)
	m.quotaUsed = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "clodex_controlplane_account_quota_used_percent",
		Help: "Plan usage per account and window (primary: 5 hours, secondary: weekly) as the backend last reported it to an agent of this replica; only the first 100 accounts reported.",
	}, []string{"account", "window"})
	m.quotaResets = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "clodex_controlplane_account_quota_resets_at_seconds",
		Help: "When each account's plan usage window resets, Unix seconds (0: unknown); only the first 100 accounts reported.",
	}, []string{"account", "window"})
	m.all = []prometheus.Collector{m.quotaUsed, m.quotaResets, admissions, m.wait, cancels, m.accounts, m.upstream403, m.handover, m.memberRefusals, degraded, liveAgents}
	return m
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range m.all {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// observe records one decision; it is on the Admit hot path.
func (m *metrics) observe(key string, d pacing.Decision) {
	if d.Kind >= pacing.KindAdmit && d.Kind <= pacing.KindRefuse {
		m.admissions[d.Kind].Inc()
	}
	if d.Kind == pacing.KindWait {
		m.wait.Observe(d.Wait.Seconds())
	}
	if c := m.accounts.track(key); c != nil && d.Kind >= pacing.KindAdmit && d.Kind <= pacing.KindRefuse {
		c.decisions[d.Kind].Add(1)
	}
}

// quota records an account's latest plan usage in the gauges.
func (m *metrics) quota(key string, windows []store.QuotaWindow) {
	m.quotaMu.Lock()
	if m.quotaKeys == nil {
		m.quotaKeys = map[string]bool{}
	}
	if !m.quotaKeys[key] && len(m.quotaKeys) >= MaxTrackedAccounts {
		m.quotaMu.Unlock()
		return
	}
	m.quotaKeys[key] = true
	m.quotaMu.Unlock()
	for _, w := range windows {
		m.quotaUsed.WithLabelValues(key, w.Name).Set(w.UsedPercent)
		resets := 0.0
		if !w.ResetsAt.IsZero() {
			resets = float64(w.ResetsAt.Unix())
		}
		m.quotaResets.WithLabelValues(key, w.Name).Set(resets)
	}
}

// reported403 counts n upstream 403s an agent reported for key.
func (m *metrics) reported403(key string, n int) {
	m.upstream403.Add(float64(n))
	if c := m.accounts.lookup(key); c != nil {
		c.upstream403.Add(int64(n))
	}
}

// accountCounts are one tracked account's counters since the server
// started.
type accountCounts struct {
	decisions   [pacing.KindRefuse + 1]atomic.Int64 // indexed by pacing.Kind
	upstream403 atomic.Int64
}

func (m *metrics) cancelled(refunded bool) {
	if refunded {
		m.cancels[1].Inc()
	} else {
		m.cancels[0].Inc()
	}
}

// accountCollector exports per-account gauges, read from the store at
// scrape time, and per-account counters for a bounded set of keys: the
// first MaxTrackedAccounts the server admits.
type accountCollector struct {
	policies     PolicyReader
	now          func() time.Time
	tokens, rate *prometheus.Desc
	effective    *prometheus.Desc
	admissions   *prometheus.Desc
	upstream403  *prometheus.Desc
	// since is when counting started (the server's creation).
	since time.Time

	full atomic.Bool // set once MaxTrackedAccounts keys are tracked
	seen sync.Map    // key -> *accountCounts; lock-free lookups on the hot path

	mu   sync.Mutex // guards the following field
	keys []string
}

// lookup returns key's counters, or nil when key is not tracked.
func (c *accountCollector) lookup(key string) *accountCounts {
	if v, ok := c.seen.Load(key); ok {
		return v.(*accountCounts)
	}
	return nil
}

// track starts tracking key unless MaxTrackedAccounts keys already are,
// and returns its counters (nil when it is not tracked).
func (c *accountCollector) track(key string) *accountCounts {
	if v := c.lookup(key); v != nil || c.full.Load() {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.keys) >= MaxTrackedAccounts {
		return c.lookup(key)
	}
	v, loaded := c.seen.LoadOrStore(key, &accountCounts{})
	if !loaded {
		c.keys = append(c.keys, key)
		if len(c.keys) == MaxTrackedAccounts {
			c.full.Store(true)
		}
	}
	return v.(*accountCounts)
}

func (c *accountCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.tokens
	ch <- c.rate
	ch <- c.effective
	ch <- c.admissions
	ch <- c.upstream403
}

func (c *accountCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	keys := append([]string(nil), c.keys...)
	c.mu.Unlock()
	now := c.now()
	// prometheus.Collector.Collect has no context; the memory store ignores it.
	ctx := context.TODO()
	for _, key := range keys {
		a, err := c.policies.Account(ctx, key, now)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.tokens, prometheus.GaugeValue, a.Tokens, key)
		ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, float64(a.Policy.RatePerMinute), key)
		ch <- prometheus.MustNewConstMetric(c.effective, prometheus.GaugeValue, float64(a.EffectiveRate), key)
	}
	for _, key := range keys {
		counts := c.lookup(key)
		for _, k := range []pacing.Kind{pacing.KindAdmit, pacing.KindWait, pacing.KindRefuse} {
			ch <- prometheus.MustNewConstMetric(c.admissions, prometheus.CounterValue, float64(counts.decisions[k].Load()), key, k.String())
		}
		ch <- prometheus.MustNewConstMetric(c.upstream403, prometheus.CounterValue, float64(counts.upstream403.Load()), key)
	}
}
