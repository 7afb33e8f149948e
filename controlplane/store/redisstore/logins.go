package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

var (
	scriptLoginPut     = mustPlainScript("login_put")
	scriptLeaseRelease = mustPlainScript("lease_release")
)

// leasePoll is how often AcquireLease retries while another replica holds
// the lease.
const leasePoll = 50 * time.Millisecond

func (r *Store) loginKey(key string) string { return r.prefix + "login:" + key }
func (r *Store) leaseKey(key string) string { return r.prefix + "lease:" + key }
func (r *Store) fenceKey(key string) string { return r.prefix + "fence:" + key }
func (r *Store) loginsIndex() string        { return r.prefix + "logins" }

// Login returns key's login from Redis, or ErrNotFound.
func (r *Store) Login(ctx context.Context, key string) (store.Login, error) {
	var vals []any
	err := r.call(ctx, "logins", func(ctx context.Context) error {
		v, err := r.client.HMGet(ctx, r.loginKey(key), "gen", "data").Result()
		vals = v
		return err
	})
	if err != nil {
		return store.Login{}, fmt.Errorf("read login %s: %w", key, err)
	}
	return decodeLogin(key, vals)
}

func decodeLogin(key string, vals []any) (store.Login, error) {
	if len(vals) != 2 || vals[0] == nil || vals[1] == nil {
		return store.Login{}, store.ErrNotFound
	}
	gs, _ := vals[0].(string)
	ds, _ := vals[1].(string)
	gen, err := strconv.ParseInt(gs, 10, 64)
	if err != nil {
		return store.Login{}, fmt.Errorf("read login %s: generation %q is not a number", key, gs)
	}
	var l store.Login
	if err := json.Unmarshal([]byte(ds), &l); err != nil {
		return store.Login{}, fmt.Errorf("read login %s: the record is not the expected JSON", key)
	}
	l.Key, l.Generation = key, gen
	return l, nil
}

// Logins returns every login in Redis, ordered by key.
func (r *Store) Logins(ctx context.Context) ([]store.Login, error) {
	var keys []string
	err := r.call(ctx, "logins", func(ctx context.Context) error {
		v, err := r.client.SMembers(ctx, r.loginsIndex()).Result()
		keys = v
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list logins: %w", err)
	}
	slices.Sort(keys)
	out := make([]store.Login, 0, len(keys))
	for _, k := range keys {
		l, err := r.Login(ctx, k)
		if errors.Is(err, store.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// PutLogin writes l over generation l.Generation in one script that also
// checks the lease's fencing token.
func (r *Store) PutLogin(ctx context.Context, l store.Login, lease *store.Lease) (store.Login, error) {
	if err := store.ValidateKey(l.Key); err != nil {
		return store.Login{}, err
	}
	data, err := json.Marshal(l)
	if err != nil {
		return store.Login{}, fmt.Errorf("encode login %s: %w", l.Key, err)
	}
	fence := ""
	if lease != nil {
		fence = strconv.FormatInt(lease.Fence, 10)
	}
	var gen int64
	err = r.call(ctx, "logins", func(ctx context.Context) error {
		v, err := scriptLoginPut.Run(ctx, r.client, []string{r.loginKey(l.Key), r.leaseKey(l.Key), r.loginsIndex()},
			l.Generation, fence, string(data), l.Key).Int64()
		gen = v
		return err
	})
	switch {
	case err != nil:
		return store.Login{}, fmt.Errorf("write login %s: %w", l.Key, err)
	case gen == -1:
		return store.Login{}, store.ErrConflict
	case gen == -2:
		return store.Login{}, store.ErrFenced
	}
	l.Generation = gen
	return l, nil
}

// RemoveLogin deletes key's login from Redis, or returns ErrNotFound.
func (r *Store) RemoveLogin(ctx context.Context, key string) error {
	var n int64
	err := r.call(ctx, "logins", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		del := pipe.Del(ctx, r.loginKey(key))
		pipe.SRem(ctx, r.loginsIndex(), key)
		if _, err := pipe.Exec(ctx); err != nil {
			return err
		}
		n = del.Val()
		return nil
	})
	if err != nil {
		return fmt.Errorf("remove login %s: %w", key, err)
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AcquireLease takes key's lease in Redis: a fencing token from a counter
// (INCR), then SET NX PX ttl with the token as value, retried every 50 ms
// while another replica holds it. A holder that dies loses the lease after
// ttl; a write it makes after that is refused (ErrFenced).
func (r *Store) AcquireLease(ctx context.Context, key string, ttl time.Duration) (*store.Lease, error) {
	if err := store.ValidateKey(key); err != nil {
		return nil, err
	}
	for {
		var fence int64
		var ok bool
		err := r.call(ctx, "lease", func(ctx context.Context) error {
			f, err := r.client.Incr(ctx, r.fenceKey(key)).Result()
			if err != nil {
				return err
			}
			fence = f
			ok, err = r.client.SetNX(ctx, r.leaseKey(key), strconv.FormatInt(f, 10), ttl).Result()
			return err
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("refresh lease of %s: %w", key, err)
		}
		if ok {
			return store.NewLease(key, fence, func() error {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer cancel()
				return r.call(rctx, "lease", func(ctx context.Context) error {
					return scriptLeaseRelease.Run(ctx, r.client, []string{r.leaseKey(key)}, strconv.FormatInt(fence, 10)).Err()
				})
			}), nil
		}
		t := time.NewTimer(leasePoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("refresh lease of %s: another replica holds it: %w", key, context.Cause(ctx))
		case <-t.C:
		}
	}
}
