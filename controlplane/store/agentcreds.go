package store

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// AgentCred is a scoped agent credential: the digest of an agent token
// and the accounts it may use. The token itself is never stored.
type AgentCred struct {
	// Name is the operator's name for it (the record's name).
	Name string `json:"-"`
	// Digest is the SHA-256 of the token.
	Digest []byte `json:"sha256"`
	// Accounts are the account keys it may use, sorted.
	Accounts []string `json:"accounts"`
	// Created is when it was created.
	Created time.Time `json:"created"`
}

// AgentCreds keeps scoped agent credentials. LoginFile and Redis
// implement it.
type AgentCreds interface {
	// PutAgentCred creates or replaces the credential named c.Name.
	PutAgentCred(ctx context.Context, c AgentCred) error
	// AgentCreds returns every credential, ordered by name.
	AgentCreds(ctx context.Context) ([]AgentCred, error)
	// RemoveAgentCred deletes the credential name, or returns ErrNotFound.
	RemoveAgentCred(ctx context.Context, name string) error
}

var (
	_ AgentCreds = (*LoginFile)(nil)
	_ AgentCreds = (*Redis)(nil)
)

func sortCreds(cs []AgentCred) {
	slices.SortFunc(cs, func(a, b AgentCred) int { return cmp.Compare(a.Name, b.Name) })
}

// PutAgentCred stores c in the logins file.
func (f *LoginFile) PutAgentCred(ctx context.Context, c AgentCred) error {
	return f.update(ctx, func(d *loginsDoc) error {
		if d.AgentCreds == nil {
			d.AgentCreds = map[string]AgentCred{}
		}
		d.AgentCreds[c.Name] = c
		return nil
	})
}

// AgentCreds returns the credentials in the logins file.
func (f *LoginFile) AgentCreds(context.Context) ([]AgentCred, error) {
	d, err := f.read()
	if err != nil {
		return nil, err
	}
	out := make([]AgentCred, 0, len(d.AgentCreds))
	for name, c := range d.AgentCreds {
		c.Name = name
		out = append(out, c)
	}
	sortCreds(out)
	return out, nil
}

// RemoveAgentCred deletes a credential from the logins file.
func (f *LoginFile) RemoveAgentCred(ctx context.Context, name string) error {
	return f.update(ctx, func(d *loginsDoc) error {
		if _, ok := d.AgentCreds[name]; !ok {
			return ErrNotFound
		}
		delete(d.AgentCreds, name)
		return nil
	})
}

func (r *Redis) agentCredsKey() string { return r.prefix + "agentcreds" }

// PutAgentCred stores c in Redis (one hash field per credential).
func (r *Redis) PutAgentCred(ctx context.Context, c AgentCred) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode agent credential %s: %w", c.Name, err)
	}
	return r.call(ctx, "agentcreds", func(ctx context.Context) error {
		return r.client.HSet(ctx, r.agentCredsKey(), c.Name, string(b)).Err()
	})
}

// AgentCreds returns the credentials in Redis.
func (r *Redis) AgentCreds(ctx context.Context) ([]AgentCred, error) {
	var m map[string]string
	err := r.call(ctx, "agentcreds", func(ctx context.Context) error {
		v, err := r.client.HGetAll(ctx, r.agentCredsKey()).Result()
		m = v
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read agent credentials: %w", err)
	}
	out := make([]AgentCred, 0, len(m))
	for name, v := range m {
		var c AgentCred
		if err := json.Unmarshal([]byte(v), &c); err != nil {
			return nil, fmt.Errorf("read agent credential %s: not the expected JSON", name)
		}
		c.Name = name
		out = append(out, c)
	}
	sortCreds(out)
	return out, nil
}

// RemoveAgentCred deletes a credential from Redis.
func (r *Redis) RemoveAgentCred(ctx context.Context, name string) error {
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
		return ErrNotFound
	}
	return nil
}
