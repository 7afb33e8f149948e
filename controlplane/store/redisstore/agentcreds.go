package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

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
	v, err := r.epochWrite(ctx, "agentcreds", "put agent credential "+c.Name, func(ctx context.Context) (int64, error) {
		return scriptCredPut.Run(ctx, r.client, []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey(), r.epochKey()},
			c.Name, string(b), r.knownEpoch()).Int64()
	})
	if err != nil {
		return err
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
	return readNamed(ctx, r, named[store.AgentCred]{
		kind: "agent credential", removal: "cred", op: "agentcreds", key: r.agentCredsKey(), versions: r.agentCredVersionsKey(),
		expect: "not the expected JSON with a token digest",
		decode: func(_, raw string) (store.AgentCred, error) {
			var c store.AgentCred
			if err := json.Unmarshal([]byte(raw), &c); err != nil || len(c.Digest) == 0 {
				return c, errors.New("bad agent credential")
			}
			return c, nil
		},
		version: func(c store.AgentCred) int64 { return c.Version },
		with: func(c store.AgentCred, name string, v int64) store.AgentCred {
			c.Name, c.Version = name, v
			return c
		},
		bad: func(c store.AgentCred, name, why string) store.AgentCred {
			c.Name, c.Unreadable = name, why
			return c
		},
		mine: func() map[string]store.AgentCred {
			_, creds, _, _, _ := r.ledger.copyOf()
			return creds
		},
		keep: r.ledger.putCred, repair: r.repairCreds, sorted: sortCreds,
	})
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
	v, err := r.epochWrite(ctx, "agentcreds", "remove agent credential "+name, func(ctx context.Context) (int64, error) {
		return scriptCredRemove.Run(ctx, r.client, []string{r.agentCredsKey(), r.agentCredVersionsKey(), r.removedKey(), r.epochKey()},
			name, r.knownEpoch()).Int64()
	})
	if err != nil {
		return err
	}
	if v == 0 {
		return store.ErrNotFound
	}
	r.ledger.dropCred(name, v)
	r.announceCreds(ctx)
	return nil
}
