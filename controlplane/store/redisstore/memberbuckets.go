package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// A member's cap in Redis: one hash per member name holding its bucket
// (member_admit.lua, the bucket math of the accounts' scripts), with a
// time to live like an account's. It is one more round trip before the
// account's Admit, only for members with a cap. While Redis cannot be
// reached the replica decides from a local bucket holding its share of
// the cap (rate and burst divided by the live replicas), as for accounts.

var (
	scriptMemberAdmit  = mustScript("member_admit")
	scriptMemberRefund = mustScript("member_refund")
)

// memberBucketKey is the hash of member's bucket.
func (r *Store) memberBucketKey(member string) string { return r.prefix + "mb:" + member }

// AdmitMember runs member's bucket once at now under p
// (store.MemberPolicy); a new bucket starts full. It never fails for
// Redis: while Redis cannot be reached, or holds a bucket state that does
// not decode (started over), the decision comes from this replica's
// share.
func (r *Store) AdmitMember(ctx context.Context, member string, p pacing.Policy, now time.Time) (pacing.Decision, error) {
	args := []any{p.RatePerMinute, p.Burst, p.Budget.WaitBound.Milliseconds(), p.Budget.MaxRetries, micros(now), r.idleMs}
	v, err := r.run(ctx, "member_admit", scriptMemberAdmit, []string{r.memberBucketKey(member)}, args...)
	if err != nil && answered(err) {
		r.noteBad(&store.BadRecordError{Kind: "member state", Name: member, Where: "redis hash " + r.memberBucketKey(member), Err: scriptCause(err)})
		if derr := r.call(ctx, "member_admit", func(ctx context.Context) error { return r.client.Del(ctx, r.memberBucketKey(member)).Err() }); derr == nil {
			r.noteGood("member state", member)
			v, err = r.run(ctx, "member_admit", scriptMemberAdmit, []string{r.memberBucketKey(member)}, args...)
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return pacing.Decision{}, ctx.Err()
		}
		r.metrics.fallback.Inc()
		return r.memberLocal.admit(member, p, int(r.replicas.Load()), now).Decision, nil
	}
	n, err := ints(v)
	if err != nil || len(n) != 7 {
		return pacing.Decision{}, fmt.Errorf("member admit: malformed script reply %v", v)
	}
	return pacing.Decision{
		Kind:         pacing.Kind(n[0]),
		Wait:         time.Duration(n[1]) * time.Millisecond,
		RetryAfter:   time.Duration(n[2]) * time.Second,
		RequiredWait: time.Duration(n[3]) * time.Millisecond,
		Debited:      n[4] == 1,
		Relaxed:      n[5] == 1,
		ID:           uint64(n[6]),
	}, nil
}

// RefundMember gives back the token of a member's debited decision (the
// account refused the admission it was taken for). A decision of the
// local share keeps its token: the share refills by itself.
func (r *Store) RefundMember(ctx context.Context, member string, id uint64, now time.Time) error {
	if id == 0 || isLocalReservation(id) {
		return nil
	}
	err := r.call(ctx, "member_refund", func(ctx context.Context) error {
		return scriptMemberRefund.Run(ctx, r.client, []string{r.memberBucketKey(member)}, micros(now)).Err()
	})
	if err != nil && !errors.Is(err, errDegraded) && ctx.Err() == nil {
		return fmt.Errorf("refund member %s: %w", member, err)
	}
	return nil
}
