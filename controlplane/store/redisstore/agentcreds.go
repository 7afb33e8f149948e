package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/clodex/clodex/controlplane/store"
)

func (r *Store) agentCredsKey() string { return r.prefix + "agentcreds" }

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

// PutAgentCred stores c in Redis (one hash field per credential) and
// announces the change.
func (r *Store) PutAgentCred(ctx context.Context, c store.AgentCred) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode agent credential %s: %w", c.Name, err)
	}
	return r.call(ctx, "agentcreds", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		pipe.HSet(ctx, r.agentCredsKey(), c.Name, string(b))
		pipe.Publish(ctx, r.credsChannel(), r.replica)
		_, err := pipe.Exec(ctx)
		return err
	})
}

// AgentCreds returns the credentials in Redis.
func (r *Store) AgentCreds(ctx context.Context) ([]store.AgentCred, error) {
	var m map[string]string
	err := r.call(ctx, "agentcreds", func(ctx context.Context) error {
		v, err := r.client.HGetAll(ctx, r.agentCredsKey()).Result()
		m = v
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read agent credentials: %w", err)
	}
	out := make([]store.AgentCred, 0, len(m))
	for name, v := range m {
		var c store.AgentCred
		if err := json.Unmarshal([]byte(v), &c); err != nil {
			return nil, fmt.Errorf("read agent credential %s: not the expected JSON", name)
		}
		c.Name = name
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b store.AgentCred) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// RemoveAgentCred deletes a credential from Redis and announces the
// change.
func (r *Store) RemoveAgentCred(ctx context.Context, name string) error {
	var n int64
	err := r.call(ctx, "agentcreds", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		del := pipe.HDel(ctx, r.agentCredsKey(), name)
		pipe.Publish(ctx, r.credsChannel(), r.replica)
		_, err := pipe.Exec(ctx)
		n = del.Val()
		return err
	})
	if err != nil {
		return fmt.Errorf("remove agent credential %s: %w", name, err)
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}
