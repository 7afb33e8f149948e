package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

var (
	scriptLoginPut     = mustPlainScript("login_put")
	scriptLoginRemove  = mustPlainScript("login_remove")
	scriptLeaseAcquire = mustPlainScript("lease_acquire")
	scriptLeaseRelease = mustPlainScript("lease_release")
)

// leasePoll is how often AcquireLease retries while another replica holds
// the lease.
const leasePoll = 50 * time.Millisecond

func (r *Store) loginKey(key string) string { return r.prefix + "login:" + key }
func (r *Store) leaseKey(key string) string { return r.prefix + "lease:" + key }
func (r *Store) fenceKey(key string) string { return r.prefix + "fence:" + key }
func (r *Store) loginsIndex() string        { return r.prefix + "logins" }

// Login returns key's login from Redis, or ErrNotFound. A login this
// replica holds that Redis lost (or holds in an older generation) is
// written back and returned; an unreadable one is repaired from this
// replica's copy when that copy is of the stored generation, else it is
// a *store.BadRecordError.
func (r *Store) Login(ctx context.Context, key string) (store.Login, error) {
	var vals []any
	var tomb int64
	err := r.call(ctx, "logins", func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		h := pipe.HMGet(ctx, r.loginKey(key), "gen", "data")
		t := pipe.HGet(ctx, r.removedKey(), "login:"+key)
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		vals = h.Val()
		tomb, _ = strconv.ParseInt(t.Val(), 10, 64)
		return nil
	})
	if err != nil {
		if mine, ok := r.ledger.login(key); ok && !answered(err) && ctx.Err() == nil {
			return mine, nil // Redis unreachable: this replica's copy
		}
		return store.Login{}, fmt.Errorf("read login %s: %w", key, err)
	}
	return r.reconcileLogin(ctx, key, vals, tomb)
}

// loginRead is one login as Redis holds it: gen is -1 when its generation
// is unreadable too.
type loginRead struct {
	l   store.Login
	gen int64
	err error // store.ErrNotFound, a *store.BadRecordError, or nil
}

func (r *Store) decodeLogin(key string, vals []any) loginRead {
	if len(vals) != 2 || (vals[0] == nil && vals[1] == nil) {
		return loginRead{err: store.ErrNotFound}
	}
	bad := func(gen int64, why string) loginRead {
		return loginRead{gen: gen, err: &store.BadRecordError{Kind: "sign-in", Name: key, Where: "redis hash " + r.loginKey(key), Err: errors.New(why)}}
	}
	gs, _ := vals[0].(string)
	ds, _ := vals[1].(string)
	gen, err := strconv.ParseInt(gs, 10, 64)
	if err != nil {
		return bad(-1, fmt.Sprintf("its generation %.40q is not a number", gs))
	}
	var l store.Login
	if err := json.Unmarshal([]byte(ds), &l); err != nil || len(l.Sealed) == 0 {
		return bad(gen, "its data is not the expected JSON with sealed tokens")
	}
	l.Key, l.Generation = key, gen
	return loginRead{l: l, gen: gen}
}

// reconcileLogin compares what Redis holds of key's login with this
// replica's copy: it writes the copy back when Redis lost the login or
// holds an older generation (tomb is the generation at which the login
// was removed, 0: never), repairs an unreadable one from a copy of the
// same generation, and otherwise takes Redis's into the copy.
func (r *Store) reconcileLogin(ctx context.Context, key string, vals []any, tomb int64) (store.Login, error) {
	got := r.decodeLogin(key, vals)
	if tomb > 0 {
		r.ledger.noteRemoved(map[string]int64{"login:" + key: tomb})
	}
	mine, have := r.ledger.login(key)
	var bad *store.BadRecordError
	switch {
	case errors.Is(got.err, store.ErrNotFound):
		if !have || tomb >= mine.Generation {
			return store.Login{}, store.ErrNotFound
		}
		r.noteLost("sign-in", key, r.loginKey(key))
		r.restoreLogin(ctx, mine, false)
		return mine, nil
	case errors.As(got.err, &bad):
		if have && got.gen == mine.Generation {
			r.noteBad(bad)
			r.log.Warn("repaired an unreadable sign-in from this replica's copy of the same generation", "account", key, "generation", got.gen)
			r.restoreLogin(ctx, mine, true)
			return mine, nil
		}
		r.noteBad(bad)
		return store.Login{}, bad
	case have && mine.Generation > got.gen && tomb < mine.Generation:
		r.noteLost("sign-in", key, r.loginKey(key))
		r.restoreLogin(ctx, mine, false)
		return mine, nil
	}
	r.noteGood("sign-in", key)
	r.noteFound("sign-in", key)
	r.ledger.putLogin(got.l)
	return got.l, nil
}

// restoreLogin writes this replica's copy of a login back (repair: over
// the same generation).
func (r *Store) restoreLogin(ctx context.Context, l store.Login, repair bool) {
	data, err := json.Marshal(l)
	if err != nil {
		return
	}
	flag := "0"
	if repair {
		flag = "1"
	}
	_, err = r.runAll(ctx, "restore", scriptRestoreLogin, []scriptCall{{
		keys: []string{r.loginKey(l.Key), r.loginsIndex(), r.removedKey()}, args: []any{l.Key, l.Generation, string(data), flag},
	}})
	if err != nil {
		r.log.Warn("writing a sign-in back failed; trying again at the next read", "account", l.Key, "err", err)
	}
}

// Logins returns every login in Redis, ordered by key, with the logins
// this replica holds that Redis lost (written back as Login does). A
// login that is unreadable and has no good copy is listed with
// Unreadable set.
func (r *Store) Logins(ctx context.Context) ([]store.Login, error) {
	var keys []string
	var removed map[string]string
	err := r.call(ctx, "logins", func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		k := pipe.SMembers(ctx, r.loginsIndex())
		rm := pipe.HGetAll(ctx, r.removedKey())
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		keys, removed = k.Val(), rm.Val()
		return nil
	})
	if err != nil {
		if !answered(err) && ctx.Err() == nil {
			logins, _, _, _, _ := r.ledger.copyOf()
			if len(logins) > 0 {
				return sortedLogins(logins), nil // Redis unreachable: this replica's copy
			}
		}
		return nil, fmt.Errorf("list logins: %w", err)
	}
	tombs := parseRemoved(removed)
	r.ledger.noteRemoved(tombs)
	mine, _, _, _, _ := r.ledger.copyOf()
	for k := range mine {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	vals := make(map[string][]any, len(keys))
	const batch = 256
	for i := 0; i < len(keys); i += batch {
		chunk := keys[i:min(i+batch, len(keys))]
		err := r.call(ctx, "logins", func(ctx context.Context) error {
			pipe := r.client.Pipeline()
			cmds := make([]*redis.SliceCmd, len(chunk))
			for j, k := range chunk {
				cmds[j] = pipe.HMGet(ctx, r.loginKey(k), "gen", "data")
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
			for j, k := range chunk {
				vals[k] = cmds[j].Val()
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list logins: %w", err)
		}
	}
	out := make([]store.Login, 0, len(keys))
	for _, k := range keys {
		l, err := r.reconcileLogin(ctx, k, vals[k], tombs["login:"+k])
		var bad *store.BadRecordError
		switch {
		case errors.Is(err, store.ErrNotFound):
			continue // removed meanwhile
		case errors.As(err, &bad):
			out = append(out, store.Login{Key: k, Unreadable: bad.Error()})
			continue
		case err != nil:
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func sortedLogins(m map[string]store.Login) []store.Login {
	out := make([]store.Login, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, m[k])
	}
	return out
}

// parseRemoved reads the removals hash; unreadable entries are ignored.
func parseRemoved(m map[string]string) map[string]int64 {
	out := make(map[string]int64, len(m))
	for f, v := range m {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[f] = n
		}
	}
	return out
}

// PutLogin writes l over generation l.Generation (-1: over whatever is
// stored, an unreadable record included) in one script that also checks
// the lease's fencing token and the store's epoch: a write that finds the
// store lost its data heals it first and is tried once more.
func (r *Store) PutLogin(ctx context.Context, l store.Login, lease *store.Lease) (store.Login, error) {
	if err := store.ValidateKey(l.Key); err != nil {
		return store.Login{}, err
	}
	stored := l
	stored.Generation = 0 // the hash's gen field holds it
	data, err := json.Marshal(stored)
	if err != nil {
		return store.Login{}, fmt.Errorf("encode login %s: %w", l.Key, err)
	}
	fence := ""
	if lease != nil {
		fence = strconv.FormatInt(lease.Fence, 10)
	}
	gen, err := r.epochWrite(ctx, "logins", "write login "+l.Key, func(ctx context.Context) (int64, error) {
		return scriptLoginPut.Run(ctx, r.client,
			[]string{r.loginKey(l.Key), r.leaseKey(l.Key), r.loginsIndex(), r.removedKey(), r.epochKey()},
			l.Generation, fence, string(data), l.Key, r.knownEpoch()).Int64()
	})
	switch {
	case err != nil:
		return store.Login{}, err
	case gen == -1:
		return store.Login{}, store.ErrConflict
	case gen == -2:
		return store.Login{}, store.ErrFenced
	}
	l.Generation = gen
	r.noteGood("sign-in", l.Key)
	r.ledger.putLogin(l)
	return l, nil
}

// RemoveLogin deletes key's login from Redis and records the removal (so
// no replica's copy brings it back), or returns ErrNotFound.
func (r *Store) RemoveLogin(ctx context.Context, key string) error {
	gen, err := r.epochWrite(ctx, "logins", "remove login "+key, func(ctx context.Context) (int64, error) {
		return scriptLoginRemove.Run(ctx, r.client,
			[]string{r.loginKey(key), r.loginsIndex(), r.removedKey(), r.epochKey()}, key, r.knownEpoch()).Int64()
	})
	if err != nil {
		return err
	}
	if gen == 0 {
		return store.ErrNotFound
	}
	r.ledger.dropLogin(key, gen)
	return nil
}

// AcquireLease takes key's lease in Redis: a fencing token from a counter,
// set with NX and a lifetime of ttl in one script, retried every 50 ms
// while another replica holds it (or while the replicas write their state
// back after a loss). A holder that dies loses the lease after ttl; a
// write it makes after that is refused (ErrFenced). The lease and the
// highest fencing token are kept in this replica's copy, so a store that
// loses them gets them back.
func (r *Store) AcquireLease(ctx context.Context, key string, ttl time.Duration) (*store.Lease, error) {
	if err := store.ValidateKey(key); err != nil {
		return nil, err
	}
	healed := false
	for {
		var fence int64
		err := r.call(ctx, "lease", func(ctx context.Context) error {
			f, err := scriptLeaseAcquire.Run(ctx, r.client,
				[]string{r.fenceKey(key), r.leaseKey(key), r.healingKey(), r.epochKey()},
				ttl.Milliseconds(), r.knownEpoch(), r.ledger.fence(key)).Int64()
			fence = f
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("refresh lease of %s: %w", key, err)
		}
		switch {
		case fence > 0:
			r.ledger.took(key, fence, time.Now().Add(ttl))
			return store.NewLease(key, fence, func() error {
				r.ledger.released(key, fence)
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer cancel()
				return r.call(rctx, "lease", func(ctx context.Context) error {
					return scriptLeaseRelease.Run(ctx, r.client, []string{r.leaseKey(key)}, strconv.FormatInt(fence, 10)).Err()
				})
			}), nil
		case fence == -3 && !healed:
			healed = true
			if err := r.healNow(ctx); err != nil {
				return nil, fmt.Errorf("refresh lease of %s: %w", key, err)
			}
			continue
		}
		t := time.NewTimer(leasePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			why := "another replica holds it"
			if fence == -4 {
				why = "the replicas are writing their state back after redis lost it"
			}
			return nil, fmt.Errorf("refresh lease of %s: %s: %w", key, why, context.Cause(ctx))
		case <-t.C:
		}
	}
}
