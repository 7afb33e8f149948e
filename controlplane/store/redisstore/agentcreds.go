package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/controlplane/store"
)

var (
	scriptCredPut    = mustPlainScript("cred_put")
	scriptCredRemove = mustPlainScript("cred_remove")
)

func (r *Store) agentCredsKey() string        { return r.prefix + "agentcreds" }
func (r *Store) agentCredVersionsKey() string { return r.prefix + "agentcreds:v" }

// credsChannel carries a notice (the replica's id) with every change of
// the agent credentials, so every replica reloads them at once: a
// removed credential stops working fleet-wide within a round trip.
func (r *Store) credsChannel() string { return r.prefix + "agentcreds-changed" }

// WatchAgentCreds registers fn to be called when another replica created,
// replaced or removed an agent credential, and when Redis answers again
// after an outage (notices may have been missed). fn runs on Run's
// goroutine and must not block.
func (r *Store) WatchAgentCreds(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.credWatchers = append(r.credWatchers, fn)
}

// credsNotice delivers another replica's notice.
func (r *Store) credsNotice(replica string) {
	if replica != r.replica {
		r.notifyCreds()
	}
}

func (r *Store) notifyCreds() {
	r.mu.Lock()
	ws := append([]func(){}, r.credWatchers...)
	r.mu.Unlock()
	for _, fn := range ws {
		fn()
	}
}

// announceCreds tells the other replicas that the credentials changed. A
// notice that does not go out costs them at most a fleet tick: they
// reload every tick anyway.
func (r *Store) announceCreds(ctx context.Context) {
	_ = r.call(ctx, "agentcreds", func(ctx context.Context) error {
		return r.client.Publish(ctx, r.credsChannel(), r.replica).Err()
	})
}

// PutAgentCred stores c in Redis (one hash field per credential, its
// version in a second hash), checking the store's epoch as PutLogin does.
func (r *Store) PutAgentCred(ctx context.Context, c store.AgentCred) error {
	c.Version, c.Unreadable = 0, ""
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode agent credential %s: %w", c.Name, err)
	}
	var v int64
	for attempt := 0; ; attempt++ {
		err = r.call(ctx, "agentcreds", func(ctx context.Context) error {
			n, err := scriptCredPut.Run(ctx, r.client, []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey(), r.epochKey()},
				c.Name, string(b), r.knownEpoch()).Int64()
			v = n
			return err
		})
		if err != nil || v != -3 || attempt > 0 {
			break
		}
		if err := r.healNow(ctx); err != nil {
			return fmt.Errorf("put agent credential %s: %w", c.Name, err)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("put agent credential %s: %w", c.Name, err)
	case v == -3:
		return fmt.Errorf("put agent credential %s: %w", c.Name, errHealing)
	}
	c.Version = v
	r.ledger.putCred(c)
	r.announceCreds(ctx)
	return nil
}

// AgentCreds returns the credentials in Redis, with the ones this replica
// holds that Redis lost (written back). An unreadable one is listed with
// Unreadable set and this replica's last good copy, if any.
func (r *Store) AgentCreds(ctx context.Context) ([]store.AgentCred, error) {
	var m, versions, removed map[string]string
	err := r.call(ctx, "agentcreds", func(ctx context.Context) error {
		pipe := r.client.Pipeline()
		a := pipe.HGetAll(ctx, r.agentCredsKey())
		v := pipe.HGetAll(ctx, r.agentCredVersionsKey())
		rm := pipe.HGetAll(ctx, r.removedKey())
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		m, versions, removed = a.Val(), v.Val(), rm.Val()
		return nil
	})
	if err != nil {
		if !answered(err) && ctx.Err() == nil {
			_, creds, _, _, _ := r.ledger.copyOf()
			if len(creds) > 0 {
				return sortCreds(creds), nil // Redis unreachable: this replica's copy
			}
		}
		return nil, fmt.Errorf("read agent credentials: %w", err)
	}
	tombs := parseRemoved(removed)
	r.ledger.noteRemoved(tombs)
	_, mine, _, _, _ := r.ledger.copyOf()
	out := make(map[string]store.AgentCred, len(m))
	var lost []store.AgentCred
	for name, v := range m {
		ver, _ := strconv.ParseInt(versions[name], 10, 64)
		var c store.AgentCred
		if err := json.Unmarshal([]byte(v), &c); err != nil || len(c.Digest) == 0 {
			bad := &store.BadRecordError{Kind: "agent credential", Name: name, Where: "redis hash " + r.agentCredsKey() + " field " + name,
				Err: errors.New("not the expected JSON with a token digest")}
			r.noteBad(bad)
			if cp, ok := mine[name]; ok && cp.Version == ver && ver > 0 {
				// a copy of the stored version: repair the record
				lost = append(lost, cp)
				out[name] = cp
				continue
			}
			c = mine[name]
			c.Name, c.Unreadable = name, bad.Error()
			out[name] = c
			continue
		}
		c.Name, c.Version = name, ver
		if cp, ok := mine[name]; ok && cp.Version > ver && tombs["cred:"+name] < cp.Version {
			r.noteLost("agent credential", name, r.agentCredsKey())
			lost = append(lost, cp)
			out[name] = cp
			continue
		}
		r.noteGood("agent credential", name)
		r.ledger.putCred(c)
		out[name] = c
	}
	for name, cp := range mine {
		if _, ok := m[name]; !ok && tombs["cred:"+name] < max(cp.Version, 1) {
			r.noteLost("agent credential", name, r.agentCredsKey())
			lost = append(lost, cp)
			out[name] = cp
		}
	}
	if len(lost) > 0 {
		r.repairCreds(ctx, lost)
	}
	return sortCreds(out), nil
}

// repairCreds writes this replica's copies of credentials back over
// missing, older or unreadable records of the same version.
func (r *Store) repairCreds(ctx context.Context, cs []store.AgentCred) {
	calls := make([]scriptCall, 0, len(cs))
	for _, c := range cs {
		data, err := json.Marshal(store.AgentCred{Name: c.Name, Digest: c.Digest, Accounts: c.Accounts, Created: c.Created})
		if err != nil {
			continue
		}
		calls = append(calls, scriptCall{keys: []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey()},
			args: []any{c.Name, max(c.Version, 1), string(data), "1"}})
	}
	if _, err := r.runAll(ctx, "restore", scriptRestoreCred, calls); err != nil {
		r.log.Warn("writing agent credentials back failed; trying again at the next read", "err", err)
	}
}

func sortCreds(m map[string]store.AgentCred) []store.AgentCred {
	out := make([]store.AgentCred, 0, len(m))
	for _, c := range m {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b store.AgentCred) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// RemoveAgentCred deletes a credential from Redis and records the removal.
func (r *Store) RemoveAgentCred(ctx context.Context, name string) error {
	var v int64
	var err error
	for attempt := 0; ; attempt++ {
		err = r.call(ctx, "agentcreds", func(ctx context.Context) error {
			n, err := scriptCredRemove.Run(ctx, r.client, []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey(), r.epochKey()},
				name, r.knownEpoch()).Int64()
			v = n
			return err
		})
		if err != nil || v != -3 || attempt > 0 {
			break
		}
		if err := r.healNow(ctx); err != nil {
			return fmt.Errorf("remove agent credential %s: %w", name, err)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("remove agent credential %s: %w", name, err)
	case v == -3:
		return fmt.Errorf("remove agent credential %s: %w", name, errHealing)
	case v == 0:
		return store.ErrNotFound
	}
	r.ledger.dropCred(name, v)
	r.announceCreds(ctx)
	return nil
}
