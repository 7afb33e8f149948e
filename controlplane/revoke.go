package controlplane

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Revocation: a scoped agent credential an operator removes (clodexctl
// agent remove) stops working on every replica within a second. The
// replica that removes it reloads the credentials at once; the others on
// the store's notice (Options.AgentCredChanges: Redis publishes one with
// every change), and at the latest at their next fleet tick. Each reload
// refuses the token's calls from then on (the authenticator no longer
// knows its digest) and closes the agent streams that connected with it
// (revokeStale): an AgentClose with the reason, then Unauthenticated
// carrying an ErrorInfo whose reason is AGENT_REFUSAL_REVOKED, so the data
// plane tells its users what happened. A credential replaced under the
// same name with other accounts closes its streams too, Unavailable: the
// data plane reconnects at once and its hello is checked against the new
// accounts.

// AgentCredWatcher is implemented by a store shared by several replicas
// (*redisstore.Store): WatchAgentCreds registers fn to be called when
// another replica created, replaced or removed a scoped agent credential,
// or when such a change may have been missed. fn must not block.
type AgentCredWatcher interface {
	WatchAgentCreds(fn func())
}

// credsChanged is called by the store's watcher: the fleet loop reloads
// the credentials at once (fleetLoop).
func (s *Server) credsChanged() {
	select {
	case s.credsDirty <- struct{}{}:
	default:
	}
}

// revokeStale closes the streams of agents whose scoped credential the
// last reload dropped (revoked) or replaced (other accounts).
func (s *Server) revokeStale(ctx context.Context) {
	closed := s.agents.closeWhere(func(c *agentConn) (string, error) {
		if c.scope == nil {
			return "", nil
		}
		switch now := s.scopes.lookup(c.scope.digest); {
		case now == nil:
			return revokedReason(c.scope.name), revokedStatus(c.scope.name)
		case now != c.scope && (now.name != c.scope.name || !slices.Equal(now.accounts, c.scope.accounts)):
			reason := fmt.Sprintf("agent credential %q was replaced; reconnect to be checked against its accounts", now.name)
			return reason, status.Error(codes.Unavailable, reason)
		}
		return "", nil
	})
	for _, a := range closed {
		s.log.InfoContext(ctx, "closing agent stream: its credential changed", "agent_id", a.c.id, "agent_credential", a.c.scope.name, "reason", a.reason)
	}
}

// revokedReason is the close reason of a revoked credential's streams.
func revokedReason(name string) string {
	return fmt.Sprintf("agent credential %q was revoked (clodexctl agent remove)", name)
}

// revokedStatus is the status a revoked credential's stream ends with:
// Unauthenticated with an ErrorInfo naming the refusal.
func revokedStatus(name string) error {
	st := status.New(codes.Unauthenticated, revokedReason(name)+"; an operator must issue this data plane a new agent credential")
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   controlplanev1.AgentRefusal_AGENT_REFUSAL_REVOKED.String(),
		Domain:   string(controlplanev1.File_clodex_controlplane_v1_agent_proto.Package()),
		Metadata: map[string]string{"credential": name},
	})
	if err != nil {
		return st.Err()
	}
	return withInfo.Err()
}
