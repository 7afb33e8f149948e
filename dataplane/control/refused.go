package control

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// A data plane whose agent credential the control plane refuses (an
// operator revoked it with clodexctl agent remove, or the token is not
// one the control plane knows) must not serve: it answers every turn
// with Refused's error, which the failure table (dataplane/retry) turns
// into a 403 with x-should-retry: false, instead of admitting locally or
// running turns on the tokens and sockets it holds. Any call answered
// Unauthenticated puts the client in that state; only the control plane
// accepting the agent stream again takes it out (the stream keeps asking,
// every refusedBackoff). Accepted tells a starting data plane whether its
// token is good, and apart from a control plane it cannot reach.

// AgentRefusedError is the control plane refusing this data plane's agent
// credential.
type AgentRefusedError struct {
	// Target is the control plane, as configured.
	Target string
	// Revoked reports that an operator removed the credential; Credential
	// is its name.
	Revoked    bool
	Credential string
	// Detail is the control plane's message.
	Detail string
}

// Error says who refused what; it never contains the token.
func (e *AgentRefusedError) Error() string {
	return fmt.Sprintf("the control plane at %s refused this data plane's agent token (Unauthenticated: %s)", e.Target, e.Detail)
}

// AgentRefused returns what a client of the data plane is told: the
// cause and the fix.
func (e *AgentRefusedError) AgentRefused() string {
	if e.Revoked {
		return fmt.Sprintf("This data plane's agent credential %q was revoked on the control plane at %s (clodexctl agent remove), so it serves no turns; "+
			"an operator must create a new one (clodexctl agent create NAME --accounts ... --out FILE) and restart the data plane with --agent-token-file FILE",
			e.Credential, e.Target)
	}
	return fmt.Sprintf("The control plane at %s does not accept this data plane's agent token, so it serves no turns; "+
		"an operator must restart the data plane with a token the control plane accepts (--agent-token-file: the fleet's agent token, or one from clodexctl agent create)",
		e.Target)
}

// refusedBackoff is how often the agent stream asks again while the
// control plane refuses the credential.
const refusedBackoff = 5 * time.Second

// confirmRefusal is when the first agent stream asks again after the
// control plane refused a token it does not know (not one an operator
// revoked): longer than a control plane's fleet tick (1 s), within which
// every replica has read a credential created on another.
const confirmRefusal = 1500 * time.Millisecond

// refusal returns the *AgentRefusedError err stands for: an
// Unauthenticated answer of the control plane. ok is false for any other
// error.
func (c *Client) refusal(err error) (*AgentRefusedError, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unauthenticated {
		return nil, false
	}
	e := &AgentRefusedError{Target: c.target, Detail: st.Message()}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if ok && info.GetDomain() == string(controlplanev1.File_clodex_controlplane_v1_agent_proto.Package()) &&
			info.GetReason() == controlplanev1.AgentRefusal_AGENT_REFUSAL_REVOKED.String() {
			e.Revoked, e.Credential = true, info.GetMetadata()["credential"]
		}
	}
	return e, true
}

// refuse records that the control plane answered err; when err refuses
// the agent credential it returns the refusal in force and true. The
// first refusal is logged and announced, and the broker's tokens are
// dropped: none serves a turn until the control plane accepts the
// credential again. A revocation the control plane named is kept over a
// later, plainer refusal.
func (c *Client) refuse(ctx context.Context, err error) (*AgentRefusedError, bool) {
	e, ok := c.refusal(err)
	if !ok {
		return nil, false
	}
	for {
		prev := c.refused.Load()
		if prev != nil && (prev.Revoked || !e.Revoked) {
			return prev, true
		}
		if c.refused.CompareAndSwap(prev, e) {
			if prev != nil {
				return e, true
			}
			break
		}
	}
	c.tokensMu.Lock()
	clear(c.tokens)
	c.tokensMu.Unlock()
	c.log.LogAttrs(ctx, slog.LevelError, "the control plane refuses this data plane's agent credential; every turn is answered 403 until it accepts one",
		slog.String("target", c.target), slog.Bool("revoked", e.Revoked), slog.String("credential", e.Credential), slog.String("err", e.Detail))
	c.notify(e.AgentRefused())
	return e, true
}

// accept records that the control plane accepted the agent stream: a
// refused client serves again.
func (c *Client) accept(ctx context.Context) {
	c.settle(nil)
	if c.refused.Swap(nil) != nil {
		c.log.InfoContext(ctx, "the control plane accepts this data plane's agent credential again; serving turns", "target", c.target)
		c.notify("the control plane accepts this data plane's agent credential again: serving turns")
	}
}

// Refused returns the control plane's refusal of this data plane's agent
// credential (an *AgentRefusedError), or nil while it is not refused.
// The accounts router asks it before every turn.
func (c *Client) Refused() error {
	if e := c.refused.Load(); e != nil {
		return e
	}
	return nil
}

// settle records the outcome of the first agent stream (Accepted's
// answer); later outcomes are ignored.
func (c *Client) settle(err error) {
	c.firstOnce.Do(func() {
		c.firstErr = err
		close(c.first)
	})
}

// Ready reports whether this data plane can serve a turn now: nil, or
// why not: the control plane refuses its agent credential, or (with
// Config.Broker) it holds no access token from the broker yet.
func (c *Client) Ready() error {
	if err := c.Refused(); err != nil {
		return err
	}
	if !c.broker {
		return nil
	}
	c.tokensMu.Lock()
	defer c.tokensMu.Unlock()
	for _, e := range c.tokens {
		if e.dead == nil && e.cred.AccessToken != "" {
			return nil
		}
	}
	return fmt.Errorf("no ChatGPT access token from the credential broker of the control plane at %s yet", c.target)
}

// settled reports whether Accepted has its answer.
func (c *Client) settled() bool {
	select {
	case <-c.first:
		return true
	default:
		return false
	}
}

// Accepted waits for the control plane's first answer to the agent
// stream, or for ctx to end: nil when it accepted the agent token, an
// *AgentRefusedError when it refused it, and otherwise the error that
// says it could not be reached (ctx's error when it did not answer in
// time). Run must be running.
func (c *Client) Accepted(ctx context.Context) error {
	select {
	case <-c.first:
		return c.firstErr
	case <-ctx.Done():
		return fmt.Errorf("the control plane at %s did not answer: %w", c.target, ctx.Err())
	}
}
