package redisstore

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

// drawRawPolicy draws a policy over the whole valid space without the
// budget rules (the bound and retries are independent), weighted toward
// the corners, as internal/pacing's properties do.
func drawRawPolicy(t *rapid.T, label string) pacing.Policy {
	rate := rapid.OneOf(rapid.SampledFrom([]int{0, 1, 2, 3, 29, 30, 31, 60, 600}), rapid.IntRange(1, 600)).Draw(t, label+"rate")
	burst := rapid.OneOf(rapid.IntRange(1, 12), rapid.IntRange(1, 1000)).Draw(t, label+"burst")
	boundMs := rapid.OneOf(rapid.SampledFrom([]int64{0, 666, 1333, 2000, 3000, 4833, 15000}), rapid.Int64Range(0, 15000)).Draw(t, label+"boundMs")
	retries := rapid.IntRange(0, 10).Draw(t, label+"retries")
	return pacing.Policy{RatePerMinute: rate, Burst: burst, Budget: pacing.Budget{
		IdleTimeout: pacing.DefaultIdleTimeout, TotalTimeout: pacing.DefaultTotalTimeout, MaxRetries: retries, WaitBound: time.Duration(boundMs) * time.Millisecond,
	}}
}

// drawStoredPolicy draws a policy an operator can store: the budget
// resolved by the budget rules.
func drawStoredPolicy(t *rapid.T, label string) pacing.Policy {
	rate := rapid.OneOf(rapid.SampledFrom([]int{0, 1, 2, 3, 30, 60, 600}), rapid.IntRange(0, 600)).Draw(t, label+"rate")
	burst := rapid.OneOf(rapid.IntRange(1, 12), rapid.IntRange(1, 1000)).Draw(t, label+"burst")
	idleMs := rapid.OneOf(rapid.SampledFrom([]int64{10000, 14001, 30000, 120000}), rapid.Int64Range(10000, 3600000)).Draw(t, label+"idleMs")
	retries := rapid.IntRange(0, 10).Draw(t, label+"retries")
	idle := time.Duration(idleMs) * time.Millisecond
	total := max(idle, pacing.DefaultTotalTimeout) // a total below the idle timeout would lower it
	b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: &idle, TotalTimeout: &total, MaxRetries: &retries})
	return pacing.Policy{RatePerMinute: rate, Burst: burst, Budget: b}
}

// drawStepMicros draws a clock step in whole microseconds: often none,
// often short, sometimes long.
func drawStepMicros(t *rapid.T) time.Duration {
	us := rapid.OneOf(
		rapid.Just(int64(0)),
		rapid.Just(int64(0)),
		rapid.Int64Range(0, 3_000_000),
		rapid.Int64Range(0, 90_000_000),
	).Draw(t, "step")
	return time.Duration(us) * time.Microsecond
}

// TestPropertyRedisMatchesBucket drives the Redis store's scripts and
// internal/pacing's Bucket with the same random operations at the same
// instants: every decision (kind, waits, hint, deficit, debit, relaxed,
// reservation id) and every token count must agree exactly. Pending
// reservations are tracked here from the decisions (a reservation is
// cancellable until arrival + wait), and a cancellation the model allows
// is a RefundReservation on the bucket.
func TestPropertyRedisMatchesBucket(t *testing.T) {
	srv := redistest.Start(t)
	rapid.Check(t, func(rt *rapid.T) {
		p := drawRawPolicy(rt, "default.")
		r := openRedisAt(t, srv, nil, &p)
		defer r.Close()
		b := pacing.NewBucket(p, t0)
		created := false
		type res struct {
			depart    time.Time
			cancelled bool
		}
		pending := map[uint64]*res{}
		var ids []uint64
		now := t0
		steps := rapid.IntRange(1, 80).Draw(rt, "steps")
		for i := range steps {
			now = now.Add(drawStepMicros(rt))
			if !created {
				// The store creates the bucket on first use: so does the model.
				b = pacing.NewBucket(p, now)
			}
			switch op := rapid.IntRange(0, 9).Draw(rt, "op"); {
			case op < 7 || !created:
				got, err := r.Admit(t.Context(), key, now)
				if err != nil {
					rt.Fatalf("step %d: Admit: %v", i, err)
				}
				created = true
				want := b.Take(now)
				if got.Decision != want {
					rt.Fatalf("step %d at +%v: Admit = %+v, bucket %+v", i, now.Sub(t0), got.Decision, want)
				}
				wantRes := uint64(0)
				if want.Debited && want.Wait > 0 {
					wantRes = want.ID
					pending[want.ID] = &res{depart: now.Add(want.Wait)}
					ids = append(ids, want.ID)
				}
				if got.Reservation != wantRes {
					rt.Fatalf("step %d: reservation %d, want %d", i, got.Reservation, wantRes)
				}
			case op < 9:
				id := rapid.SampledFrom(append(ids, 0, 99999)).Draw(rt, "id")
				got, err := r.Cancel(t.Context(), key, id, now)
				if err != nil {
					rt.Fatalf("step %d: Cancel: %v", i, err)
				}
				want := false
				if pr := pending[id]; pr != nil && !pr.cancelled && pr.depart.After(now) {
					pr.cancelled = true
					want = b.RefundReservation(now, id)
				}
				if got != want {
					rt.Fatalf("step %d: Cancel(%d) = %v, want %v", i, id, got, want)
				}
			default:
				np := drawStoredPolicy(rt, "update.")
				if _, err := r.UpdatePolicy(t.Context(), key, now, func(pacing.Policy) (pacing.Policy, error) { return np, nil }); err != nil {
					rt.Fatalf("step %d: UpdatePolicy: %v", i, err)
				}
				b.SetPolicy(now, np)
			}
			a, err := r.Account(t.Context(), key, now)
			if err != nil {
				rt.Fatalf("step %d: Account: %v", i, err)
			}
			if want := b.Tokens(now); a.Tokens != want {
				rt.Fatalf("step %d at +%v: tokens %v, bucket %v", i, now.Sub(t0), a.Tokens, want)
			}
		}
	})
}

// TestPropertyRedisMatchesMemory drives both stores through the whole API
// (admissions, cancellations, policy and adaptive changes, 403 reports,
// adaptive raises, hand-overs, reads) over two accounts at the same
// instants: every result must be identical.
func TestPropertyRedisMatchesMemory(t *testing.T) {
	srv := redistest.Start(t)
	keys := []string{"acct_000000000000000a", "acct_000000000000000b"}
	rapid.Check(t, func(rt *rapid.T) {
		var defaults *pacing.Policy
		if rapid.Bool().Draw(rt, "customDefaults") {
			p := drawRawPolicy(rt, "default.")
			defaults = &p
		}
		r := openRedisAt(t, srv, nil, defaults)
		defer r.Close()
		m, err := store.Open(store.Options{Defaults: defaults})
		if err != nil {
			rt.Fatal(err)
		}
		ctx := t.Context()
		var ids []uint64
		now := t0
		report, reportAt := "", t0
		same := func(i int, op string, got, want any, gotErr, wantErr error) {
			if !errors.Is(gotErr, wantErr) && (gotErr == nil || wantErr == nil || gotErr.Error() != wantErr.Error()) {
				rt.Fatalf("step %d %s: redis error %v, memory %v", i, op, gotErr, wantErr)
			}
			if !reflect.DeepEqual(got, want) {
				rt.Fatalf("step %d at +%v %s:\nredis  %+v\nmemory %+v", i, now.Sub(t0), op, got, want)
			}
		}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for i := range steps {
			now = now.Add(drawStepMicros(rt))
			k := rapid.SampledFrom(keys).Draw(rt, "key")
			switch op := rapid.IntRange(0, 19).Draw(rt, "op"); {
			case op < 8:
				got, gerr := r.Admit(ctx, k, now)
				want, werr := m.Admit(ctx, k, now)
				same(i, "Admit", got, want, gerr, werr)
				if got.Reservation != 0 {
					ids = append(ids, got.Reservation)
				}
			case op < 10:
				id := rapid.SampledFrom(append(ids, 0, 99999)).Draw(rt, "id")
				got, gerr := r.Cancel(ctx, k, id, now)
				want, werr := m.Cancel(ctx, k, id, now)
				same(i, fmt.Sprintf("Cancel(%d)", id), got, want, gerr, werr)
			case op < 11:
				np := drawStoredPolicy(rt, "update.")
				upd := func(pacing.Policy) (pacing.Policy, error) { return np, nil }
				got, gerr := r.UpdatePolicy(ctx, k, now, upd)
				want, werr := m.UpdatePolicy(ctx, k, now, upd)
				same(i, "UpdatePolicy", got, want, gerr, werr)
			case op < 12:
				on := rapid.Bool().Draw(rt, "adaptive")
				got, gerr := r.SetAdaptive(ctx, k, on, now)
				want, werr := m.SetAdaptive(ctx, k, on, now)
				same(i, "SetAdaptive", got, want, gerr, werr)
			case op < 14:
				ra := time.Duration(rapid.SampledFrom([]int{0, 0, 1, 30, 90}).Draw(rt, "retryAfter")) * time.Second
				ga, gc, gerr := r.Report403(ctx, k, now, ra)
				wa, wc, werr := m.Report403(ctx, k, now, ra)
				same(i, "Report403", []any{ga, gc}, []any{wa, wc}, gerr, werr)
			case op < 15:
				got, gerr := r.Adapt(ctx, now)
				want, werr := m.Adapt(ctx, now)
				same(i, "Adapt", got, want, gerr, werr)
			case op < 16:
				// A repeated report id is a duplicate for 10 minutes: repeat
				// only recent ones, so the two stores' expiry clocks (Redis's
				// real one, Memory's injected one) cannot disagree.
				if report == "" || now.Sub(reportAt) > 5*time.Minute || rapid.Bool().Draw(rt, "newReport") {
					report, reportAt = fmt.Sprintf("r%d", i), now
				}
				n := rapid.IntRange(0, 30).Draw(rt, "grants")
				got, gerr := r.HandOver(ctx, k, n, report, now)
				want, werr := m.HandOver(ctx, k, n, report, now)
				same(i, "HandOver", got, want, gerr, werr)
			case op < 19:
				got, gerr := r.Account(ctx, k, now)
				want, werr := m.Account(ctx, k, now)
				same(i, "Account", got, want, gerr, werr)
			default:
				got, gerr := r.Accounts(ctx, now)
				want, werr := m.Accounts(ctx, now)
				same(i, "Accounts", got, want, gerr, werr)
			}
		}
	})
}
