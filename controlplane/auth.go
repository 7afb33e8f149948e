package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// role is what a presented token may do.
type role int

const (
	roleNone role = iota
	roleAgent
	roleAdmin
)

// adminPrefix starts the full method name of every AdminService RPC.
var adminPrefix = "/" + controlplanev1.AdminService_ServiceDesc.ServiceName + "/"

// healthPrefix starts grpc.health.v1.Health's methods, which need no token:
// probes (a kubelet's gRPC probe, a load balancer's health check) cannot
// send one, and the answer is only SERVING or NOT_SERVING per service name.
var healthPrefix = "/" + healthpb.Health_ServiceDesc.ServiceName + "/"

// authenticator checks bearer tokens. It keeps only SHA-256 digests, so a
// comparison takes the same time whatever the presented token's length.
type authenticator struct {
	admin, agent [sha256.Size]byte // immutable
	scopes       *scopeSet         // scoped agent credentials
}

func newAuthenticator(admin, agent bearer.Token, scopes *scopeSet) *authenticator {
	return &authenticator{
		admin:  sha256.Sum256([]byte(admin.Reveal())),
		agent:  sha256.Sum256([]byte(agent.Reveal())),
		scopes: scopes,
	}
}

// isFleetToken reports whether sum is the admin or the fleet's agent
// token's digest.
func (a *authenticator) isFleetToken(sum [sha256.Size]byte) bool {
	return subtle.ConstantTimeCompare(sum[:], a.admin[:])|subtle.ConstantTimeCompare(sum[:], a.agent[:]) == 1
}

// role returns the role of the bearer token in ctx's metadata, and for a
// scoped agent credential the credential.
func (a *authenticator) role(ctx context.Context) (role, *scopedCred) {
	// ValueFromIncomingContext reads the one header; FromIncomingContext
	// would copy the whole metadata map on every RPC.
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	if len(vals) != 1 {
		return roleNone, nil
	}
	v := vals[0]
	const scheme = "bearer "
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return roleNone, nil
	}
	sum := sha256.Sum256([]byte(v[len(scheme):]))
	// Compare with both so the time does not tell which one matched.
	isAdmin := subtle.ConstantTimeCompare(sum[:], a.admin[:])
	isAgent := subtle.ConstantTimeCompare(sum[:], a.agent[:])
	switch {
	case isAdmin == 1:
		return roleAdmin, nil
	case isAgent == 1:
		return roleAgent, nil
	}
	// A scoped credential is found by its digest: the lookup's time
	// depends on the digest, never on the token.
	if c := a.scopes.find(ctx, sum); c != nil {
		return roleAgent, c
	}
	return roleNone, nil
}

// revoked returns the name of the revoked scoped credential whose token
// ctx's metadata presents (revoke.go), when this replica saw it removed.
func (a *authenticator) revoked(ctx context.Context) (string, bool) {
	vals := metadata.ValueFromIncomingContext(ctx, "authorization")
	const scheme = "bearer "
	if len(vals) != 1 || len(vals[0]) <= len(scheme) || !strings.EqualFold(vals[0][:len(scheme)], scheme) {
		return "", false
	}
	return a.scopes.revokedName(sha256.Sum256([]byte(vals[0][len(scheme):])))
}

// Agent credentials: who a valid token names. A data plane's registered
// accounts are counted per credential (Options.MaxAccountsPerCredential).
// The fleet's agent token is one credential, each scoped agent credential
// another ("agent:NAME").
const (
	adminCredential        = "admin"
	agentCredential        = "agent"
	scopedCredentialPrefix = "agent:" // + the scoped credential's name
)

// credential returns the credential of the bearer token in ctx's
// metadata, "" for none.
func (a *authenticator) credential(ctx context.Context) string {
	r, scope := a.role(ctx)
	switch {
	case r == roleAdmin:
		return adminCredential
	case scope != nil:
		return scopedCredentialPrefix + scope.name
	case r == roleAgent:
		return agentCredential
	}
	return ""
}

// authorize returns nil when ctx may call method, else the status error.
func (s *Server) authorize(ctx context.Context, method string) error {
	_, err := s.authorizeScoped(ctx, method)
	return err
}

// authorizeScoped is authorize that also returns the caller's scoped
// agent credential (nil for the admin and the fleet's agent token).
func (s *Server) authorizeScoped(ctx context.Context, method string) (*scopedCred, error) {
	if strings.HasPrefix(method, healthPrefix) {
		return nil, nil
	}
	r, scope := s.auth.role(ctx)
	switch {
	case r == roleNone:
		s.denied.record(ctx, method, DenyUnauthenticated)
		if name, ok := s.auth.revoked(ctx); ok {
			return nil, revokedStatus(name)
		}
		return nil, status.Error(codes.Unauthenticated, "missing or invalid bearer token; send authorization: Bearer <agent or admin token>")
	case r == roleAgent && strings.HasPrefix(method, adminPrefix):
		s.denied.record(ctx, method, DenyPermission)
		return nil, status.Errorf(codes.PermissionDenied, "%s requires the admin token; the agent token may call AdmissionService, AgentService, CredentialService, health and reflection", method)
	}
	return scope, nil
}

// tapAuthorize is the server's grpc.InTapHandle: it checks the bearer
// token from the request headers before the stream is created, so a
// caller without a valid token is refused before its message is read
// (authentication before allocation). The interceptors check again.
func (s *Server) tapAuthorize(ctx context.Context, info *tap.Info) (context.Context, error) {
	if err := s.authorize(ctx, info.FullMethodName); err != nil {
		return ctx, err
	}
	return ctx, nil
}

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := s.checkSize(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	scope, err := s.authorizeScoped(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return handler(withScope(ctx, scope), req)
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	scope, err := s.authorizeScoped(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	ss = sizedStream{ServerStream: ss, s: s, method: info.FullMethod}
	if scope != nil {
		ss = scopedStream{ServerStream: ss, ctx: withScope(ss.Context(), scope)}
	}
	return handler(srv, ss)
}
