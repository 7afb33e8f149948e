package controlplane

import (
	"context"
	"time"
)

// fleetLoop applies adaptive raises and expires silent agents every
// Options.FleetTick, and reloads the scoped agent credentials and the
// members at once when another replica changed them, until ctx ends, then closes stopped. Its
// owner is Serve.
func (s *Server) fleetLoop(ctx context.Context, stopped chan<- struct{}) {
	defer close(stopped)
	t := time.NewTicker(s.opts.FleetTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.fleetTick(ctx)
		case <-s.credsDirty:
			s.reloadCreds(ctx)
		}
	}
}

// fleetTick runs one round of fleetLoop.
func (s *Server) fleetTick(ctx context.Context) {
	now := s.now()
	s.denied.flush(ctx)
	s.reloadCreds(ctx)
	s.agents.reap(now)
	// Open streams keep their accounts registered; the rest lapse.
	s.agents.eachOpen(func(c *agentConn, accounts []string) { _ = s.accounts.register(c.credential, accounts, now) })
	s.accounts.sweep(now)
	s.agents.recount(ctx, now)
	s.refreshQuotas(ctx, now)
	s.reportStoreHealth()
	changed, err := s.opts.Policies.Adapt(ctx, now)
	if err != nil {
		s.log.ErrorContext(ctx, "adaptive rates", "err", err)
		return
	}
	for _, a := range changed {
		s.log.InfoContext(ctx, "adaptive rate raised", "account", a.Key, "effective_rate_per_minute", a.EffectiveRate,
			"rate_per_minute", a.Policy.RatePerMinute)
		s.agents.push(a.Key)
	}
}

// reloadCreds reloads the scoped agent credentials (reloadScopes) and the
// members (reloadMembers), each bounded by scopeReloadTimeout; a failure
// keeps the ones loaded before.
func (s *Server) reloadCreds(ctx context.Context) {
	if s.opts.AgentCreds != nil {
		rctx, cancel := context.WithTimeout(ctx, scopeReloadTimeout)
		if err := s.reloadScopes(rctx); err != nil {
			s.log.DebugContext(ctx, "reload agent credentials", "err", err)
		}
		cancel()
	}
	if s.opts.Members != nil {
		rctx, cancel := context.WithTimeout(ctx, scopeReloadTimeout)
		if err := s.reloadMembers(rctx); err != nil {
			s.log.DebugContext(ctx, "reload members", "err", err)
		}
		cancel()
	}
}
