package redisstore

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"github.com/clodex/clodex/controlplane/store"
)

// Members live as the scoped agent credentials do (agentcreds.go): one
// hash field of JSON per member, its version in a second hash, a removal
// in the removals hash as "member:NAME". They share the credentials'
// scripts and their change notice: a replica that hears one reloads both,
// so a member removed anywhere is refused by every data plane within a
// round trip and a push.

func (r *Store) membersKey() string        { return r.prefix + "members" }
func (r *Store) memberVersionsKey() string { return r.prefix + "members:v" }

// memberKind is the members' field kind in the removals hash.
const memberKind = "member"

// memberRecord is what Redis holds of a member: the store's record
// without its name and version (the hash field and the versions hash).
func memberRecord(m store.Member) ([]byte, error) {
	return json.Marshal(store.Member{Digest: m.Digest, Accounts: m.Accounts, Pin: m.Pin, RatePerMinute: m.RatePerMinute, Created: m.Created})
}

// PutMember stores m in Redis, replacing a member of the same name,
// checking the store's epoch as PutAgentCred does. Past store.MaxMembers
// a new name is refused.
func (r *Store) PutMember(ctx context.Context, m store.Member) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("put member: %w", err)
	}
	b, err := memberRecord(m)
	if err != nil {
		return fmt.Errorf("encode member %s: %w", m.Name, err)
	}
	var n int64
	if err := r.call(ctx, "members", func(ctx context.Context) error {
		var err error
		n, err = r.client.HLen(ctx, r.membersKey()).Result()
		return err
	}); err != nil {
		return fmt.Errorf("put member %s: %w", m.Name, err)
	}
	if n >= store.MaxMembers {
		if _, ok := r.ledger.membersCopy()[m.Name]; !ok {
			return fmt.Errorf("put member %s: %w", m.Name, store.ErrTooManyMembers)
		}
	}
	v, err := r.epochWrite(ctx, "members", "put member "+m.Name, func(ctx context.Context) (int64, error) {
		return scriptCredPut.Run(ctx, r.client, []string{r.membersKey(), r.memberVersionsKey(), r.removedKey(), r.epochKey()},
			m.Name, string(b), r.knownEpoch(), memberKind).Int64()
	})
	if err != nil {
		return err
	}
	m.Version, m.Unreadable = v, ""
	r.ledger.putMember(m)
	r.announceCreds(ctx)
	return nil
}

// Members returns the members in Redis, with the ones this replica holds
// that Redis lost (written back). An unreadable one is listed with
// Unreadable set and this replica's last good copy, if any (repaired
// when the copy is of the stored version).
func (r *Store) Members(ctx context.Context) ([]store.Member, error) {
	return readNamed(ctx, r, named[store.Member]{
		kind: "member", removal: memberKind, op: "members", key: r.membersKey(), versions: r.memberVersionsKey(),
		expect: "not the expected JSON with a key digest",
		decode: func(name, raw string) (store.Member, error) {
			var m store.Member
			if err := json.Unmarshal([]byte(raw), &m); err != nil {
				return m, err
			}
			m.Name = name
			return m, m.Validate()
		},
		version: func(m store.Member) int64 { return m.Version },
		with: func(m store.Member, name string, v int64) store.Member {
			m.Name, m.Version = name, v
			return m
		},
		bad: func(m store.Member, name, why string) store.Member {
			m.Name, m.Unreadable = name, why
			return m
		},
		mine: r.ledger.membersCopy,
		keep: r.ledger.putMember,
		repair: func(ctx context.Context, lost []store.Member) {
			if _, err := r.writeMembers(ctx, lost, true); err != nil {
				r.log.Warn("writing members back failed; trying again at the next read", "err", err)
			}
		},
		sorted: sortedMembers,
	})
}

func sortedMembers(m map[string]store.Member) []store.Member {
	out := slices.Collect(maps.Values(m))
	store.SortMembers(out)
	return out
}

// RemoveMember deletes a member from Redis and records the removal, or
// returns store.ErrNotFound.
func (r *Store) RemoveMember(ctx context.Context, name string) error {
	v, err := r.epochWrite(ctx, "members", "remove member "+name, func(ctx context.Context) (int64, error) {
		return scriptCredRemove.Run(ctx, r.client, []string{r.membersKey(), r.memberVersionsKey(), r.removedKey(), r.epochKey()},
			name, r.knownEpoch(), memberKind).Int64()
	})
	if err != nil {
		return err
	}
	if v == 0 {
		return store.ErrNotFound
	}
	r.ledger.dropMember(name, v)
	r.announceCreds(ctx)
	return nil
}

// writeMembers puts members back (a write-back, a restore): each unless
// Redis holds it in the same or a newer version or removed it since; with
// repair, over the same version too (its record was unreadable).
func (r *Store) writeMembers(ctx context.Context, ms []store.Member, repair bool) (store.RestoreCount, error) {
	flag := "0"
	if repair {
		flag = "1"
	}
	calls := make([]scriptCall, 0, len(ms))
	for _, m := range ms {
		data, err := memberRecord(m)
		if err != nil {
			return store.RestoreCount{}, fmt.Errorf("encode member %s: %w", m.Name, err)
		}
		calls = append(calls, scriptCall{keys: []string{r.membersKey(), r.memberVersionsKey(), r.removedKey()},
			args: []any{m.Name, max(m.Version, 1), string(data), flag, memberKind}})
	}
	got, err := r.runAll(ctx, "restore", scriptRestoreCred, calls)
	if err != nil {
		return store.RestoreCount{}, fmt.Errorf("write back the members: %w", err)
	}
	n := count(got)
	r.metrics.restored.WithLabelValues("member").Add(float64(n))
	return store.RestoreCount{Restored: n, Kept: len(got) - n}, nil
}
