package controlplane

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// AdaptiveRates is the store's adaptive mode, the learned upgrade
// throttle (docs/pacing.md §9).
type AdaptiveRates interface {
	// Report403 records an upstream 403; changed reports a lowered
	// effective rate. store.ErrNotFound for an unknown key.
	Report403(ctx context.Context, key string, now time.Time, retryAfter time.Duration) (acct store.Account, changed bool, err error)
	// Adapt applies the adaptive raises due by now and returns the
	// accounts whose effective rate changed (the fleet loop).
	Adapt(ctx context.Context, now time.Time) ([]store.Account, error)
}

// QuotaStore keeps the latest plan usage data planes report per account
// and window (codex.rate_limits), for every replica sharing a store
// (Options.Quotas; ListQuotas reads it).
type QuotaStore interface {
	PutQuota(ctx context.Context, q store.Quota) (prev, next store.Quota, err error)
	Quotas(ctx context.Context, key string) ([]store.Quota, error)
}

// QuotaNotice is the share of a window at which the control plane logs,
// once per crossing, that an account is about to reach its limit.
const QuotaNotice = 90.0

// maxQuotaWindows bounds the windows of one RateLimits report.
const maxQuotaWindows = 8

// validRateLimits checks a RateLimits report and converts it.
func validRateLimits(agentID string, r *controlplanev1.RateLimits) (store.Quota, error) {
	key := r.GetAccount()
	if !account.IsKey(key) {
		return store.Quota{}, invalidf("rate_limits: account %q is not an account key; want acct_ followed by 16 lowercase hex digits", key)
	}
	if err := printable("rate_limits.plan_type", r.GetPlanType(), 0, 64); err != nil {
		return store.Quota{}, err
	}
	if n := len(r.GetWindows()); n > maxQuotaWindows {
		return store.Quota{}, invalidf("rate_limits lists %d windows; allowed 0..%d", n, maxQuotaWindows)
	}
	q := store.Quota{Key: key, PlanType: r.GetPlanType(), LimitReached: r.GetLimitReached(), AgentID: agentID,
		ReportedAt: time.UnixMilli(max(r.GetAtUnixMs(), 0)).UTC()}
	for i, w := range r.GetWindows() {
		if err := printable(fmt.Sprintf("rate_limits.windows[%d].name", i), w.GetName(), 1, 32); err != nil {
			return store.Quota{}, err
		}
		if slices.ContainsFunc(q.Windows, func(o store.QuotaWindow) bool { return o.Name == w.GetName() }) {
			return store.Quota{}, invalidf("rate_limits.windows[%d].name %q is listed twice; report each window once", i, w.GetName())
		}
		if u := w.GetUsedPercent(); !(u >= 0 && u <= 1000) {
			return store.Quota{}, invalidf("rate_limits.windows[%d].used_percent %v is out of range; allowed 0..1000", i, u)
		}
		if m := w.GetWindowMinutes(); m < 0 || m > 366*24*60 {
			return store.Quota{}, invalidf("rate_limits.windows[%d].window_minutes %d is out of range; allowed 0..527040", i, m)
		}
		if ms := w.GetResetsAtUnixMs(); ms < 0 {
			return store.Quota{}, invalidf("rate_limits.windows[%d].resets_at_unix_ms %d is negative; want 0 (unknown) or Unix milliseconds", i, ms)
		}
		qw := store.QuotaWindow{Name: w.GetName(), UsedPercent: w.GetUsedPercent(), Window: time.Duration(w.GetWindowMinutes()) * time.Minute}
		if ms := w.GetResetsAtUnixMs(); ms > 0 {
			qw.ResetsAt = time.UnixMilli(ms).UTC()
		}
		q.Windows = append(q.Windows, qw)
	}
	return q, nil
}

// printable checks a field holds lo..hi printable ASCII bytes.
func printable(field, v string, lo, hi int) error {
	if len(v) < lo || len(v) > hi {
		return invalidf("%s is %d bytes; allowed %d..%d printable ASCII bytes", field, len(v), lo, hi)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c > '~' {
			return invalidf("%s has a byte 0x%02x at %d; allowed printable ASCII", field, c, i)
		}
	}
	return nil
}

// rateLimits records an agent's report of an account's plan usage, sets
// the gauges, and logs once when a window passes QuotaNotice percent.
func (s *Server) rateLimits(ctx context.Context, c *agentConn, r *controlplanev1.RateLimits) error {
	q, err := validRateLimits(c.id, r)
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	if s.opts.Quotas == nil {
		return nil
	}
	prev, next, err := s.opts.Quotas.PutQuota(ctx, q)
	if err != nil {
		s.log.WarnContext(ctx, "plan usage report not recorded", "account", q.Key, "agent_id", c.id, "err", err)
		return nil
	}
	s.metrics.quota(q.Key, next.Windows)
	if s.quotaView.observe(next, s.now()) {
		s.agents.wakeServing([]string{q.Key})
	}
	for _, w := range q.Windows {
		if w.UsedPercent < QuotaNotice {
			continue
		}
		i := slices.IndexFunc(prev.Windows, func(o store.QuotaWindow) bool { return o.Name == w.Name })
		if i >= 0 && prev.Windows[i].UsedPercent >= QuotaNotice && sameReset(prev.Windows[i].ResetsAt, w.ResetsAt) {
			continue // already above in this window
		}
		if i >= 0 && prev.Windows[i].ReportedAt.After(q.ReportedAt) {
			continue // an older report
		}
		args := []any{"account", q.Key, "window", w.Name, "used_percent", w.UsedPercent,
			"window_length", w.Window, "plan_type", q.PlanType, "agent_id", c.id}
		if !w.ResetsAt.IsZero() {
			args = append(args, "resets_at", w.ResetsAt.Format(time.RFC3339))
		}
		s.log.WarnContext(ctx, fmt.Sprintf("account passed %.0f%% of its plan's %s usage window", QuotaNotice, w.Name), args...)
	}
	return nil
}

// sameReset reports whether two reset instants are one window's: within a
// minute (a reset computed from reset_after_seconds moves with the clock).
func sameReset(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Minute && d < time.Minute
}

// maxPause bounds the retry-after a 403 report may pause an account for.
const maxPause = time.Hour

// unixMs is t in Unix milliseconds, 0 for the zero time.
func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// upstream403 applies an agent's 403 report to the account's adaptive
// state and pushes a changed effective rate.
func (s *Server) upstream403(ctx context.Context, c *agentConn, r *controlplanev1.Upstream403) error {
	key := r.GetAccount()
	if !account.IsKey(key) {
		return s.toStatus(ctx, "Connect", invalidf("upstream_403: account %q is not an account key; want acct_ followed by 16 lowercase hex digits", key))
	}
	if err := s.checkScope(ctx, "Connect", key); err != nil {
		return err
	}
	n := max(int(r.GetCount()), 1)
	s.metrics.reported403(key, n)
	retryAfter := time.Duration(max(r.GetRetryAfterMs(), 0)) * time.Millisecond
	acct, changed, err := s.opts.Policies.Report403(ctx, key, s.now(), min(retryAfter, maxPause))
	if errors.Is(err, store.ErrNotFound) {
		return nil // no bucket yet, so nothing adaptive to lower
	}
	if err != nil {
		return s.toStatus(ctx, "Connect", err)
	}
	if changed {
		args := []any{"account", key, "agent_id", c.id, "count", n,
			"effective_rate_per_minute", acct.EffectiveRate, "rate_per_minute", acct.Policy.RatePerMinute}
		if !acct.PausedUntil.IsZero() {
			args = append(args, "paused_until", acct.PausedUntil.UTC().Format(time.RFC3339), "retry_after", retryAfter)
		}
		s.log.InfoContext(ctx, "learned the upgrade throttle from an upstream 403: pausing new sockets and lowering the rate", args...)
		s.agents.push(key)
	}
	return nil
}
