package pacing

import (
	"fmt"
	"math"
	"time"
)

// Kind is what a Decision tells the caller to do.
type Kind int

const (
	KindAdmit  Kind = iota + 1 // admit now
	KindWait                   // admit after Decision.Wait
	KindRefuse                 // refused; retry after Decision.RetryAfter
)

func (k Kind) String() string {
	switch k {
	case KindAdmit:
		return "admit"
	case KindWait:
		return "wait"
	case KindRefuse:
		return "refuse"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Decision is the outcome of one Take.
type Decision struct {
	Kind         Kind
	Wait         time.Duration // KindWait: delay before dialing, whole milliseconds (rounded up)
	RetryAfter   time.Duration // KindRefuse: whole seconds, >= 1s
	RequiredWait time.Duration // the true deficit (diagnostics), set on wait and refuse; whole ms, rounded up
	Debited      bool          // a token was spent (Refund gives it back)
	Relaxed      bool          // admitted past the ceiling (the one-time "ceiling relaxed" case)
	ID           uint64        // reservation id when Debited, for RefundReservation; 0 otherwise
}

// tokenUnits is one token in the bucket's exact integer representation. A bucket refilling at
// R tokens per minute gains exactly R units per nanosecond, so every quantity below (refill,
// deficits, the floor −bound × refill) is an integer and the vectors come out exactly.
const tokenUnits = int64(time.Minute)

// refundWindow is how many of the most recent reservations RefundReservation remembers.
const refundWindow = 4096

// Bucket is one account's admission bucket. Not safe for concurrent use: callers hold a lock.
//
// Fields of a Policy outside their valid ranges are clamped into them (rate 0..600, burst
// 1..1000, retries 0..10, bound 0..15s); validate explicit values with Policy.Validate first.
type Bucket struct {
	policy    Policy
	enabled   bool
	canRefuse bool
	rate      int64 // units per nanosecond (= tokens per minute)
	capUnits  int64 // burst × tokenUnits
	floor     int64 // −bound × refill, in units (≤ 0)
	boundNs   int64
	hintS     int64

	units    int64     // tokens × tokenUnits; negative is debt
	updated  time.Time // the instant units was last brought up to date
	seq      uint64    // id of the latest debiting reservation
	refunded [refundWindow / 64]uint64
}

// NewBucket returns a bucket for p that starts full (tokens = burst) at now.
func NewBucket(p Policy, now time.Time) *Bucket {
	b := &Bucket{updated: now}
	b.apply(p)
	b.units = b.capUnits
	return b
}

func sanitize(p Policy) Policy {
	p.RatePerMinute = min(max(p.RatePerMinute, 0), MaxRatePerMinute)
	p.Burst = min(max(p.Burst, 1), MaxBurst)
	p.Budget.MaxRetries = min(max(p.Budget.MaxRetries, 0), MaxMaxRetries)
	p.Budget.WaitBound = min(max(p.Budget.WaitBound, 0), MaxWaitBound)
	return p
}

func (b *Bucket) apply(p Policy) {
	p = sanitize(p)
	b.policy = p
	b.enabled = p.Enabled()
	b.canRefuse = p.CanRefuse()
	b.rate = int64(p.RatePerMinute)
	b.capUnits = int64(p.Burst) * tokenUnits
	b.boundNs = int64(p.Budget.WaitBound)
	b.floor = -b.boundNs * b.rate
	b.hintS = int64(p.Budget.Hint() / time.Second)
}

// Policy returns the bucket's policy, with out-of-range fields clamped.
func (b *Bucket) Policy() Policy { return b.policy }

// advance refills the bucket up to now. A clock that steps backwards refills nothing.
func (b *Bucket) advance(now time.Time) {
	if !now.After(b.updated) {
		return
	}
	elapsed := int64(now.Sub(b.updated))
	b.updated = now
	b.units = b.refilled(elapsed)
}

// refilled returns units after elapsed > 0 nanoseconds, capped at capacity, without overflow.
// Callers ensure pacing is enabled, so the rate is positive.
func (b *Bucket) refilled(elapsed int64) int64 {
	gap := b.capUnits - b.units
	if elapsed > gap/b.rate {
		return b.capUnits
	}
	return b.units + elapsed*b.rate
}

// ceilMs rounds a nanosecond count up to whole milliseconds.
func ceilMs(ns int64) time.Duration {
	ms := int64(time.Millisecond)
	return time.Duration((ns+ms-1)/ms) * time.Millisecond
}

// Take decides one request for a new connection at now. With refill r and floor
// F = −bound × r: tokens ≥ 1 admits now; otherwise the wait w = (1 − tokens)/r admits after w
// when w ≤ bound; otherwise the request is refused when the policy can refuse (no debit);
// otherwise it is admitted after exactly the bound when tokens > F, and admitted now past the
// ceiling (Relaxed, no debit) when not. Every admission within the bound debits one token.
func (b *Bucket) Take(now time.Time) Decision {
	if !b.enabled {
		return Decision{Kind: KindAdmit}
	}
	b.advance(now)
	if b.units >= tokenUnits {
		return b.debit(Decision{Kind: KindAdmit})
	}
	need := tokenUnits - b.units // > 0
	w := (need + b.rate - 1) / b.rate
	if need <= -b.floor {
		return b.debit(Decision{Kind: KindWait, Wait: ceilMs(w), RequiredWait: ceilMs(w)})
	}
	if b.canRefuse {
		// The retry-after is min(hint_s, ceil(w/1000)) s, which is always hint_s: here
		// w > bound, and hint_s ≤ bound/1000 when the bound is at least 1s (else hint_s = 1).
		return Decision{Kind: KindRefuse, RetryAfter: time.Duration(b.hintS) * time.Second, RequiredWait: ceilMs(w)}
	}
	if b.units > b.floor {
		return b.debit(Decision{Kind: KindWait, Wait: time.Duration(b.boundNs), RequiredWait: ceilMs(w)})
	}
	return Decision{Kind: KindAdmit, Relaxed: true}
}

func (b *Bucket) debit(d Decision) Decision {
	b.units -= tokenUnits
	b.seq++
	b.refunded[b.seq/64%uint64(len(b.refunded))] &^= 1 << (b.seq % 64)
	d.Debited = true
	d.ID = b.seq
	return d
}

// Refund gives back one debited token at now, capped at capacity. The caller must refund a
// reservation at most once; RefundReservation enforces that by id.
func (b *Bucket) Refund(now time.Time) {
	if !b.enabled {
		return
	}
	b.advance(now)
	b.units = min(b.units+tokenUnits, b.capUnits)
}

// RefundReservation refunds the reservation with the given id (Decision.ID) exactly once and
// reports whether it did. It returns false for id 0, an unknown id, an id already refunded,
// and an id more than 4096 reservations old. The token is capped at capacity; reservations
// queued behind the cancelled one keep their deadlines.
func (b *Bucket) RefundReservation(now time.Time, id uint64) bool {
	if id == 0 || id > b.seq || b.seq-id >= refundWindow {
		return false
	}
	word, bit := id/64%uint64(len(b.refunded)), uint64(1)<<(id%64)
	if b.refunded[word]&bit != 0 {
		return false
	}
	b.refunded[word] |= bit
	b.Refund(now)
	return true
}

// SetPolicy changes the policy at now. Tokens accrued under the old policy are kept (capped at
// the new capacity, debt kept as debt); a bucket whose pacing was off starts full.
func (b *Bucket) SetPolicy(now time.Time, p Policy) {
	was := b.enabled
	if was {
		b.advance(now)
	}
	b.apply(p)
	if !was {
		b.units = b.capUnits
	}
	b.units = min(b.units, b.capUnits)
	if now.After(b.updated) || !was {
		b.updated = now
	}
}

// Tokens returns the tokens available at now; negative is debt. It does not change the bucket.
func (b *Bucket) Tokens(now time.Time) float64 {
	u := b.units
	if b.enabled && now.After(b.updated) {
		u = b.refilled(int64(now.Sub(b.updated)))
	}
	return float64(u) / float64(tokenUnits)
}

// State is a snapshot of a bucket for a store.
type State struct {
	Tokens  float64   // tokens at Updated; negative is debt
	Updated time.Time // the instant Tokens was computed
}

// State returns the bucket's snapshot.
func (b *Bucket) State() State {
	return State{Tokens: float64(b.units) / float64(tokenUnits), Updated: b.updated}
}

// Restore rebuilds a bucket for p from a snapshot. Tokens are clamped to
// [F − 1, burst] (NaN counts as full). Reservation ids start afresh, so reservations taken
// before the snapshot cannot be refunded through RefundReservation.
func Restore(p Policy, s State) *Bucket {
	b := NewBucket(p, s.Updated)
	lo := b.floor - tokenUnits
	t := s.Tokens * float64(tokenUnits)
	if math.IsNaN(t) {
		t = float64(b.capUnits)
	}
	b.units = int64(math.Round(min(max(t, float64(lo)), float64(b.capUnits))))
	return b
}
