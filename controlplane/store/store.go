package store

import (
	"context"
	"errors"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Store is the state a control plane serves from: Memory for one process,
// Redis for replicas sharing one Redis. Both decide with the same rules
// (internal/pacing's bucket, adaptive mode, pending reservations); the
// conformance suite runs against both.
type Store interface {
	// Admit runs key's bucket once at now, creating it with the default
	// policy on first use.
	Admit(ctx context.Context, key string, now time.Time) (Admission, error)
	// Cancel refunds reservation id of key if it is still pending at now,
	// and reports whether it did. Each reservation is refunded at most
	// once.
	Cancel(ctx context.Context, key string, id uint64, now time.Time) (bool, error)
	// HandOver debits grants a data plane (or a replica) made on its own
	// while it could not reach this store; see HandOverResult.
	HandOver(ctx context.Context, key string, grants int, reportID string, now time.Time) (HandOverResult, error)
	// UpdatePolicy changes key's policy (see Memory.UpdatePolicy).
	UpdatePolicy(ctx context.Context, key string, now time.Time, update func(pacing.Policy) (pacing.Policy, error)) (Account, error)
	// SetAdaptive turns adaptive mode on or off for key.
	SetAdaptive(ctx context.Context, key string, enabled bool, now time.Time) (Account, error)
	// Report403 records an upstream 403 for key; ErrNotFound for an
	// unknown key.
	Report403(ctx context.Context, key string, now time.Time, retryAfter time.Duration) (acct Account, changed bool, err error)
	// Adapt applies the adaptive raises due by now and returns the
	// accounts whose effective rate changed.
	Adapt(ctx context.Context, now time.Time) ([]Account, error)
	// Account returns key's snapshot at now, or ErrNotFound.
	Account(ctx context.Context, key string, now time.Time) (Account, error)
	// Accounts returns every known account at now, ordered by key.
	Accounts(ctx context.Context, now time.Time) ([]Account, error)
	// Defaults returns the policy for accounts without a stored policy.
	Defaults() pacing.Policy
	// Info describes the store for operators.
	Info() Info
	// Run does the store's background work until ctx ends.
	Run(ctx context.Context) error
	// TouchAgent records that an agent stream serves keys and counts as
	// live until until, for every replica sharing the store.
	TouchAgent(ctx context.Context, s AgentStream, keys []string, until time.Time) error
	// DropAgent forgets an agent stream for keys (not a newer stream of
	// the same agent).
	DropAgent(ctx context.Context, s AgentStream, keys []string) error
	// LiveAgents counts, per key, the agents live at now across every
	// replica sharing the store.
	LiveAgents(ctx context.Context, keys []string, now time.Time) ([]int, error)
}

var (
	_ Store = (*Memory)(nil)
	_ Store = (*Redis)(nil)
)

// ErrUnavailable reports a policy change (or another write that must not
// be answered locally) while the shared store cannot be reached.
var ErrUnavailable = errors.New("store unavailable")

// HandOverIdempotency is how long a hand-over report id is remembered: a
// report retried within it with the same id is applied once.
const HandOverIdempotency = 10 * time.Minute

// MaxHandOverGrants bounds the grants of one hand-over report per account.
const MaxHandOverGrants = 100000

// HandOverResult is the outcome of one HandOver.
//
// A hand-over debits the reported grants as if each had been admitted by
// the store at the moment of the report, and stops at the first one the
// bucket would not have debited (a refusal, or an admission past the
// ceiling): the account's bucket ends where central admission would have
// left it, never below its debt floor, so it refuses or queues new
// requests until the rate has paid for the sockets opened elsewhere.
type HandOverResult struct {
	// Debited is how many of the grants were debited (0..grants).
	Debited int
	// Duplicate reports a report id already applied for this account;
	// nothing was debited again.
	Duplicate bool
	// Account is the account after the hand-over (zero for a duplicate).
	Account Account
}

// Info describes a store for operators (clodexctl get and accounts, the
// health service, metrics).
type Info struct {
	// Kind is "memory" or "redis".
	Kind string
	// Address is where the state lives: the policy file, or the Redis
	// address without credentials.
	Address string
	// Replica is this control plane's replica id (Redis only).
	Replica string
	// Replicas is the number of live replicas sharing the store (1 for
	// memory; for Redis the last count Redis reported).
	Replicas int
	// Degraded is true while the store cannot be reached and this
	// replica admits from its share of each policy.
	Degraded bool
}
