package store

import (
	"errors"
	"fmt"
	"time"
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
	// Epoch identifies the store's data (Redis): written when the store
	// was initialized; a missing or different one means it lost its data.
	Epoch string
	// LostAt is when this replica last found that the store had lost its
	// data (zero: never); Loss says what it found.
	LostAt time.Time
	Loss   string
	// RestoredAt is when the durable state was last put back (after a
	// loss, from a backup at start, or by a restore); Restored says what
	// and from where.
	RestoredAt time.Time
	Restored   string
	// Healing is true from a loss until its restore finished.
	Healing bool
	// Warnings are standing problems an operator should fix (a Redis
	// without persistence, replicas without backups).
	Warnings []string
}

// BadRecordError reports a stored record that does not decode. It affects
// only that record: the store keeps serving every other one, and uses the
// last good copy of this one where it holds one. The server answers it as
// FailedPrecondition, naming the record.
type BadRecordError struct {
	// Kind is what the record holds: "policy", "sign-in", "agent
	// credential", "quota" or "account state".
	Kind string
	// Name is the account key or credential name.
	Name string
	// Where is the record's place in the store (a Redis key and field,
	// or a file).
	Where string
	// Err says why it does not decode; it never holds a token.
	Err error
}

func (e *BadRecordError) Error() string {
	return fmt.Sprintf("the stored %s of %s (%s) is unreadable: %v", e.Kind, e.Name, e.Where, e.Err)
}

func (e *BadRecordError) Unwrap() error { return e.Err }
