package controlplane

import (
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/controlplane/store"
)

// MaxUsageSeries bounds the label pairs of each usage counter family:
// past this many (account, agent) pairs, or (member, account) pairs, the
// usage is counted under "other" for both labels.
const MaxUsageSeries = 1000

// usageCounterNames are the counter families' middle parts, in
// store.UsageCounts order.
var usageCounterNames = [6]string{"turns", "input_tokens", "cached_tokens", "output_tokens", "new_sockets", "refusals"}

// usageCounterHelp says what each family counts.
var usageCounterHelp = [6]string{
	"Turns data planes reported, every outcome",
	"Input tokens of the turns' responses as the backend counted them, the cached ones included",
	"Cached input tokens of the turns' responses",
	"Output tokens of the turns' responses",
	"New upstream sockets the turns opened",
	"Turns admission refused (429 without an upstream socket)",
}

// usageMetrics counts the usage this replica stored (each batch once,
// however often it was sent): by account and agent, and with
// Options.MemberMetrics by member and account. Summed over the replicas
// it is the fleet's. Its series are bounded by MaxUsageSeries per family.
type usageMetrics struct {
	byAgent, byMember *usageSeries // byMember nil without MemberMetrics
}

func newUsageMetrics(members bool) *usageMetrics {
	m := &usageMetrics{byAgent: newUsageSeries("clodex_controlplane_usage_%s_total", "account", "agent", "by account and agent")}
	if members {
		m.byMember = newUsageSeries("clodex_controlplane_usage_member_%s_total", "member", "account", "by member and account (--member-metrics)")
	}
	return m
}

func (m *usageMetrics) collectors() []prometheus.Collector {
	out := []prometheus.Collector{m.byAgent}
	if m.byMember != nil {
		out = append(out, m.byMember)
	}
	return out
}

// add counts a stored batch.
func (m *usageMetrics) add(b store.UsageBatch) {
	for _, r := range b.Rows {
		m.byAgent.add(r.Account, r.Agent, r.UsageCounts)
		if m.byMember != nil {
			m.byMember.add(r.Member, r.Account, r.UsageCounts)
		}
	}
}

// usageSeries is one set of six counter families over two labels.
type usageSeries struct {
	descs [6]*prometheus.Desc

	mu     sync.Mutex // guards counts
	counts map[[2]string]*store.UsageCounts
}

func newUsageSeries(nameFmt, l1, l2, what string) *usageSeries {
	u := &usageSeries{counts: map[[2]string]*store.UsageCounts{}}
	for i, n := range usageCounterNames {
		u.descs[i] = prometheus.NewDesc(fmt.Sprintf(nameFmt, n), usageCounterHelp[i]+", "+what+" (the first 1000 pairs; then other).",
			[]string{l1, l2}, nil)
	}
	return u
}

func (u *usageSeries) add(v1, v2 string, c store.UsageCounts) {
	if v1 == "" {
		v1 = "none"
	}
	k := [2]string{v1, v2}
	u.mu.Lock()
	defer u.mu.Unlock()
	cur := u.counts[k]
	if cur == nil {
		if len(u.counts) >= MaxUsageSeries {
			k = [2]string{store.UsageOther, store.UsageOther}
			cur = u.counts[k]
		}
		if cur == nil {
			cur = &store.UsageCounts{}
			u.counts[k] = cur
		}
	}
	cur.Add(c)
}

func (u *usageSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range u.descs {
		ch <- d
	}
}

func (u *usageSeries) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for k, c := range u.counts {
		for i, v := range [6]int64{c.Turns, c.InputTokens, c.CachedTokens, c.OutputTokens, c.NewSockets, c.Refusals} {
			ch <- prometheus.MustNewConstMetric(u.descs[i], prometheus.CounterValue, float64(v), k[0], k[1])
		}
	}
}
