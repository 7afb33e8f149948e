package storetest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// Store is what the suite drives: admissions, policies, adaptive mode,
// hand-overs, the live-agent directory, plan quotas and members' caps.
type Store interface {
	Admit(ctx context.Context, key string, now time.Time) (store.Admission, error)
	Cancel(ctx context.Context, key string, id uint64, now time.Time) (bool, error)
	HandOver(ctx context.Context, key string, grants int, reportID string, now time.Time) (store.HandOverResult, error)

	UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (store.Account, error)
	SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (store.Account, error)
	Report403(ctx context.Context, key string, now time.Time, retryAfter time.Duration) (acct store.Account, changed bool, err error)
	Adapt(ctx context.Context, now time.Time) ([]store.Account, error)
	Account(ctx context.Context, key string, now time.Time) (store.Account, error)
	Accounts(ctx context.Context, now time.Time) ([]store.Account, error)

	TouchAgent(ctx context.Context, s store.AgentStream, keys []string, until time.Time) error
	DropAgent(ctx context.Context, s store.AgentStream, keys []string) error
	LiveAgents(ctx context.Context, keys []string, now time.Time) ([]int, error)

	PutQuota(ctx context.Context, q store.Quota) (prev, next store.Quota, err error)
	Quotas(ctx context.Context, key string) ([]store.Quota, error)

	AdmitMember(ctx context.Context, member string, p pacing.Policy, now time.Time) (pacing.Decision, error)
	RefundMember(ctx context.Context, member string, id uint64, now time.Time) error
	PutUsage(ctx context.Context, b store.UsageBatch, now time.Time) (applied bool, err error)
	UsageRows(ctx context.Context, since, until time.Time, fn func(store.UsageRow)) error
}

// Kind opens the stores of one implementation.
type Kind struct {
	// Open returns a fresh, empty store on the clock now (nil: the
	// store's default) with defaults for accounts without a stored
	// policy (nil: pacing.DefaultPolicy()). It closes the store when the
	// test ends.
	Open func(t *testing.T, now func() time.Time, defaults *pacing.Policy) Store
	// Peer returns another handle on s's state on the clock now: another
	// replica sharing s's store, or s itself for a store of one process.
	Peer func(t *testing.T, s Store, now func() time.Time) Store
}

// Run runs the suite against k, one subtest per behaviour.
func Run(t *testing.T, k Kind) {
	tests := []struct {
		name string
		fn   func(t *testing.T, k Kind)
	}{
		{"FifteenAtDefaults", fifteenAtDefaults},
		{"TwentyAtLowRates", twentyAtLowRates},
		{"RefusalThresholds", refusalThresholds},
		{"NoRetriesNeverRefuses", noRetriesNeverRefuses},
		{"Boundaries", boundaries},
		{"SustainedRate", sustainedRate},
		{"RefusalDebitsNothing", refusalDebitsNothing},
		{"DisabledAdmitsEverything", disabledAdmitsEverything},
		{"Cancel", cancel},
		{"Policies", policies},
		{"Adaptive", adaptive},
		{"AdaptiveDefault", adaptiveDefault},
		{"HandOver", handOver},
		{"LiveAgents", liveAgents},
		{"Quotas", quotas},
		{"MemberCap", memberCap},
		{"UsageOnce", usageOnce},
		{"UsageMinutes", usageMinutes},
		{"UsageCap", usageCap},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, k) })
	}
}

// The suite's instants are whole microseconds (a Redis store reads them
// at Redis TIME's resolution); the nanosecond edges of the bucket math
// are covered by internal/pacing's own tests.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const (
	key  = "acct_0123456789abcdef"
	key2 = "acct_fedcba9876543210"
)

// Clock is a settable clock, safe for concurrent use.
type Clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

// NewClock returns a clock reading t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Set sets the clock's reading.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// Describe renders an admission as the suite compares it: "now",
// "now-relaxed", "wait 1000ms", or "refuse 4s deficit 5000ms".
func Describe(a store.Admission) string {
	d := a.Decision
	switch d.Kind {
	case pacing.KindAdmit:
		if d.Relaxed {
			return "now-relaxed"
		}
		return "now"
	case pacing.KindWait:
		return fmt.Sprintf("wait %dms", d.Wait.Milliseconds())
	case pacing.KindRefuse:
		return fmt.Sprintf("refuse %ds deficit %dms", int64(d.RetryAfter/time.Second), d.RequiredWait.Milliseconds())
	}
	return d.Kind.String()
}

func mustAdmit(t *testing.T, s Store, key string, now time.Time) store.Admission {
	t.Helper()
	a, err := s.Admit(t.Context(), key, now)
	if err != nil {
		t.Fatalf("Admit(%s, %v): %v", key, now.Sub(t0), err)
	}
	return a
}

func admitN(t *testing.T, s Store, key string, now time.Time, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = Describe(mustAdmit(t, s, key, now))
	}
	return out
}

func repeatString(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func mustTokens(t *testing.T, s Store, key string, now time.Time) float64 {
	t.Helper()
	a, err := s.Account(t.Context(), key, now)
	if err != nil {
		t.Fatalf("Account(%s): %v", key, err)
	}
	return a.Tokens
}

func setPolicy(t *testing.T, s Store, key string, now time.Time, rate, burst int, idle *time.Duration, retries *int) store.Account {
	t.Helper()
	a, err := s.UpdatePolicy(t.Context(), key, now, func(pacing.Policy) (pacing.Policy, error) {
		b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: idle, MaxRetries: retries})
		return pacing.Policy{RatePerMinute: rate, Burst: burst, Budget: b}, nil
	})
	if err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	return a
}

func msp(n int64) *time.Duration { d := time.Duration(n) * time.Millisecond; return &d }
func intp(n int) *int            { return &n }
