package controlplane

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// CapabilityVersion is the highest protocol version this control plane
// implements. The numbers and their history are
// controlplanev1.CapabilityVersion (proto/clodex/controlplane/v1/agent.proto).
const CapabilityVersion = int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE)

// CapabilityHeader is the response header of the agent stream that names
// CapabilityVersion, so a data plane sends only the messages this control
// plane reads (a usage report ends an older one's stream).
const CapabilityHeader = "clodex-capability-version"

const (
	// maxAgentIDLen bounds agent ids.
	maxAgentIDLen = 128
	// maxAgentAccounts bounds the accounts one agent may register.
	maxAgentAccounts = 1000
	// maxAgentField bounds host and version.
	maxAgentField = 256
)

// validAgentString checks a free-form display field.
func validAgentString(field, v string) error {
	if len(v) > maxAgentField {
		return invalidf("%s is %d bytes; allowed 0..%d", field, len(v), maxAgentField)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return invalidf("%s has a byte 0x%02x at %d; allowed printable ASCII", field, c, i)
		}
	}
	return nil
}

// validAccounts checks and sorts an agent's account keys.
func validAccounts(keys []string) ([]string, error) {
	if len(keys) > maxAgentAccounts {
		return nil, invalidf("accounts lists %d keys; allowed at most %d", len(keys), maxAgentAccounts)
	}
	for i, k := range keys {
		if !account.IsKey(k) {
			return nil, invalidf("accounts[%d] %q is not an account key; want acct_ followed by 16 lowercase hex digits", i, k)
		}
	}
	out := slices.Clone(keys)
	slices.Sort(out)
	return slices.Compact(out), nil
}

// validHello checks a hello and returns its sorted accounts.
func validHello(h *controlplanev1.AgentHello) ([]string, error) {
	id := h.GetAgentId()
	switch {
	case id == "":
		return nil, invalidf("hello: agent_id is empty; want 1..%d printable ASCII bytes without spaces (host-pid-random)", maxAgentIDLen)
	case len(id) > maxAgentIDLen:
		return nil, invalidf("hello: agent_id is %d bytes; allowed 1..%d", len(id), maxAgentIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return nil, invalidf("hello: agent_id has a byte 0x%02x at %d; allowed printable ASCII without spaces", c, i)
		}
	}
	if err := errors.Join(validAgentString("hello: host", h.GetHost()), validAgentString("hello: version", h.GetVersion())); err != nil {
		return nil, invalidf("%v", err)
	}
	if cv := h.GetCapabilityVersion(); cv < 1 {
		return nil, invalidf("hello: capability_version %d is invalid; allowed 1..%d (this control plane implements %d)", cv, CapabilityVersion, CapabilityVersion)
	}
	accts, err := validAccounts(h.GetAccounts())
	if err != nil {
		return nil, invalidf("hello: %v", err)
	}
	return accts, nil
}

type agentService struct {
	controlplanev1.UnimplementedAgentServiceServer
	s *Server
}

type agentStream = grpc.BidiStreamingServer[controlplanev1.ConnectRequest, controlplanev1.ConnectResponse]

// Connect registers the agent from its hello, then pushes its accounts'
// policies whenever they (or their live counts) change, until the agent
// says goodbye, its stream fails, its heartbeats stop or the server shuts
// down (AgentClose with the reason, then Unavailable).
func (a *agentService) Connect(stream agentStream) error {
	s := a.s
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return s.toStatus(ctx, "Connect", invalidf("the first message must be a hello; got %T", first.GetMsg()))
	}
	accts, err := validHello(hello)
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	if err := s.checkScopes(ctx, "Connect", accts); err != nil {
		return err
	}
	cred := s.auth.credential(ctx)
	if err := s.accounts.register(cred, accts, s.now()); err != nil {
		s.denied.record(ctx, controlplanev1.AgentService_Connect_FullMethodName, DenyAccountCap)
		return status.Error(codes.ResourceExhausted, "hello: "+err.Error())
	}
	// A newer agent is served as the newest version this server knows.
	capability := min(int(hello.GetCapabilityVersion()), CapabilityVersion)
	now := s.now()
	c := &agentConn{
		id: hello.GetAgentId(), host: hello.GetHost(), version: hello.GetVersion(), credential: cred, scope: scopeFrom(ctx),
		stream: rand.Text(), capability: capability, connected: now, wake: make(chan struct{}, 1),
		accounts: accts, lastSeen: now, dirty: map[string]bool{},
		takesMembers: s.takesMembers(capability), members: s.takesMembers(capability),
	}
	if reason := s.agents.join(ctx, c); reason != "" {
		_ = stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Close{Close: &controlplanev1.AgentClose{Reason: reason}}})
		s.agents.leave(ctx, c)
		return status.Error(codes.Unavailable, reason)
	}
	defer s.agents.leave(ctx, c)
	// A credential revoked between this call's authorization and its
	// joining: the revocation that closed the others did not see it.
	s.revokeStale(ctx)
	// The headers tell the agent its hello was accepted, before any push
	// (an agent serving no account yet gets none), so a data plane knows
	// its token is good as soon as it is.
	if err := stream.SendHeader(metadata.Pairs(CapabilityHeader, strconv.Itoa(CapabilityVersion))); err != nil {
		return err
	}
	s.log.InfoContext(ctx, "agent connected", "agent_id", c.id, "host", c.host, "version", c.version,
		"capability_version", capability, "accounts", len(accts))

	recvDone := make(chan error, 1) // buffered: recvLoop never blocks on exit
	s.streams.Add(1)
	go a.recvLoop(ctx, stream, c, recvDone)

	for {
		select {
		case err := <-recvDone:
			if err == nil {
				s.log.InfoContext(ctx, "agent said goodbye", "agent_id", c.id)
				_ = a.sendAcks(stream, c) // best effort: the usage it sent before the goodbye is stored; the stream ends either way
			}
			return err
		case <-c.wake:
			if err := a.flush(ctx, stream, c); err != nil {
				return err
			}
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
	}
}

// flush sends c's pending pushes (the member list first: a data plane
// serving member keys waits for it), or its close.
func (a *agentService) flush(ctx context.Context, stream agentStream, c *agentConn) error {
	s := a.s
	keys, live, closed, end := s.agents.take(ctx, c)
	if closed != "" {
		_ = stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Close{Close: &controlplanev1.AgentClose{Reason: closed}}})
		s.log.InfoContext(ctx, "closing agent stream", "agent_id", c.id, "reason", closed)
		return end
	}
	if s.agents.takeMembers(c) {
		if push := s.members.current(); push != nil {
			if err := stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Members{Members: push}}); err != nil {
				return err
			}
		}
	}
	for i, k := range keys {
		push, err := s.policyPush(ctx, k, live[i])
		if err != nil {
			return s.toStatus(ctx, "Connect", err)
		}
		if err := stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Policy{Policy: push}}); err != nil {
			return err
		}
	}
	if c.capability < int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE) {
		return nil
	}
	if err := a.sendAcks(stream, c); err != nil {
		return err
	}
	return s.pushQuotas(stream, c)
}

// sendAcks sends c's queued usage acks.
func (a *agentService) sendAcks(stream agentStream, c *agentConn) error {
	for _, ack := range a.s.agents.takeAcks(c) {
		if err := stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_UsageAck{UsageAck: ack}}); err != nil {
			return err
		}
	}
	return nil
}

// policyPush builds key's push: its stored account, or the default policy
// for an account the store does not know yet.
func (s *Server) policyPush(ctx context.Context, key string, live int) (*controlplanev1.PolicyPush, error) {
	acct, err := s.opts.Policies.Account(ctx, key, s.now())
	if errors.Is(err, store.ErrNotFound) {
		d := s.opts.Policies.Defaults()
		acct, err = store.Account{Key: key, Policy: d, EffectiveRate: d.RatePerMinute}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("policy push: %w", err)
	}
	p := acct.Policy
	return &controlplanev1.PolicyPush{
		Account:                key,
		RatePerMinute:          int32(p.RatePerMinute),
		EffectiveRatePerMinute: int32(acct.EffectiveRate),
		Burst:                  int32(p.Burst),
		IdleTimeoutMs:          p.Budget.IdleTimeout.Milliseconds(),
		TotalTimeoutMs:         p.Budget.TotalTimeout.Milliseconds(),
		MaxRetries:             int32(p.Budget.MaxRetries),
		WaitBoundMs:            p.Budget.WaitBound.Milliseconds(),
		PolicyVersion:          acct.PolicyVersion,
		LiveAgents:             int32(live),
		Adaptive:               acct.Adaptive,
		PausedUntilUnixMs:      unixMs(acct.PausedUntil),
	}, nil
}

// recvLoop handles the agent's messages until the stream ends; it sends
// nil on done after a goodbye, else the error. Its owner is the server
// (s.streams): it exits when Connect returns, which ends the stream.
func (a *agentService) recvLoop(ctx context.Context, stream agentStream, c *agentConn, done chan<- error) {
	s := a.s
	defer s.streams.Done()
	for {
		msg, err := stream.Recv()
		if err != nil {
			done <- err
			return
		}
		switch m := msg.GetMsg().(type) {
		case *controlplanev1.ConnectRequest_Heartbeat:
			accts, err := validAccounts(m.Heartbeat.GetAccounts())
			if err != nil {
				done <- s.toStatus(ctx, "Connect", invalidf("heartbeat: %v", err))
				return
			}
			if err := s.checkScopes(ctx, "Connect", accts); err != nil {
				done <- err
				return
			}
			now := s.now()
			if err := s.accounts.register(c.credential, accts, now); err != nil {
				s.denied.record(ctx, controlplanev1.AgentService_Connect_FullMethodName, DenyAccountCap)
				done <- status.Error(codes.ResourceExhausted, "heartbeat: "+err.Error())
				return
			}
			s.agents.beat(ctx, c, accts, now)
		case *controlplanev1.ConnectRequest_Upstream_403:
			if err := s.upstream403(ctx, c, m.Upstream_403); err != nil {
				done <- err
				return
			}
		case *controlplanev1.ConnectRequest_RateLimits:
			if err := s.rateLimits(ctx, c, m.RateLimits); err != nil {
				done <- err
				return
			}
		case *controlplanev1.ConnectRequest_Usage:
			s.usageReport(ctx, c, m.Usage)
		case *controlplanev1.ConnectRequest_Goodbye:
			done <- nil
			return
		case *controlplanev1.ConnectRequest_Hello:
			done <- s.toStatus(ctx, "Connect", invalidf("a second hello on one stream; send heartbeats to change the accounts"))
			return
		default:
			done <- s.toStatus(ctx, "Connect", invalidf("unknown agent message %T; this control plane implements capability version %d", msg.GetMsg(), CapabilityVersion))
			return
		}
	}
}
