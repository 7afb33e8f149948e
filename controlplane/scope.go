package controlplane

import (
	"context"
	"crypto/sha256"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// AgentCredStore keeps the scoped agent credentials (Options.AgentCreds).
// *store.LoginFile (the data directory) and *redisstore.Store (Redis)
// implement it.
type AgentCredStore interface {
	// PutAgentCred creates or replaces the credential named c.Name.
	PutAgentCred(ctx context.Context, c store.AgentCred) error
	// AgentCreds returns every credential, ordered by name.
	AgentCreds(ctx context.Context) ([]store.AgentCred, error)
	// RemoveAgentCred deletes the credential name, or returns
	// store.ErrNotFound.
	RemoveAgentCred(ctx context.Context, name string) error
}

// scopedCred is a scoped agent credential as the authenticator holds it.
type scopedCred struct {
	name     string
	accounts []string // sorted
}

func (c *scopedCred) allows(key string) bool {
	_, ok := slices.BinarySearch(c.accounts, key)
	return ok
}

// scopeSet is the scoped agent credentials, by token digest, reloaded
// from the store (Options.AgentCreds) when one is created or removed here
// and every fleet tick, so every replica learns them within a tick.
type scopeSet struct {
	byDigest atomic.Pointer[map[[sha256.Size]byte]*scopedCred]
	logged   sync.Map // credential name -> struct{}: its first out-of-scope call was logged
}

func (s *scopeSet) lookup(sum [sha256.Size]byte) *scopedCred {
	m := s.byDigest.Load()
	if m == nil {
		return nil
	}
	return (*m)[sum]
}

// reloadScopes reads the scoped agent credentials from the store. A
// failure keeps the ones loaded before.
func (s *Server) reloadScopes(ctx context.Context) error {
	if s.opts.AgentCreds == nil {
		return nil
	}
	cs, err := s.opts.AgentCreds.AgentCreds(ctx)
	if err != nil {
		return fmt.Errorf("load agent credentials: %w", err)
	}
	m := make(map[[sha256.Size]byte]*scopedCred, len(cs))
	for _, c := range cs {
		if len(c.Digest) != sha256.Size {
			// Unreadable without a copy: keep enforcing the one loaded
			// before, if any.
			if sum, old := s.scopes.byName(c.Name); old != nil {
				m[sum] = old
			}
			continue
		}
		m[[sha256.Size]byte(c.Digest)] = &scopedCred{name: c.Name, accounts: slices.Sorted(slices.Values(c.Accounts))}
	}
	s.scopes.byDigest.Store(&m)
	return nil
}

// byName returns the loaded credential named name and its digest.
func (s *scopeSet) byName(name string) ([sha256.Size]byte, *scopedCred) {
	if m := s.byDigest.Load(); m != nil {
		for sum, c := range *m {
			if c.name == name {
				return sum, c
			}
		}
	}
	return [sha256.Size]byte{}, nil
}

// scopeKey carries the caller's *scopedCred in a request context.
type scopeKey struct{}

func withScope(ctx context.Context, c *scopedCred) context.Context {
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, scopeKey{}, c)
}

func scopeFrom(ctx context.Context) *scopedCred {
	c, _ := ctx.Value(scopeKey{}).(*scopedCred)
	return c
}

// scopedStream overrides a server stream's context with the caller's scope.
type scopedStream struct {
	grpc.ServerStream
	ctx context.Context // the stream's context plus the scope (an adapter; see grpc.ServerStream)
}

func (s scopedStream) Context() context.Context { return s.ctx }

// scopeOf returns the accounts the caller's agent credential is scoped
// to; ok is false for an unscoped caller (the fleet's agent token, the
// admin token).
func (s *Server) scopeOf(ctx context.Context) (keys []string, ok bool) {
	c := scopeFrom(ctx)
	if c == nil {
		return nil, false
	}
	return c.accounts, true
}

// checkScope returns nil when the caller may act for key, else
// PermissionDenied; the first refusal of each credential is logged, and
// every one is counted.
func (s *Server) checkScope(ctx context.Context, op, key string) error {
	c := scopeFrom(ctx)
	if c == nil || c.allows(key) {
		return nil
	}
	s.denied.record(ctx, op, DenyPermission)
	if _, seen := s.scopes.logged.LoadOrStore(c.name, struct{}{}); !seen {
		s.log.WarnContext(ctx, "agent credential used outside its accounts; refusing (logged once per credential)",
			"agent_credential", c.name, "account", key, "method", op, "peer", peerIP(ctx))
	}
	return status.Errorf(codes.PermissionDenied, "agent credential %q may use only the accounts %s; %s is not one of them (an operator grants accounts with clodexctl agent create NAME --accounts ...)",
		c.name, strings.Join(c.accounts, ","), key)
}

// checkScopes checks every key (a hello's or a heartbeat's accounts).
func (s *Server) checkScopes(ctx context.Context, op string, keys []string) error {
	for _, k := range keys {
		if err := s.checkScope(ctx, op, k); err != nil {
			return err
		}
	}
	return nil
}

var credNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

func (a *adminService) CreateAgentCredential(ctx context.Context, req *controlplanev1.CreateAgentCredentialRequest) (*controlplanev1.CreateAgentCredentialResponse, error) {
	s := a.s
	if s.opts.AgentCreds == nil {
		return nil, errNoAgentCreds
	}
	if !credNamePattern.MatchString(req.GetName()) {
		return nil, s.toStatus(ctx, "CreateAgentCredential", invalidf("name %q is invalid; want 1..64 letters, digits, '.', '_' or '-', starting with a letter or digit", req.GetName()))
	}
	if len(req.GetAccounts()) == 0 {
		return nil, s.toStatus(ctx, "CreateAgentCredential", invalidf("accounts is empty; name at least one account the agent may use"))
	}
	accts, err := validAccounts(req.GetAccounts())
	if err != nil {
		return nil, s.toStatus(ctx, "CreateAgentCredential", err)
	}
	sum := req.GetTokenSha256()
	if len(sum) != sha256.Size {
		return nil, s.toStatus(ctx, "CreateAgentCredential", invalidf("token_sha256 is %d bytes; want %d (the SHA-256 of the agent's token)", len(sum), sha256.Size))
	}
	if s.auth.isFleetToken([sha256.Size]byte(sum)) {
		return nil, s.toStatus(ctx, "CreateAgentCredential", invalidf("the token is the admin or the fleet's agent token; a scoped credential needs a token of its own"))
	}
	c := store.AgentCred{Name: req.GetName(), Digest: sum, Accounts: accts, Created: s.now()}
	if err := s.opts.AgentCreds.PutAgentCred(ctx, c); err != nil {
		return nil, s.toStatus(ctx, "CreateAgentCredential", err)
	}
	if err := s.reloadScopes(ctx); err != nil {
		s.log.WarnContext(ctx, "reload agent credentials", "err", err)
	}
	s.log.InfoContext(ctx, "agent credential created", "agent_credential", c.Name, "accounts", accts)
	return &controlplanev1.CreateAgentCredentialResponse{Credential: agentCredProto(c)}, nil
}

func agentCredProto(c store.AgentCred) *controlplanev1.AgentCredential {
	p := &controlplanev1.AgentCredential{Name: c.Name, Accounts: slices.Clone(c.Accounts), Unreadable: c.Unreadable}
	if !c.Created.IsZero() {
		p.CreatedUnixMs = c.Created.UnixMilli()
	}
	return p
}

func (a *adminService) ListAgentCredentials(ctx context.Context, req *controlplanev1.ListAgentCredentialsRequest) (*controlplanev1.ListAgentCredentialsResponse, error) {
	s := a.s
	if s.opts.AgentCreds == nil {
		return nil, errNoAgentCreds
	}
	cs, err := s.opts.AgentCreds.AgentCreds(ctx)
	if err != nil {
		return nil, s.toStatus(ctx, "ListAgentCredentials", err)
	}
	out := make([]*controlplanev1.AgentCredential, len(cs))
	for i, c := range cs {
		out[i] = agentCredProto(c)
	}
	pg, next, err := pageOf(out, (*controlplanev1.AgentCredential).GetName, req.GetPageSize(), req.GetPageToken(), DefaultAgentCredsPage, MaxAgentCredsPage)
	if err != nil {
		return nil, s.toStatus(ctx, "ListAgentCredentials", err)
	}
	return &controlplanev1.ListAgentCredentialsResponse{Credentials: pg, NextPageToken: next}, nil
}

func (a *adminService) RemoveAgentCredential(ctx context.Context, req *controlplanev1.RemoveAgentCredentialRequest) (*controlplanev1.RemoveAgentCredentialResponse, error) {
	s := a.s
	if s.opts.AgentCreds == nil {
		return nil, errNoAgentCreds
	}
	if err := s.opts.AgentCreds.RemoveAgentCred(ctx, req.GetName()); err != nil {
		return nil, s.toStatus(ctx, "RemoveAgentCredential", err)
	}
	if err := s.reloadScopes(ctx); err != nil {
		s.log.WarnContext(ctx, "reload agent credentials", "err", err)
	}
	s.log.InfoContext(ctx, "agent credential removed", "agent_credential", req.GetName())
	return &controlplanev1.RemoveAgentCredentialResponse{}, nil
}

// errNoAgentCreds answers the agent-credential RPCs without a store.
var errNoAgentCreds = status.Error(codes.FailedPrecondition, "this control plane keeps no agent credentials")

// scopeReloadTimeout bounds the fleet loop's reload.
const scopeReloadTimeout = 2 * time.Second
