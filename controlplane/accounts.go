package controlplane

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
)

// DefaultMaxAccountsPerCredential is the default
// Options.MaxAccountsPerCredential.
const DefaultMaxAccountsPerCredential = 1000

// RegisteredAccountIdle is how long an account stays registered after the
// last hello, heartbeat or Admit of a data plane that serves it. An open
// agent stream keeps its accounts registered.
const RegisteredAccountIdle = 10 * time.Minute

// knownFor is how long an account another replica's agents registered, or
// an operator configured, is remembered as known without asking the store
// again.
const knownFor = time.Minute

// capError is a registration past an agent credential's cap.
type capError struct {
	credential  string
	max, adding int
	have        int
}

func (e *capError) Error() string {
	return fmt.Sprintf("agent credential %q may register at most %d accounts (clodex-controlplane --max-agent-accounts); it serves %d and this would add %d",
		e.credential, e.max, e.have, e.adding)
}

// unknownAccountError is an Admit for an account nobody configured or
// serves.
type unknownAccountError struct{ key string }

func (e *unknownAccountError) Error() string {
	return fmt.Sprintf("account %s is not registered: no operator configured it and no registered data plane serves it; a data plane registers the accounts it serves on its agent stream, an operator with clodexctl set-rate", e.key)
}

// accountRegistry is the accounts registered data planes serve, per agent
// credential, each with when it was last named. A credential registers at
// most max accounts.
type accountRegistry struct {
	max int // immutable

	mu     sync.RWMutex                    // guards the following fields
	byCred map[string]map[string]time.Time // credential -> key -> last named
	known  map[string]time.Time            // key -> known until (other replicas' agents, operators)
}

func newAccountRegistry(maxPerCredential int) *accountRegistry {
	return &accountRegistry{max: maxPerCredential, byCred: map[string]map[string]time.Time{}, known: map[string]time.Time{}}
}

// register records that cred serves keys at now. When the keys new to
// cred would take it past the cap, nothing is registered and the error is
// a *capError.
func (r *accountRegistry) register(cred string, keys []string, now time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byCred[cred]
	if m == nil {
		m = map[string]time.Time{}
		r.byCred[cred] = m
	}
	adding := 0
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			adding++
		}
	}
	if len(m)+adding > r.max {
		return &capError{credential: cred, max: r.max, have: len(m), adding: adding}
	}
	for _, k := range keys {
		m[k] = now
	}
	return nil
}

// served reports whether a data plane registered key or it is known.
func (r *accountRegistry) served(key string, now time.Time) bool {
	r.mu.RLock() // on every Admit
	defer r.mu.RUnlock()
	for _, m := range r.byCred {
		if _, ok := m[key]; ok {
			return true
		}
	}
	return now.Before(r.known[key])
}

// remember marks key known until now+knownFor.
func (r *accountRegistry) remember(key string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.known[key] = now.Add(knownFor)
}

// sweep forgets the accounts not named for RegisteredAccountIdle and the
// known ones past their time.
func (r *accountRegistry) sweep(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for cred, m := range r.byCred {
		for k, at := range m {
			if now.Sub(at) >= RegisteredAccountIdle {
				delete(m, k)
			}
		}
		if len(m) == 0 {
			delete(r.byCred, cred)
		}
	}
	for k, until := range r.known {
		if !now.Before(until) {
			delete(r.known, k)
		}
	}
}

// checkServed allows an admission (or a hand-over) for key when an
// operator configured it or a data plane serves it: registered on this
// replica (an agent's hello or heartbeat, or an earlier Admit), in the
// store's fleet-wide agent directory, or named by this Admit, which
// carries the data plane's agent id (registering it for the caller's
// credential, within the cap: a data plane's first Admit for an account
// may come before its agent stream says hello). An Admit without an agent
// id registers nothing. The admin token is an operator's. The error is a
// status error.
func (s *Server) checkServed(ctx context.Context, method, key, agentID string) error {
	now := s.now()
	if s.accounts.served(key, now) {
		return nil
	}
	// An operator's call, or a scoped credential's account: an operator
	// named it when creating the credential (checkScope admitted it).
	if scopeFrom(ctx) != nil {
		return nil
	}
	cred := s.auth.credential(ctx)
	if cred == adminCredential {
		return nil
	}
	if agentID != "" && len(agentID) <= maxAgentIDLen && cred == agentCredential {
		if err := s.accounts.register(cred, []string{key}, now); err != nil {
			s.denied.record(ctx, method, DenyAccountCap)
			return status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil
	}
	acct, err := s.opts.Policies.Account(ctx, key, now)
	switch {
	case err == nil && acct.Custom:
		s.accounts.remember(key, now)
		return nil
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return s.toStatus(ctx, method, err)
	}
	if s.agents.servedInFleet(ctx, key, now) {
		s.accounts.remember(key, now)
		return nil
	}
	s.denied.record(ctx, method, DenyUnknownAccount)
	return status.Error(codes.PermissionDenied, (&unknownAccountError{key: key}).Error())
}
