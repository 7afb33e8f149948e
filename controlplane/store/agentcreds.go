package store

import (
	"cmp"
	"context"
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
	// Version counts the credential's writes (Redis; 0 in the data
	// dir's logins.json): a restore keeps the newer of two copies.
	Version int64 `json:"version,omitempty"`
	// Unreadable, when set, says the stored record does not decode (the
	// other fields are the last good copy, if any). Never stored.
	Unreadable string `json:"-"`
}

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
	out := listNamed(d.AgentCreds, func(c *AgentCred, name string) { c.Name = name })
	sortCreds(out)
	return out, nil
}

// RemoveAgentCred deletes a credential from the logins file.
func (f *LoginFile) RemoveAgentCred(ctx context.Context, name string) error {
	return f.update(ctx, func(d *loginsDoc) error { return removeNamed(d.AgentCreds, name) })
}

// listNamed returns the records of a logins file's map, each with its
// name (the map's key) set.
func listNamed[R any](m map[string]R, setName func(*R, string)) []R {
	out := make([]R, 0, len(m))
	for name, r := range m {
		setName(&r, name)
		out = append(out, r)
	}
	return out
}

// removeNamed deletes m's record name, or returns ErrNotFound.
func removeNamed[R any](m map[string]R, name string) error {
	if _, ok := m[name]; !ok {
		return ErrNotFound
	}
	delete(m, name)
	return nil
}
