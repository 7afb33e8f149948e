package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// Admit runs key's bucket once at now in one script; concurrent Admits
// share one pipeline per round trip. While Redis cannot be reached it
// decides from this replica's local share and never fails.
func (r *Store) Admit(ctx context.Context, key string, now time.Time) (store.Admission, error) {
	var v []any
	err := r.call(ctx, "admit", func(ctx context.Context) error {
		reply, err := r.admits.run(ctx, r.admits.evalArgs(r.acctKey(key), r.admitPolicies, key, micros(now), r.admitDefRec, r.admitIdle))
		if err != nil {
			return err
		}
		arr, ok := reply.([]any)
		if !ok {
			return fmt.Errorf("script admit returned %T; want an array", reply)
		}
		v = arr
		return nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return store.Admission{}, ctx.Err()
		}
		r.metrics.fallback.Inc()
		a := r.local.admit(key, r.localPolicy(key), int(r.replicas.Load()), now)
		if sp, ok := r.cache.get(key); ok {
			a.PolicyVersion = sp.version
		}
		return a, nil
	}
	var n [9]int64
	if len(v) != len(n) {
		return store.Admission{}, fmt.Errorf("admit: malformed script reply %v: %d elements; want %d", v, len(v), len(n))
	}
	for i, x := range v {
		var ok bool
		if n[i], ok = x.(int64); !ok {
			return store.Admission{}, fmt.Errorf("admit: malformed script reply %v: element %d is %T; want an integer", v, i, x)
		}
	}
	d := pacing.Decision{
		Kind:         pacing.Kind(n[0]),
		Wait:         time.Duration(n[1]) * time.Millisecond,
		RetryAfter:   time.Duration(n[2]) * time.Second,
		RequiredWait: time.Duration(n[3]) * time.Millisecond,
		Debited:      n[4] == 1,
		Relaxed:      n[5] == 1,
		ID:           uint64(n[6]),
	}
	return store.Admission{Decision: d, PolicyVersion: n[7], Reservation: uint64(n[8])}, nil
}

// Cancel refunds reservation id of key if it is still pending at now.
// Reservations made from the local share while Redis was unreachable are
// refunded locally.
func (r *Store) Cancel(ctx context.Context, key string, id uint64, now time.Time) (bool, error) {
	if id == 0 {
		return false, nil
	}
	if isLocalReservation(id) {
		return r.local.cancel(key, id, now), nil
	}
	var ok int64
	err := r.call(ctx, "cancel", func(ctx context.Context) error {
		var err error
		ok, err = scriptCancel.Run(ctx, r.client, []string{r.acctKey(key)}, strconv.FormatUint(id, 10), micros(now)).Int64()
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		return false, nil // the reservation departs on its own; nothing is lost but one token
	}
	return ok == 1, nil
}

// HandOver debits grants made elsewhere (see HandOverResult). The report
// id is remembered in Redis for HandOverIdempotency.
func (r *Store) HandOver(ctx context.Context, key string, grants int, reportID string, now time.Time) (store.HandOverResult, error) {
	grants = min(max(grants, 0), store.MaxHandOverGrants)
	v, err := r.run(ctx, "handover", scriptHandOver,
		[]string{r.acctKey(key), r.policiesKey(), r.prefix + "h:" + reportID + ":" + key},
		key, micros(now), r.defRec, r.idleMs, grants, store.HandOverIdempotency.Milliseconds())
	if err != nil {
		return store.HandOverResult{}, r.writeErr(ctx, "hand over", err)
	}
	if len(v) == 1 {
		return store.HandOverResult{Duplicate: true}, nil
	}
	if len(v) != 8 {
		return store.HandOverResult{}, fmt.Errorf("hand over: malformed script reply %v", v)
	}
	debited, _ := v[0].(int64)
	acct, err := r.snapshot(key, v[1:])
	if err != nil {
		return store.HandOverResult{}, fmt.Errorf("hand over: %w", err)
	}
	r.metrics.handover.Add(float64(debited))
	return store.HandOverResult{Debited: int(debited), Account: acct}, nil
}

// snapshot decodes a script snapshot: version, custom, units, effective
// rate, adaptive, record, the pause's end (us, 0: none).
func (r *Store) snapshot(key string, v []any) (store.Account, error) {
	if len(v) != 7 {
		return store.Account{}, fmt.Errorf("snapshot has %d fields; want 7", len(v))
	}
	n, err := ints(v[:5])
	if err != nil {
		return store.Account{}, fmt.Errorf("snapshot: %w", err)
	}
	pu, ok := v[6].(int64)
	if !ok {
		return store.Account{}, fmt.Errorf("snapshot: the pause %v is not an integer", v[6])
	}
	rec, _ := v[5].(string)
	a := store.Account{
		Key:           key,
		Policy:        r.defaults,
		Tokens:        float64(n[2]) / float64(time.Minute),
		PolicyVersion: n[0],
		Custom:        n[1] == 1,
		EffectiveRate: int(n[3]),
		Adaptive:      n[4] == 1,
	}
	if pu > 0 {
		a.PausedUntil = time.UnixMicro(pu).UTC()
	}
	if rec != "" {
		sp, err := decodeRecord(rec)
		if err != nil {
			return store.Account{}, err
		}
		a.Policy = sp.policy
		r.cache.put(key, sp)
	}
	return a, nil
}

// Account returns key's snapshot at now, or ErrNotFound. While Redis
// cannot be reached it answers from the last known policy and this
// replica's local share.
func (r *Store) Account(ctx context.Context, key string, now time.Time) (store.Account, error) {
	v, err := r.run(ctx, "account", scriptAccount, []string{r.acctKey(key), r.policiesKey()},
		key, micros(now), r.defRec, r.idleMs)
	switch {
	case errors.Is(err, redis.Nil):
		return store.Account{}, store.ErrNotFound
	case err != nil && ctx.Err() != nil:
		return store.Account{}, ctx.Err()
	case err != nil:
		return r.localAccount(key, now)
	}
	return r.snapshot(key, v)
}

// localAccount is Account from the local share and the policy cache.
func (r *Store) localAccount(key string, now time.Time) (store.Account, error) {
	sp, custom := r.cache.get(key)
	tokens, known := r.local.tokens(key, now)
	if !custom && !known {
		return store.Account{}, store.ErrNotFound
	}
	p := r.defaults
	a := store.Account{Key: key, Custom: custom, Adaptive: store.DefaultAdaptive}
	if custom {
		p = sp.policy
		a.PolicyVersion, a.Adaptive = sp.version, sp.adaptive
	}
	a.Policy, a.EffectiveRate = p, p.RatePerMinute
	if !known {
		tokens = float64(share(p, int(r.replicas.Load())).Burst)
	}
	a.Tokens = tokens
	return a, nil
}

// localPolicy is the last known policy of key (its configured policy;
// adaptive lowering is not known locally).
func (r *Store) localPolicy(key string) pacing.Policy {
	if sp, ok := r.cache.get(key); ok {
		return sp.policy
	}
	return r.defaults
}

// Accounts returns every account with state or a stored policy, ordered
// by key. While Redis cannot be reached it lists the stored policies and
// the local share's accounts.
func (r *Store) Accounts(ctx context.Context, now time.Time) ([]store.Account, error) {
	keys, err := r.accountKeys(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var out []store.Account
		for _, k := range r.local.keysWith(r.cache.keys()) {
			if a, err := r.localAccount(k, now); err == nil {
				out = append(out, a)
			}
		}
		sortAccounts(out)
		return out, nil
	}
	var out []store.Account
	const batch = 256
	for i := 0; i < len(keys); i += batch {
		chunk := keys[i:min(i+batch, len(keys))]
		var cmds []*redis.Cmd
		err := r.call(ctx, "accounts", func(ctx context.Context) error {
			pipe := r.client.Pipeline()
			cmds = make([]*redis.Cmd, len(chunk))
			for j, k := range chunk {
				cmds[j] = scriptAccount.EvalSha(ctx, pipe, []string{r.acctKey(k), r.policiesKey()}, k, micros(now), r.defRec, r.idleMs)
			}
			_, err := pipe.Exec(ctx)
			if err != nil && isNoScript(err) {
				if err := scriptAccount.Load(ctx, r.client).Err(); err != nil {
					return err
				}
				pipe = r.client.Pipeline()
				for j, k := range chunk {
					cmds[j] = scriptAccount.EvalSha(ctx, pipe, []string{r.acctKey(k), r.policiesKey()}, k, micros(now), r.defRec, r.idleMs)
				}
				_, err = pipe.Exec(ctx)
			}
			if errors.Is(err, redis.Nil) {
				return nil // some accounts expired between the scan and the read
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		for j, c := range cmds {
			v, err := c.Slice()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("list accounts: %w", err)
			}
			a, err := r.snapshot(chunk[j], v)
			if err != nil {
				return nil, fmt.Errorf("list accounts: %w", err)
			}
			out = append(out, a)
		}
	}
	sortAccounts(out)
	return out, nil
}

func isNoScript(err error) bool { return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") }

// accountKeys returns every account key with state or a stored policy.
func (r *Store) accountKeys(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	err := r.call(ctx, "policies", func(ctx context.Context) error {
		ks, err := r.client.HKeys(ctx, r.policiesKey()).Result()
		for _, k := range ks {
			seen[k] = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	prefix := r.acctKey("")
	var cursor uint64
	for {
		var ks []string
		err := r.call(ctx, "scan", func(ctx context.Context) error {
			var err error
			ks, cursor, err = r.client.Scan(ctx, cursor, prefix+"*", 1000).Result()
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, k := range ks {
			seen[strings.TrimPrefix(k, prefix)] = true
		}
		if cursor == 0 {
			break
		}
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	return out, nil
}

func sortAccounts(accts []store.Account) {
	slices.SortFunc(accts, func(a, b store.Account) int { return cmp.Compare(a.Key, b.Key) })
}
