package controlplane

import (
	"context"
	"crypto/sha256"
	"errors"
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

	"github.com/clodex/clodex/controlplane/broker"
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
// A reload makes new ones: an agent stream keeps the one it connected
// with, and is closed when a reload drops or replaces it (revoke.go).
type scopedCred struct {
	name     string
	digest   [sha256.Size]byte
	accounts []string // sorted
}

func (c *scopedCred) allows(key string) bool {
	_, ok := slices.BinarySearch(c.accounts, key)
	return ok
}

// scopeSet is the scoped agent credentials, by token digest, reloaded
// from the store (Options.AgentCreds) when one is created or removed here,
// every fleet tick, and when a token is presented that none matches (at
// most once per unknownReloadEvery): a credential another replica just
// created works here at once, not a tick later.
type scopeSet struct {
	store    AgentCredStore // nil: no scoped credentials
	byDigest atomic.Pointer[map[[sha256.Size]byte]*scopedCred]
	logged   sync.Map // credential name -> struct{}: its first out-of-scope call was logged

	unknownMu   sync.Mutex // serializes reloads for unknown tokens; guards lastUnknown
	lastUnknown time.Time  // wall time of the last such reload

	mu      sync.Mutex                   // guards the following fields
	revoked map[[sha256.Size]byte]string // credentials a reload dropped, by digest: their names
	order   [][sha256.Size]byte          // revoked's digests, oldest first
}

// maxRevoked bounds the revoked credentials a replica remembers, to name
// them when their token is refused.
const maxRevoked = 1000

// replace installs the credentials m and remembers the ones it drops as
// revoked (a credential created again is no longer revoked).
func (s *scopeSet) replace(m map[[sha256.Size]byte]*scopedCred) {
	old := s.byDigest.Swap(&m)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.revoked == nil {
		s.revoked = map[[sha256.Size]byte]string{}
	}
	for d := range m {
		delete(s.revoked, d)
	}
	if old != nil {
		for d, c := range *old {
			if _, kept := m[d]; !kept {
				if _, known := s.revoked[d]; !known {
					s.order = append(s.order, d)
				}
				s.revoked[d] = c.name
			}
		}
	}
	s.order = slices.DeleteFunc(s.order, func(d [sha256.Size]byte) bool { _, ok := s.revoked[d]; return !ok })
	for len(s.order) > maxRevoked {
		delete(s.revoked, s.order[0])
		s.order = s.order[1:]
	}
}

// revokedName returns the name of the credential with digest sum when a
// reload dropped it.
func (s *scopeSet) revokedName(sum [sha256.Size]byte) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name, ok := s.revoked[sum]
	return name, ok
}

// Reloads for a token no credential matches: at most one per
// unknownReloadEvery, shared by the callers that wait for it, each bounded
// by unknownReloadTimeout. An unknown token costs no state, and a flood of
// them at most four store reads a second for the whole server.
const (
	unknownReloadEvery   = 250 * time.Millisecond
	unknownReloadTimeout = 100 * time.Millisecond
)

func (s *scopeSet) lookup(sum [sha256.Size]byte) *scopedCred {
	m := s.byDigest.Load()
	if m == nil {
		return nil
	}
	return (*m)[sum]
}

// find returns the credential of sum, reloading the credentials first when
// none matches (within the limits above).
func (s *scopeSet) find(ctx context.Context, sum [sha256.Size]byte) *scopedCred {
	if c := s.lookup(sum); c != nil || s.store == nil {
		return c
	}
	s.unknownMu.Lock()
	defer s.unknownMu.Unlock()
	if c := s.lookup(sum); c != nil { // loaded while this caller waited
		return c
	}
	// Wall time, not the server's clock (which may be Redis's, or a test's
	// fixed one): this only paces store reads.
	if now := time.Now(); now.Sub(s.lastUnknown) >= unknownReloadEvery {
		s.lastUnknown = now
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unknownReloadTimeout)
		_ = s.load(cctx) // a failure keeps the credentials loaded before
		cancel()
	}
	return s.lookup(sum)
}

// load reads the scoped agent credentials from the store. A failure keeps
// the ones loaded before.
func (s *scopeSet) load(ctx context.Context) error {
	if s.store == nil {
		return nil
	}
	cs, err := s.store.AgentCreds(ctx)
	if err != nil {
		return fmt.Errorf("load agent credentials: %w", err)
	}
	m := make(map[[sha256.Size]byte]*scopedCred, len(cs))
	for _, c := range cs {
		if len(c.Digest) != sha256.Size {
			// Unreadable without a copy: keep enforcing the one loaded
			// before, if any.
			if sum, old := s.byName(c.Name); old != nil {
				m[sum] = old
			}
			continue
		}
		d := [sha256.Size]byte(c.Digest)
		m[d] = &scopedCred{name: c.Name, digest: d, accounts: slices.Sorted(slices.Values(c.Accounts))}
	}
	s.replace(m)
	return nil
}

// reloadScopes reads the scoped agent credentials from the store, then
// closes the agent streams of credentials removed or replaced since
// (revokeStale). A failure keeps the ones loaded before. A reload for an
// unknown token (find) closes nothing: the next one does, within a fleet
// tick.
func (s *Server) reloadScopes(ctx context.Context) error {
	if err := s.scopes.load(ctx); err != nil {
		return err
	}
	s.revokeStale(ctx)
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
	if err := s.checkSignedIn(ctx, accts); err != nil {
		return nil, err
	}
	c := store.AgentCred{Name: req.GetName(), Digest: sum, Accounts: accts, Created: s.now()}
	if err := s.opts.AgentCreds.PutAgentCred(ctx, c); err != nil {
		return nil, s.storeStatus(ctx, "CreateAgentCredential", err)
	}
	if err := s.reloadScopes(ctx); err != nil {
		s.log.WarnContext(ctx, "reload agent credentials", "err", err)
	}
	s.log.InfoContext(ctx, "agent credential created", "agent_credential", c.Name, "accounts", accts)
	return &controlplanev1.CreateAgentCredentialResponse{Credential: agentCredProto(c)}, nil
}

// checkSignedIn refuses a scoped credential for accounts the credential
// broker holds no sign-in for: a data plane given it would get no token
// for them, and every turn would fail. Without a broker it checks nothing
// (data planes then bring their own auth.json).
func (s *Server) checkSignedIn(ctx context.Context, keys []string) error {
	if s.opts.Broker == nil {
		return nil
	}
	var missing []string
	for _, k := range keys {
		_, err := s.opts.Broker.Get(ctx, k)
		switch {
		case errors.Is(err, broker.ErrUnknownAccount):
			missing = append(missing, k)
		case err != nil:
			return s.storeStatus(ctx, "CreateAgentCredential", err)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition,
		"the credential broker holds no sign-in for %s: a data plane with this credential would get no access token for it; sign the account in first (clodexctl account import --codex-auth FILE, or clodexctl account login), then create the credential; clodexctl account list shows the sign-ins it holds",
		strings.Join(missing, ", "))
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
	pg, next, err := listPage(ctx, s, "ListAgentCredentials", req, DefaultAgentCredsPage, MaxAgentCredsPage,
		s.opts.AgentCreds.AgentCreds, s.storeStatus, agentCredProto, (*controlplanev1.AgentCredential).GetName)
	if err != nil {
		return nil, err
	}
	return &controlplanev1.ListAgentCredentialsResponse{Credentials: pg, NextPageToken: next}, nil
}

func (a *adminService) RemoveAgentCredential(ctx context.Context, req *controlplanev1.RemoveAgentCredentialRequest) (*controlplanev1.RemoveAgentCredentialResponse, error) {
	s := a.s
	if s.opts.AgentCreds == nil {
		return nil, errNoAgentCreds
	}
	if err := s.opts.AgentCreds.RemoveAgentCred(ctx, req.GetName()); err != nil {
		return nil, s.storeStatus(ctx, "RemoveAgentCredential", err)
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
