package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

// quotaRecord is a quota as Redis keeps it (JSON in one hash field per
// account).
type quotaRecord struct {
	PlanType     string              `json:"plan_type"`
	LimitReached bool                `json:"limit_reached"`
	Windows      []store.QuotaWindow `json:"windows"`
	ReportedAt   time.Time           `json:"reported_at"`
	AgentID      string              `json:"agent_id"`
}

func (r *Store) quotasKey() string { return r.prefix + "quotas" }

// PutQuota records a report for q.Key in Redis, shared by every replica
// (a read, a merge and a write: two replicas writing one account at once
// keep one of the two reports, which the next report repairs). While
// Redis cannot be reached it fails with ErrUnavailable.
func (r *Store) PutQuota(ctx context.Context, q store.Quota) (prev, next store.Quota, err error) {
	err = r.call(ctx, "quota", func(ctx context.Context) error {
		v, err := r.client.HGet(ctx, r.quotasKey(), q.Key).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return err
		default:
			if prev, err = decodeQuota(q.Key, v); err != nil {
				// an unreadable report is replaced by this one
				r.noteBad(&store.BadRecordError{Kind: "quota", Name: q.Key, Where: "redis hash " + r.quotasKey() + " field " + q.Key, Err: err})
				prev = store.Quota{}
			}
		}
		next = prev.Merge(q)
		b, err := json.Marshal(quotaRecord{PlanType: next.PlanType, LimitReached: next.LimitReached,
			Windows: next.Windows, ReportedAt: next.ReportedAt, AgentID: next.AgentID})
		if err != nil {
			return err
		}
		return r.client.HSet(ctx, r.quotasKey(), q.Key, b).Err()
	})
	if err != nil {
		return store.Quota{}, store.Quota{}, r.writeErr(ctx, "put quota", err)
	}
	return prev, next, nil
}

// Quotas returns the latest quota of key, or of every account when key is
// "", ordered by key.
func (r *Store) Quotas(ctx context.Context, key string) ([]store.Quota, error) {
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
		return nil, fmt.Errorf("quotas: %w: redis %s unreachable (%v)", store.ErrUnavailable, r.addr, err)
	}
	out := make([]store.Quota, 0, len(vals))
	for k, v := range vals {
		q, err := decodeQuota(k, v)
		if err != nil {
			// informational: an unreadable report is left out until the
			// account's next report replaces it
			r.noteBad(&store.BadRecordError{Kind: "quota", Name: k, Where: "redis hash " + r.quotasKey() + " field " + k, Err: err})
			continue
		}
		r.noteGood("quota", k)
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b store.Quota) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

func decodeQuota(key, v string) (store.Quota, error) {
	var rec quotaRecord
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return store.Quota{}, errors.New("not the expected JSON")
	}
	return store.Quota{Key: key, PlanType: rec.PlanType, LimitReached: rec.LimitReached, Windows: rec.Windows,
		ReportedAt: rec.ReportedAt, AgentID: rec.AgentID}, nil
}
