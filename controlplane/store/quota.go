package store

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"
)

// Quota is the latest plan usage data planes reported for one account
// (the backend's codex.rate_limits). It is informational: admission does
// not read it.
type Quota struct {
	Key          string
	PlanType     string
	LimitReached bool
	// Windows are the latest report of each window, by name, sorted.
	Windows []QuotaWindow
	// ReportedAt is when the latest report was read by its data plane.
	ReportedAt time.Time
	// AgentID is the data plane that sent it.
	AgentID string
}

// QuotaWindow is one usage window of an account's plan.
type QuotaWindow struct {
	Name        string        `json:"name"`
	UsedPercent float64       `json:"used_percent"`
	Window      time.Duration `json:"window"`
	ResetsAt    time.Time     `json:"resets_at"`
	ReportedAt  time.Time     `json:"reported_at"`
}

// Merge applies report q to cur, the account's latest quota (zero when
// none), and returns the result: a report older than one already applied
// to a window leaves that window; a window the report lacks is kept.
// Every store merges reports this way.
func (cur Quota) Merge(q Quota) Quota {
	if cur.Key == "" || !q.ReportedAt.Before(cur.ReportedAt) {
		out := q
		out.Windows = nil
		if out.PlanType == "" {
			out.PlanType = cur.PlanType // a usage-limit report may not name the plan
		}
		for _, w := range cur.Windows {
			if !slices.ContainsFunc(q.Windows, func(n QuotaWindow) bool { return n.Name == w.Name }) {
				out.Windows = append(out.Windows, w)
			}
		}
		for _, w := range q.Windows {
			w.ReportedAt = q.ReportedAt
			out.Windows = append(out.Windows, w)
		}
		slices.SortFunc(out.Windows, func(a, b QuotaWindow) int { return cmp.Compare(a.Name, b.Name) })
		return out
	}
	return cur // an older report than the latest: keep the latest
}

// quotas is Memory's quota table.
type quotas struct {
	mu sync.Mutex // guards m
	m  map[string]Quota
}

// PutQuota records a report for q.Key and returns the account's quota
// before and after it.
func (m *Memory) PutQuota(_ context.Context, q Quota) (prev, next Quota, err error) {
	m.quotas.mu.Lock()
	defer m.quotas.mu.Unlock()
	if m.quotas.m == nil {
		m.quotas.m = map[string]Quota{}
	}
	prev = m.quotas.m[q.Key]
	next = prev.Merge(q)
	m.quotas.m[q.Key] = next
	return prev, next, nil
}

// Quotas returns the latest quota of key, or of every account when key is
// "", ordered by key.
func (m *Memory) Quotas(_ context.Context, key string) ([]Quota, error) {
	m.quotas.mu.Lock()
	defer m.quotas.mu.Unlock()
	var out []Quota
	for k, q := range m.quotas.m {
		if key == "" || k == key {
			out = append(out, q)
		}
	}
	slices.SortFunc(out, func(a, b Quota) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}
