package control

import (
	"context"
	"time"

	"google.golang.org/grpc"

	"github.com/clodex/clodex/internal/pacing"
)

// ClientConn returns the client's connection, for tests that wait until
// a restarted control plane is connected again.
func (c *Client) ClientConn() *grpc.ClientConn { return c.conn }

// SetLiveAgents sets accountKey's live-agent count as a policy push would,
// but without holding a higher earlier count for LiveWindow: the admission
// tests set the counts a local share divides by directly.
func (c *Client) SetLiveAgents(accountKey string, n int) {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	c.live[accountKey] = &liveCount{cur: n}
}

// SetPolicy records a policy as a push does.
func (c *Client) SetPolicy(accountKey string, p pacing.Policy) error {
	return c.setPolicy(accountKey, p)
}

// SetPause records a pause as a push does.
func (c *Client) SetPause(accountKey string, until time.Time) { c.setPause(accountKey, until) }

// CentralMaybeBack is what the agent stream's connect does to a local
// client's probe backoff (without the hand-over Run would start).
func (c *Client) CentralMaybeBack() { c.cutBackoff() }

// Recover is the hand-over Run starts when the control plane answers
// while admission is local.
func (c *Client) Recover(ctx context.Context) error { return c.recover(ctx) }
