package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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

// merge applies report q to the account's latest quota cur (zero when
// none) and returns the result: a report older than one already applied
// to a window leaves that window; a window the report lacks is kept.
func merge(cur, q Quota) Quota {
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
	next = merge(prev, q)
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

// quotaRecord is a quota as Redis keeps it (JSON in one hash field per
// account).
type quotaRecord struct {
	PlanType     string        `json:"plan_type"`
	LimitReached bool          `json:"limit_reached"`
	Windows      []QuotaWindow `json:"windows"`
	ReportedAt   time.Time     `json:"reported_at"`
	AgentID      string        `json:"agent_id"`
}

func (r *Redis) quotasKey() string { return r.prefix + "quotas" }

// PutQuota records a report for q.Key in Redis, shared by every replica
// (a read, a merge and a write: two replicas writing one account at once
// keep one of the two reports, which the next report repairs). While
// Redis cannot be reached it fails with ErrUnavailable.
func (r *Redis) PutQuota(ctx context.Context, q Quota) (prev, next Quota, err error) {
	err = r.call(ctx, "quota", func(ctx context.Context) error {
		v, err := r.client.HGet(ctx, r.quotasKey(), q.Key).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return err
		default:
			if prev, err = decodeQuota(q.Key, v); err != nil {
				return err
			}
		}
		next = merge(prev, q)
		b, err := json.Marshal(quotaRecord{PlanType: next.PlanType, LimitReached: next.LimitReached,
			Windows: next.Windows, ReportedAt: next.ReportedAt, AgentID: next.AgentID})
		if err != nil {
			return err
		}
		return r.client.HSet(ctx, r.quotasKey(), q.Key, b).Err()
	})
	if err != nil {
		return Quota{}, Quota{}, r.writeErr(ctx, "put quota", err)
	}
	return prev, next, nil
}

// Quotas returns the latest quota of key, or of every account when key is
// "", ordered by key.
func (r *Redis) Quotas(ctx context.Context, key string) ([]Quota, error) {
	var vals map[string]string
	err := r.call(ctx, "quotas", func(ctx context.Context) error {
		if key != "" {
			v, err := r.client.HGet(ctx, r.quotasKey(), key).Result()
			if errors.Is(err, redis.Nil) {
				return nil
			}
			vals = map[string]string{key: v}
			return err
		}
		var err error
		vals, err = r.client.HGetAll(ctx, r.quotasKey()).Result()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("quotas: %w: redis %s unreachable (%v)", ErrUnavailable, r.addr, err)
	}
	out := make([]Quota, 0, len(vals))
	for k, v := range vals {
		q, err := decodeQuota(k, v)
		if err != nil {
			return nil, fmt.Errorf("quotas: %w", err)
		}
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b Quota) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

func decodeQuota(key, v string) (Quota, error) {
	var rec quotaRecord
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return Quota{}, fmt.Errorf("quota of %s is malformed: %w", key, err)
	}
	return Quota{Key: key, PlanType: rec.PlanType, LimitReached: rec.LimitReached, Windows: rec.Windows,
		ReportedAt: rec.ReportedAt, AgentID: rec.AgentID}, nil
}
