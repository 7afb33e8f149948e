package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

// named is one kind of versioned, named record this store keeps in a
// Redis hash (field: the name; value: the record's JSON), with its
// versions in a second hash and its removals in the removals hash: the
// scoped agent credentials and the members. readNamed reads them the way
// every such read must: this replica's copies stand in while Redis is
// unreachable, a record Redis lost or holds older is written back, and
// an unreadable one affects only itself.
type named[R any] struct {
	kind          string // "agent credential", "member": logs and bad-record errors
	removal       string // its prefix in the removals hash: "cred", "member"
	op            string // the call's name for metrics and the breaker
	key, versions string // the records' hash and the versions' hash
	expect        string // what a good record is, for a bad one's error
	// decode reads a stored record; an error makes it unreadable.
	decode func(name, raw string) (R, error)
	// version reads a record's version; with sets a record's version
	// (and clears Unreadable), bad marks a copy unreadable.
	version func(R) int64
	with    func(R, string, int64) R
	bad     func(R, string, string) R
	// mine is this replica's copies; keep records a good read in them;
	// repair writes copies back; sorted orders the answer.
	mine   func() map[string]R
	keep   func(R)
	repair func(context.Context, []R)
	sorted func(map[string]R) []R
}

// readNamed reads every record of kind k: Redis's, with the ones this
// replica holds that Redis lost (or holds older) written back.
func readNamed[R any](ctx context.Context, r *Store, k named[R]) ([]R, error) {
	var m, versions, removed map[string]string
	err := r.call(ctx, k.op, func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		a := pipe.HGetAll(ctx, k.key)
		v := pipe.HGetAll(ctx, k.versions)
		rm := pipe.HGetAll(ctx, r.removedKey())
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		m, versions, removed = a.Val(), v.Val(), rm.Val()
		return nil
	})
	if err != nil {
		if !answered(err) && ctx.Err() == nil {
			if mine := k.mine(); len(mine) > 0 {
				return k.sorted(mine), nil // Redis unreachable: this replica's copy
			}
		}
		return nil, fmt.Errorf("read %ss: %w", k.kind, err)
	}
	tombs := parseRemoved(removed)
	r.ledger.noteRemoved(tombs)
	mine := k.mine()
	out := make(map[string]R, len(m))
	var lost []R
	for name, raw := range m {
		ver, _ := strconv.ParseInt(versions[name], 10, 64)
		rec, err := k.decode(name, raw)
		if err != nil {
			bad := &store.BadRecordError{Kind: k.kind, Name: name, Where: "redis hash " + k.key + " field " + name, Err: errors.New(k.expect)}
			r.noteBad(bad)
			if cp, ok := mine[name]; ok && k.version(cp) == ver && ver > 0 {
				lost = append(lost, cp) // a copy of the stored version: repair the record
				out[name] = cp
				continue
			}
			out[name] = k.bad(mine[name], name, bad.Error())
			continue
		}
		rec = k.with(rec, name, ver)
		if cp, ok := mine[name]; ok && k.version(cp) > ver && tombs[k.removal+":"+name] < k.version(cp) {
			r.noteLost(k.kind, name, k.key)
			lost = append(lost, cp)
			out[name] = cp
			continue
		}
		r.noteGood(k.kind, name)
		k.keep(rec)
		out[name] = rec
	}
	for name, cp := range mine {
		if _, ok := m[name]; !ok && tombs[k.removal+":"+name] < max(k.version(cp), 1) {
			r.noteLost(k.kind, name, k.key)
			lost = append(lost, cp)
			out[name] = cp
		}
	}
	if len(lost) > 0 {
		k.repair(ctx, lost)
	}
	return k.sorted(out), nil
}

// epochWrite runs a durable write's script, which answers -3 when the
// store's epoch is not the one this replica knows (Redis lost its data):
// the replica heals the store once (healNow) and runs it again. what
// names the write in its errors ("put member alice"); a second -3 is
// errHealing. Any other answer is the script's.
func (r *Store) epochWrite(ctx context.Context, op, what string, run func(ctx context.Context) (int64, error)) (int64, error) {
	var v int64
	var err error
	for attempt := 0; ; attempt++ {
		err = r.call(ctx, op, func(ctx context.Context) error {
			n, err := run(ctx)
			v = n
			return err
		})
		if err != nil || v != -3 || attempt > 0 {
			break
		}
		if err := r.healNow(ctx); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
	}
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: %w", what, err)
	case v == -3:
		return 0, fmt.Errorf("%s: %w", what, errHealing)
	}
	return v, nil
}
