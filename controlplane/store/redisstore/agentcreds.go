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

// PutAgentCred stores c in Redis (one hash field per credential).
func (r *Store) PutAgentCred(ctx context.Context, c store.AgentCred) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode agent credential %s: %w", c.Name, err)
	}
	return r.call(ctx, "agentcreds", func(ctx context.Context) error {
		return r.client.HSet(ctx, r.agentCredsKey(), c.Name, string(b)).Err()
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

// RemoveAgentCred deletes a credential from Redis.
func (r *Store) RemoveAgentCred(ctx context.Context, name string) error {
	var n int64
	err := r.call(ctx, "agentcreds", func(ctx context.Context) error {
		v, err := r.client.HDel(ctx, r.agentCredsKey(), name).Result()
		n = v
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
