package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// UpdatePolicy changes key's policy: update receives the current policy
// (the default one for an account without a stored policy) and returns
// the new one, or an error that UpdatePolicy returns unchanged. The change
// is one script (checked against the record update read, retried when
// another replica changed it in between) and is published to every
// replica. While Redis cannot be reached it fails with ErrUnavailable.
func (r *Store) UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (store.Account, error) {
	return r.updateStored(ctx, key, now, func(rec record) (record, error) {
		p, err := update(rec.policy)
		if err != nil {
			return rec, err
		}
		rec.policy = resolve(p)
		return rec, nil
	})
}

// SetAdaptive turns adaptive mode on or off for key (see Memory.SetAdaptive).
func (r *Store) SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (store.Account, error) {
	return r.updateStored(ctx, key, now, func(rec record) (record, error) {
		rec.adaptive = enabled
		return rec, nil
	})
}

func (r *Store) updateStored(ctx context.Context, key string, now time.Time, update func(record) (record, error)) (store.Account, error) {
	healed := false
	for range 20 {
		var cur string
		err := r.call(ctx, "policy", func(ctx context.Context) error {
			var err error
			cur, err = r.client.HGet(ctx, r.policiesKey(), key).Result()
			return err
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return store.Account{}, r.writeErr(ctx, "update policy", err)
		}
		rec := record{policy: resolve(r.defaults), adaptive: store.DefaultAdaptive}
		last, held := r.cache.get(key)
		switch {
		case cur != "":
			if rec, err = decodeRecord(cur); err != nil {
				// Unreadable: the change replaces it, starting from the
				// last good copy this replica holds (else the defaults).
				r.noteBadPolicy(key, err)
				from := "the defaults"
				rec = record{policy: resolve(r.defaults), adaptive: store.DefaultAdaptive}
				if held {
					rec, from = last, "this replica's last good copy"
				}
				r.log.Warn("replacing an unreadable policy record", "account", key, "from", from)
			}
		case held:
			rec = last // Redis lost it: start from this replica's copy
			r.suspect()
		}
		next, err := update(rec)
		if err != nil {
			return store.Account{}, err
		}
		v, err := r.run(ctx, "update", scriptUpdate,
			[]string{r.acctKey(key), r.policiesKey(), r.versionKey(), r.adaptiveKey(), r.epochKey()},
			key, micros(now), r.defRec, r.idleMs, cur, encodeRecord(next.policy, next.adaptive), r.channel, r.replica,
			r.knownEpoch(), r.cache.seen())
		if err != nil {
			return store.Account{}, r.writeErr(ctx, "update policy", err)
		}
		if len(v) == 1 {
			switch code, _ := v[0].(int64); code {
			case -2: // the store lost its data: heal, then once more
				if healed {
					return store.Account{}, fmt.Errorf("update policy: %w", errHealing)
				}
				healed = true
				if err := r.healNow(ctx); err != nil {
					return store.Account{}, fmt.Errorf("update policy: %w", err)
				}
			case -3: // the store-wide version is unreadable
				r.log.Error("the store-wide policy version in redis is unreadable; writing it back", "key", r.versionKey())
				if _, err := r.runAll(ctx, "restore", scriptRestoreCounter, []scriptCall{{keys: []string{r.versionKey()}, args: []any{r.cache.seen() + VersionGap}}}); err != nil {
					return store.Account{}, r.writeErr(ctx, "update policy", err)
				}
			}
			continue // another replica changed the policy in between
		}
		r.noteGood("policy", key)
		return r.snapshot(key, v)
	}
	return store.Account{}, errors.New("update policy: the policy kept changing under concurrent updates; try again")
}

func (r *Store) writeErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if answered(err) {
		return fmt.Errorf("%s: redis %s refused it: %w", op, r.addr, err)
	}
	return fmt.Errorf("%s: %w: redis %s unreachable (%v); admissions continue from each replica's share", op, store.ErrUnavailable, r.addr, err)
}

// Report403 records an upstream 403 for key at now with its retry-after
// (see Memory.Report403). While Redis cannot be reached the report is
// dropped (ErrNotFound).
func (r *Store) Report403(ctx context.Context, key string, now time.Time, retryAfter time.Duration) (store.Account, bool, error) {
	v, err := r.run(ctx, "report403", scriptReport403, []string{r.acctKey(key), r.policiesKey(), r.adaptiveKey()},
		key, micros(now), r.defRec, r.idleMs, r.channel, r.replica, max(retryAfter, 0).Microseconds())
	switch {
	case errors.Is(err, redis.Nil):
		return store.Account{}, false, store.ErrNotFound
	case err != nil && ctx.Err() != nil:
		return store.Account{}, false, ctx.Err()
	case err != nil:
		return store.Account{}, false, store.ErrNotFound
	}
	if len(v) != 8 {
		return store.Account{}, false, fmt.Errorf("report 403: malformed script reply %v", v)
	}
	changed, _ := v[7].(int64)
	a, err := r.snapshot(key, v[:7])
	return a, changed == 1, err
}

// Adapt applies the adaptive raises due by now to the accounts in
// adaptive mode and returns those whose effective rate changed (each is
// also published). Every replica may run it: a raise is applied once.
func (r *Store) Adapt(ctx context.Context, now time.Time) ([]store.Account, error) {
	var keys []string
	err := r.call(ctx, "adaptive", func(ctx context.Context) error {
		var err error
		keys, err = r.client.SMembers(ctx, r.adaptiveKey()).Result()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, nil
	}
	var out []store.Account
	for _, k := range keys {
		v, err := r.run(ctx, "adapt", scriptAdapt, []string{r.acctKey(k), r.policiesKey(), r.adaptiveKey()},
			k, micros(now), r.defRec, r.idleMs, r.channel, r.replica)
		if errors.Is(err, redis.Nil) || answered(err) {
			continue // an unreadable record affects only its account
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return out, nil
		}
		a, err := r.snapshot(k, v)
		if err != nil {
			return nil, fmt.Errorf("adapt: %w", err)
		}
		out = append(out, a)
	}
	sortAccounts(out)
	return out, nil
}

// record is one account's stored policy as the policies hash keeps it:
// "version rate burst idle_ms total_ms retries bound_ms adaptive".
type record struct {
	version int64
	// policy is the configured policy, its budget in whole milliseconds
	// and its wait bound derived from the budget (resolve).
	policy   pacing.Policy
	adaptive bool
}

// resolve is p as a record keeps it: the timeouts in whole milliseconds,
// the wait bound re-derived from the budget (the memory store's policy
// file keeps policies the same way).
func resolve(p pacing.Policy) pacing.Policy {
	idle := p.Budget.IdleTimeout.Truncate(time.Millisecond)
	total := p.Budget.TotalTimeout.Truncate(time.Millisecond)
	retries := p.Budget.MaxRetries
	b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	return pacing.Policy{RatePerMinute: p.RatePerMinute, Burst: p.Burst, Budget: b}
}

// encodeRecord is a policy record without its version: "rate burst
// idle_ms total_ms retries bound_ms adaptive". The scripts read the
// resolved wait bound; Go re-derives it from the budget.
func encodeRecord(p pacing.Policy, adaptive bool) string {
	a := 0
	if adaptive {
		a = 1
	}
	b := p.Budget
	return fmt.Sprintf("%d %d %d %d %d %d %d", p.RatePerMinute, p.Burst, b.IdleTimeout.Milliseconds(),
		b.TotalTimeout.Milliseconds(), b.MaxRetries, b.WaitBound.Milliseconds(), a)
}

// decodeRecord parses a record with its version.
func decodeRecord(rec string) (record, error) {
	f := strings.Fields(rec)
	if len(f) != 8 {
		return record{}, fmt.Errorf("policy record %q has %d fields; want 8", rec, len(f))
	}
	var n [8]int64
	for i, s := range f {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return record{}, fmt.Errorf("policy record %q: field %d is not an integer", rec, i+1)
		}
		n[i] = v
	}
	p := pacing.Policy{RatePerMinute: int(n[1]), Burst: int(n[2]), Budget: pacing.Budget{
		IdleTimeout: time.Duration(n[3]) * time.Millisecond, TotalTimeout: time.Duration(n[4]) * time.Millisecond, MaxRetries: int(n[5]),
	}}
	return record{version: n[0], policy: resolve(p), adaptive: n[7] == 1}, nil
}
