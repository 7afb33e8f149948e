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
// decides from this replica's local share and never fails. An account
// whose stored policy Redis lost (it decided under an older version, or
// the default, than this replica holds) or cannot decode is decided from
// the local share under the last good policy this replica holds (the
// store is checked and healed meanwhile); with no good copy at all it is
// a *store.BadRecordError naming the record, never the default policy in
// silence. An unreadable bucket state starts over.
func (r *Store) Admit(ctx context.Context, key string, now time.Time) (store.Admission, error) {
	return r.admit(ctx, key, now, true)
}

// admitSlots are the per-call arguments of the admit script (admit.lua):
// the account's hash, its key, now (us).
const (
	admitSlotHash = iota
	admitSlotKey
	admitSlotNow
)

// newAdmitBatcher is the batcher of r's admit script: the policies key,
// the idle time and the default policy are the same in every call.
func newAdmitBatcher(r *Store) *batcher {
	adaptive := 0
	if store.DefaultAdaptive {
		adaptive = 1
	}
	d := r.defaults
	return newBatcher(r.client, scriptAdmit, r.deadline.get, 2,
		[]any{nil, r.policiesKey(), nil, nil, r.idleMs, d.RatePerMinute, d.Burst, d.Budget.WaitBound.Milliseconds(), d.Budget.MaxRetries, adaptive},
		0, 2, 3)
}

func (r *Store) admit(ctx context.Context, key string, now time.Time, retry bool) (store.Admission, error) {
	var n []int64
	err := r.callPipelined(ctx, "admit", func(ctx context.Context) error {
		c := r.admits.get()
		c.arg[admitSlotHash].set(r.prefix, "a:", key)
		c.arg[admitSlotKey].set(key)
		c.arg[admitSlotNow].setInt(micros(now))
		var err error
		n, err = r.admits.run(ctx, c)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return store.Admission{}, ctx.Err()
		}
		switch {
		case isBadStateReply(err) && retry:
			r.resetState(ctx, key, err)
			return r.admit(ctx, key, now, false)
		case isBadPolicyReply(err):
			r.noteBadPolicy(key, err)
			sp, ok := r.cache.get(key)
			if !ok {
				return store.Admission{}, r.badPolicy(key, errors.New("it does not decode and this replica holds no good copy; set the policy again (clodexctl set-rate)"))
			}
			return r.localAdmit(key, sp, true, now), nil
		}
		sp, held := r.cache.get(key)
		return r.localAdmit(key, sp, held, now), nil
	}
	if len(n) != 9 {
		return store.Admission{}, fmt.Errorf("admit: malformed script reply %v: %d elements; want 9", n, len(n))
	}
	if sp, ok := r.cache.get(key); ok && n[7] < sp.version {
		// Redis decided under an older policy than this replica holds:
		// it lost the record. Decide under the copy; Run heals.
		r.noteLost("policy", key, r.policiesKey()+" field "+key)
		return r.localAdmit(key, sp, true, now), nil
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
	if d.Wait > 0 {
		r.local.queue(key, now.Add(d.Wait))
	}
	return store.Admission{Decision: d, PolicyVersion: n[7], Reservation: uint64(n[8])}, nil
}

// localAdmit decides from this replica's local share under sp (the
// defaults when held is false).
func (r *Store) localAdmit(key string, sp record, held bool, now time.Time) store.Admission {
	p := r.defaults
	if held {
		p = sp.policy
	}
	r.metrics.fallback.Inc()
	a := r.local.admit(key, p, int(r.replicas.Load()), now)
	if held {
		a.PolicyVersion = sp.version
	}
	return a
}

// resetState deletes key's bucket state, which does not decode: buckets
// are not durable, and the account starts over as a new one would.
func (r *Store) resetState(ctx context.Context, key string, cause error) {
	r.noteBad(&store.BadRecordError{Kind: "account state", Name: key, Where: "redis hash " + r.acctKey(key), Err: scriptCause(cause)})
	err := r.call(ctx, "reset", func(ctx context.Context) error { return r.client.Del(ctx, r.acctKey(key)).Err() })
	if err == nil {
		r.noteGood("account state", key)
		r.log.Warn("started an unreadable account state over (buckets are not durable: the account's bucket starts full)", "account", key)
	}
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
		r.keepPolicy(key, sp)
	}
	if held, ok := r.cache.get(key); ok && a.PolicyVersion < held.version {
		// Redis lost the record (or holds an older one): answer with
		// this replica's copy; Run heals.
		r.noteLost("policy", key, r.policiesKey()+" field "+key)
		a.Policy, a.PolicyVersion, a.Custom, a.Adaptive = held.policy, held.version, true, held.adaptive
		a.EffectiveRate = held.policy.RatePerMinute
	} else if rec != "" {
		r.noteFound("policy", key)
	}
	return a, nil
}

// unreadableAccount is key as the store shows an account whose policy
// record does not decode: the last good copy this replica holds (or the
// defaults), marked.
func (r *Store) unreadableAccount(key string, cause error) store.Account {
	bad := r.badPolicy(key, cause)
	r.noteBad(bad)
	a := store.Account{Key: key, Policy: r.defaults, EffectiveRate: r.defaults.RatePerMinute, Adaptive: store.DefaultAdaptive,
		Unreadable: bad.Error() + "; admissions use this replica's last good copy"}
	if sp, ok := r.cache.get(key); ok {
		a.Policy, a.PolicyVersion, a.Custom, a.Adaptive, a.EffectiveRate = sp.policy, sp.version, true, sp.adaptive, sp.policy.RatePerMinute
	} else {
		a.Unreadable = bad.Error() + "; this replica holds no good copy: admissions are refused centrally until the policy is set again"
	}
	if tokens, ok := r.local.tokens(key, r.now()); ok {
		a.Tokens = tokens
	}
	return a
}

// Account returns key's snapshot at now, or ErrNotFound. While Redis
// cannot be reached it answers from the last known policy and this
// replica's local share.
func (r *Store) Account(ctx context.Context, key string, now time.Time) (store.Account, error) {
	v, err := r.run(ctx, "account", scriptAccount, []string{r.acctKey(key), r.policiesKey()},
		key, micros(now), r.defRec, r.idleMs)
	if isBadStateReply(err) {
		r.resetState(ctx, key, err)
		v, err = r.run(ctx, "account", scriptAccount, []string{r.acctKey(key), r.policiesKey()},
			key, micros(now), r.defRec, r.idleMs)
	}
	switch {
	case isBadPolicyReply(err):
		return r.unreadableAccount(key, err), nil
	case errors.Is(err, redis.Nil):
		if sp, ok := r.cache.get(key); ok {
			r.noteLost("policy", key, r.policiesKey()+" field "+key)
			return r.localAccountFrom(key, sp, now), nil
		}
		return store.Account{}, store.ErrNotFound
	case err != nil && ctx.Err() != nil:
		return store.Account{}, ctx.Err()
	case err != nil:
		return r.localAccount(key, now)
	}
	return r.snapshot(key, v)
}

// localAccountFrom is key's account from this replica's copy of its
// policy, for a store that lost it.
func (r *Store) localAccountFrom(key string, sp record, now time.Time) store.Account {
	a := store.Account{Key: key, Policy: sp.policy, PolicyVersion: sp.version, Custom: true, Adaptive: sp.adaptive,
		EffectiveRate: sp.policy.RatePerMinute, Tokens: float64(sp.policy.Burst)}
	if tokens, ok := r.local.tokens(key, now); ok {
		a.Tokens = tokens
	}
	return a
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
			if errors.Is(err, redis.Nil) || answered(err) {
				return nil // each command carries its own error (an account expired, a record unreadable)
			}
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		for j, c := range cmds {
			k := chunk[j]
			v, err := c.Slice()
			switch {
			case errors.Is(err, redis.Nil):
				if sp, ok := r.cache.get(k); ok {
					r.noteLost("policy", k, r.policiesKey()+" field "+k)
					out = append(out, r.localAccountFrom(k, sp, now))
				}
				continue
			case isBadPolicyReply(err):
				out = append(out, r.unreadableAccount(k, err))
				continue
			case isBadStateReply(err):
				r.resetState(ctx, k, err)
				if a, err := r.Account(ctx, k, now); err == nil {
					out = append(out, a)
				}
				continue
			case err != nil:
				return nil, fmt.Errorf("list accounts: %w", err)
			}
			a, err := r.snapshot(k, v)
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
	for _, k := range r.cache.keys() { // policies are never removed: a key Redis lost is still listed
		seen[k] = true
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
