package store

import (
	"context"
	"sync"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// A member's cap is one pacing bucket per member name, on every account:
// rate and burst the member's rate, the budget the caller's (the server
// passes the fleet's default budget, so that its refusals and waits fit a
// turn as the account's do). The control plane runs it before the
// account's bucket and refunds it when the account's refuses. Buckets are
// not durable: a restarted store starts them full, as the accounts'.

// MemberPolicy is the policy of a member's bucket: rate new sockets a
// minute, burst rate, and budget.
func MemberPolicy(rate int, budget pacing.Budget) pacing.Policy {
	return pacing.Policy{RatePerMinute: rate, Burst: max(rate, 1), Budget: budget}
}

// memberBuckets holds the memory store's member buckets.
type memberBuckets struct {
	mu      sync.Mutex // guards buckets and every *pacing.Bucket in it
	buckets map[string]*pacing.Bucket
}

// AdmitMember runs member's bucket once at now under p (MemberPolicy): a
// new bucket starts full; a changed policy applies at once, keeping the
// tokens. A debited decision carries the reservation id RefundMember
// takes.
func (m *Memory) AdmitMember(_ context.Context, member string, p pacing.Policy, now time.Time) (pacing.Decision, error) {
	mb := &m.members
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if mb.buckets == nil {
		mb.buckets = map[string]*pacing.Bucket{}
	}
	b := mb.buckets[member]
	switch {
	case b == nil:
		b = pacing.NewBucket(p, now)
		mb.buckets[member] = b
	case b.Policy() != p:
		b.SetPolicy(now, p)
	}
	return b.Take(now), nil
}

// RefundMember gives back the token of member's reservation id (the
// account refused the admission it was taken for). An unknown member or
// reservation refunds nothing.
func (m *Memory) RefundMember(_ context.Context, member string, id uint64, now time.Time) error {
	mb := &m.members
	mb.mu.Lock()
	defer mb.mu.Unlock()
	if b := mb.buckets[member]; b != nil {
		b.RefundReservation(now, id)
	}
	return nil
}

// sweep forgets the member buckets that are full and idle for idle at now:
// a new one would start the same.
func (mb *memberBuckets) sweep(now time.Time, idle time.Duration) {
	mb.mu.Lock()
	defer mb.mu.Unlock()
	for name, b := range mb.buckets {
		if now.Sub(b.State().Updated) >= idle && b.Tokens(now) >= float64(b.Policy().Burst) {
			delete(mb.buckets, name)
		}
	}
}
