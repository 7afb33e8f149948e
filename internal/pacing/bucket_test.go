package pacing

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func policyAt(rate int, idle *time.Duration, retries *int) Policy {
	b, _ := ResolveBudget(BudgetInput{IdleTimeout: idle, MaxRetries: retries})
	return Policy{RatePerMinute: rate, Burst: 10, Budget: b}
}

// describe renders a decision the way the vectors are written.
func describe(d Decision) string {
	switch d.Kind {
	case KindAdmit:
		if d.Relaxed {
			return "now-relaxed"
		}
		return "now"
	case KindWait:
		return fmt.Sprintf("wait %dms", d.Wait.Milliseconds())
	case KindRefuse:
		return fmt.Sprintf("refuse %ds deficit %dms", int64(d.RetryAfter/time.Second), d.RequiredWait.Milliseconds())
	}
	return d.Kind.String()
}

func takeN(b *Bucket, now time.Time, n int) []Decision {
	out := make([]Decision, n)
	for i := range out {
		out[i] = b.Take(now)
	}
	return out
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestVectorFifteenAtDefaults(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	ds := takeN(b, t0, 15)
	var got []string
	for _, d := range ds {
		got = append(got, describe(d))
	}
	want := append(repeat("now", 10), "wait 1000ms", "wait 2000ms", "wait 3000ms", "wait 4000ms", "refuse 4s deficit 5000ms")
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Fatalf("15 simultaneous at defaults:\n got %q\nwant %q", got, want)
	}
	for i, d := range ds[:14] {
		if !d.Debited || d.Relaxed {
			t.Errorf("decision %d = %+v, want Debited and not Relaxed", i+1, d)
		}
	}
	for i, d := range ds[10:14] {
		if d.RequiredWait != d.Wait {
			t.Errorf("decision %d RequiredWait = %v, want %v", i+11, d.RequiredWait, d.Wait)
		}
	}
	last := ds[14]
	if last.Debited || last.Wait != 0 || last.RetryAfter != 4*time.Second || last.RequiredWait != 5000*time.Millisecond {
		t.Errorf("15th = %+v, want refused, no debit, retry after 4s, deficit 5000ms", last)
	}
	if got := b.Tokens(t0); got != -4 {
		t.Errorf("Tokens after 14 debits = %v, want -4", got)
	}
}

func TestVectorTwentyAtLowRates(t *testing.T) {
	for _, tt := range []struct {
		rate         int
		wantRequired time.Duration
	}{{1, 60 * time.Second}, {2, 30 * time.Second}} {
		t.Run(fmt.Sprintf("%d/min", tt.rate), func(t *testing.T) {
			p := policyAt(tt.rate, nil, nil)
			b := NewBucket(p, t0)
			ds := takeN(b, t0, 20)
			var got []string
			for _, d := range ds {
				got = append(got, describe(d))
			}
			want := append(append(repeat("now", 10), "wait 4833ms"), repeat("now-relaxed", 9)...)
			if strings.Join(got, ", ") != strings.Join(want, ", ") {
				t.Fatalf("20 simultaneous at %d/min:\n got %q\nwant %q", tt.rate, got, want)
			}
			if !ds[10].Debited || ds[10].RequiredWait != tt.wantRequired {
				t.Errorf("11th = %+v, want debited with deficit %v", ds[10], tt.wantRequired)
			}
			for i, d := range ds[11:] {
				if d.Debited || d.ID != 0 {
					t.Errorf("relaxed decision %d = %+v, want no debit and no id", i+12, d)
				}
			}
			if got := b.Tokens(t0); got != -1 {
				t.Errorf("Tokens = %v, want -1", got)
			}
		})
	}
}

// TestLowRateFallbackStillShapes kills a mutation that once survived the suite: low-rate pacing must
// not behave like pacing switched off. Sequential arrivals past the burst keep paying the bound.
func TestLowRateFallbackStillShapes(t *testing.T) {
	b := NewBucket(policyAt(1, nil, nil), t0)
	takeN(b, t0, 10)
	waits := 0
	for i := 0; i <= 3; i++ {
		// One arrival a minute: each refills exactly what the previous one consumed.
		d := b.Take(t0.Add(time.Duration(i) * time.Minute))
		if d.Kind == KindWait && d.Wait == ms(4833) && d.Debited {
			waits++
		}
	}
	if waits != 4 {
		t.Errorf("sequential arrivals at 1/min past the burst: %d of 4 waited out the 4833ms bound", waits)
	}
}

func TestRefusalThresholds(t *testing.T) {
	tests := []struct {
		name       string
		rate       int
		idle       *time.Duration
		wantEleven string
	}{
		{"2/min default budget never refuses", 2, nil, "wait 4833ms"},
		{"3/min default budget refuses", 3, nil, "refuse 4s deficit 20000ms"},
		{"29/min at IDLE=10000 never refuses", 29, dur(ms(10000)), "wait 666ms"},
		{"30/min at IDLE=10000 refuses", 30, dur(ms(10000)), "refuse 1s deficit 2000ms"},
		{"60/min at IDLE=10000 refuses", 60, dur(ms(10000)), "refuse 1s deficit 1000ms"},
		{"60/min at IDLE=30000", 60, dur(ms(30000)), "wait 1000ms"},
		{"600/min at IDLE=10000", 600, dur(ms(10000)), "wait 100ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBucket(policyAt(tt.rate, tt.idle, nil), t0)
			ds := takeN(b, t0, 11)
			if got := describe(ds[10]); got != tt.wantEleven {
				t.Errorf("11th of 11 simultaneous = %q, want %q", got, tt.wantEleven)
			}
		})
	}
}

// TestNoRetriesNeverRefuses: with MAX_RETRIES=0 nothing would retry a refusal.
func TestNoRetriesNeverRefuses(t *testing.T) {
	b := NewBucket(policyAt(60, nil, intp(0)), t0)
	ds := takeN(b, t0, 40)
	var got []string
	for _, d := range ds {
		got = append(got, describe(d))
	}
	want := append(repeat("now", 10), "wait 1000ms", "wait 2000ms", "wait 3000ms", "wait 4000ms", "wait 5000ms",
		"wait 6000ms", "wait 7000ms", "wait 8000ms", "wait 9000ms", "wait 10000ms", "wait 11000ms", "wait 12000ms",
		"wait 13000ms", "wait 14000ms", "wait 15000ms")
	want = append(want, repeat("now-relaxed", 15)...)
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("40 simultaneous at 60/min, no retries:\n got %q\nwant %q", got, want)
	}
}

func TestTakeBoundaries(t *testing.T) {
	def := DefaultPolicy()
	tests := []struct {
		name  string
		p     Policy
		setup func(b *Bucket) // runs at t0
		at    time.Duration   // offset of the decided Take
		want  string
	}{
		{"exactly one token admits now", def, func(b *Bucket) { takeN(b, t0, 10) }, time.Second, "now"},
		{"just under one token waits 1ms", def, func(b *Bucket) { takeN(b, t0, 10) }, 999 * time.Millisecond, "wait 1ms"},
		{"sub-millisecond deficit rounds up", def, func(b *Bucket) { takeN(b, t0, 10) }, 999*time.Millisecond + 1, "wait 1ms"},
		{"wait exactly the bound admits", def, func(b *Bucket) { takeN(b, t0, 14) }, 167 * time.Millisecond, "wait 4833ms"},
		{"wait a hair over the bound refuses", def, func(b *Bucket) { takeN(b, t0, 14) }, 167*time.Millisecond - 1, "refuse 4s deficit 4834ms"},
		{"wait half a ms over the bound refuses", def, func(b *Bucket) { takeN(b, t0, 14) }, 166*time.Millisecond + 500*time.Microsecond, "refuse 4s deficit 4834ms"},
		{"hint capped below the deficit", policyAt(60, dur(ms(30000)), nil), func(b *Bucket) { takeN(b, t0, 12) }, 0, "refuse 2s deficit 3000ms"},
		{"retry-after rounds the deficit up", policyAt(60, dur(ms(30000)), nil), func(b *Bucket) { takeN(b, t0, 12) }, 999 * time.Millisecond, "refuse 2s deficit 2001ms"},
		{"retry-after of a 2000ms deficit is 2s", policyAt(60, dur(ms(30000)), nil), func(b *Bucket) { takeN(b, t0, 12) }, 1000*time.Millisecond - 1, "refuse 2s deficit 2001ms"},
		{"sub-second bound asks 1s", policyAt(60, dur(ms(10000)), nil), func(b *Bucket) { takeN(b, t0, 10) }, 0, "refuse 1s deficit 1000ms"},
		{"sub-second bound admits at exactly 666ms", policyAt(60, dur(ms(10000)), nil), func(b *Bucket) { takeN(b, t0, 10) }, 334 * time.Millisecond, "wait 666ms"},
		{"sub-second bound refuses 666.5ms", policyAt(60, dur(ms(10000)), nil), func(b *Bucket) { takeN(b, t0, 10) }, 333*time.Millisecond + 500*time.Microsecond, "refuse 1s deficit 667ms"},
		{"tokens exactly at the floor relax", policyAt(1, nil, nil), func(b *Bucket) { takeN(b, t0, 11) }, 55167 * time.Millisecond, "now-relaxed"},
		{"tokens just above the floor wait the bound", policyAt(1, nil, nil), func(b *Bucket) { takeN(b, t0, 11) }, 55167*time.Millisecond + 1, "wait 4833ms"},
		{"no-refuse within bound waits the deficit", policyAt(1, nil, nil), func(b *Bucket) { takeN(b, t0, 10) }, 60*time.Second - ms(4833), "wait 4833ms"},
		{"no-refuse just past bound waits the bound", policyAt(1, nil, nil), func(b *Bucket) { takeN(b, t0, 10) }, 60*time.Second - ms(4833) - 1, "wait 4833ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := NewBucket(tt.p, t0)
			tt.setup(b)
			before := b.Tokens(t0.Add(tt.at))
			d := b.Take(t0.Add(tt.at))
			if got := describe(d); got != tt.want {
				t.Errorf("Take(t0+%v) = %q (%+v), want %q", tt.at, got, d, tt.want)
			}
			after := b.Tokens(t0.Add(tt.at))
			debited := math.Abs(before-after-1) < 1e-9
			if d.Debited != debited || (!debited && before != after) {
				t.Errorf("tokens %v -> %v with Debited=%v", before, after, d.Debited)
			}
		})
	}
}

// TestNoRefuseWaitDetails checks the deficit reported when the fallback waits the bound.
func TestNoRefuseWaitDetails(t *testing.T) {
	b := NewBucket(policyAt(1, nil, nil), t0)
	takeN(b, t0, 10)
	d := b.Take(t0.Add(60*time.Second - ms(4833) - 1))
	if d.Wait != ms(4833) || d.RequiredWait != ms(4834) || !d.Debited {
		t.Errorf("Take = %+v, want wait 4833ms, deficit 4834ms (rounded up), debited", d)
	}
	d = b.Take(t0.Add(60*time.Second - ms(4833) - 1))
	if !d.Relaxed || d.Debited {
		t.Errorf("next Take = %+v, want relaxed without debit", d)
	}
}

// sustainedRun drives one request every 60/82 s from t = 0 for 240 s through take and counts
// the admissions (immediate or after a wait) whose arrival is in [180 s, 240 s).
func sustainedRun(take func(now time.Time) (admitted bool)) int {
	count := 0
	for k := int64(0); ; k++ {
		at := time.Duration(k * int64(60*time.Second) / 82)
		if at >= 240*time.Second {
			break
		}
		if take(t0.Add(at)) && at >= 180*time.Second {
			count++
		}
	}
	return count
}

// admitAnywayModel is the rejected first design (docs/pacing.md §3): once the bound expires it admits anyway
// and debits, so the debt floor never holds. Test-only; it exists to show the sustained-rate
// test tells the two designs apart.
type admitAnywayModel struct {
	tokens, perMs, capacity, boundMs float64
	last                             time.Time
}

func (m *admitAnywayModel) take(now time.Time) bool {
	m.tokens = math.Min(m.capacity, m.tokens+float64(now.Sub(m.last))/float64(time.Millisecond)*m.perMs)
	m.last = now
	m.tokens-- // admitted now, after the deficit, or after the full bound: always debited
	return true
}

// TestSustainedRate is a four-minute overload (docs/pacing.md §3): 82/min offered against 60/min. The
// last minute must admit 60 ± 1; the rejected admit-anyway design reads 82.
func TestSustainedRate(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	refused := 0
	got := sustainedRun(func(now time.Time) bool {
		d := b.Take(now)
		if d.Kind == KindRefuse {
			refused++
		}
		if d.Relaxed {
			t.Fatalf("Take(%v) relaxed the ceiling at a rate that can refuse", now.Sub(t0))
		}
		return d.Kind != KindRefuse
	})
	t.Logf("final-minute admissions at 82/min offered: %d (refusals over four minutes: %d)", got, refused)
	if got < 59 || got > 61 {
		t.Errorf("admissions in the final minute of 82/min offered at 60/min = %d, want 60 ± 1", got)
	}
	if refused == 0 {
		t.Error("no refusals under sustained overload")
	}
	old := &admitAnywayModel{tokens: 10, perMs: 60.0 / 60000, capacity: 10, boundMs: 4833, last: t0}
	if oldGot := sustainedRun(old.take); oldGot != 82 {
		t.Errorf("admit-anyway model read %d, want 82 (what the first design measured)", oldGot)
	} else if oldGot >= 59 && oldGot <= 61 {
		t.Errorf("the sustained-rate assertion cannot tell the admit-anyway design apart")
	}
}

// TestRefusalDebitsNothingUnderLoad guards against a livelock (docs/pacing.md §4.1): a refused request that
// retries must not deepen the deficit that refused it.
func TestRefusalDebitsNothingUnderLoad(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	takeN(b, t0, 14)
	for i := 0; i < 100; i++ {
		if d := b.Take(t0); d.Kind != KindRefuse || d.Debited {
			t.Fatalf("Take %d = %+v, want refused without debit", i, d)
		}
	}
	if got := b.Tokens(t0); got != -4 {
		t.Errorf("Tokens after 100 refusals = %v, want -4", got)
	}
	if d := b.Take(t0.Add(167 * time.Millisecond)); d.Kind != KindWait || d.Wait != ms(4833) {
		t.Errorf("Take after 167ms = %q, want wait 4833ms", describe(d))
	}
}

func TestDisabledAdmitsEverything(t *testing.T) {
	for name, p := range map[string]Policy{
		"rate 0":     {RatePerMinute: 0, Burst: 10, Budget: DefaultBudget()},
		"zero bound": policyAt(60, dur(ms(14001)), nil),
	} {
		b := NewBucket(p, t0)
		for i := 0; i < 50; i++ {
			d := b.Take(t0)
			if d != (Decision{Kind: KindAdmit}) {
				t.Fatalf("%s: Take %d = %+v, want plain admit", name, i, d)
			}
		}
		b.Refund(t0)
		if got := b.Tokens(t0); got != 10 {
			t.Errorf("%s: Tokens = %v, want 10 (untouched)", name, got)
		}
	}
}

func TestRefund(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	takeN(b, t0, 10)
	b.Refund(t0)
	if got := b.Tokens(t0); got != 1 {
		t.Errorf("Tokens after one refund = %v, want 1", got)
	}
	if d := b.Take(t0); d.Kind != KindAdmit || !d.Debited {
		t.Errorf("Take after refund = %+v, want admit now", d)
	}
	full := NewBucket(DefaultPolicy(), t0)
	full.Refund(t0.Add(time.Second))
	if got := full.Tokens(t0.Add(time.Second)); got != 10 {
		t.Errorf("Tokens after refund into a full bucket = %v, want 10", got)
	}
	nearly := NewBucket(DefaultPolicy(), t0)
	nearly.Take(t0)
	nearly.Refund(t0.Add(500 * time.Millisecond))
	if got := nearly.Tokens(t0.Add(500 * time.Millisecond)); got != 10 {
		t.Errorf("Tokens after refund with 9.5 = %v, want 10 (capped)", got)
	}
}

func TestRefundReservation(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	ds := takeN(b, t0, 15)
	for i, d := range ds[:14] {
		if d.ID != uint64(i+1) {
			t.Errorf("decision %d ID = %d, want %d", i+1, d.ID, i+1)
		}
	}
	if ds[14].ID != 0 {
		t.Errorf("refusal ID = %d, want 0", ds[14].ID)
	}
	// Cancel the request waiting 4 s: its token comes back exactly once.
	if !b.RefundReservation(t0, ds[13].ID) {
		t.Fatal("RefundReservation(14) = false, want true")
	}
	if b.RefundReservation(t0, ds[13].ID) {
		t.Error("second RefundReservation(14) = true, want false")
	}
	if got := b.Tokens(t0); got != -3 {
		t.Errorf("Tokens after one cancellation = %v, want -3", got)
	}
	if got := describe(b.Take(t0)); got != "wait 4000ms" {
		t.Errorf("Take after cancellation = %q, want wait 4000ms", got)
	}
	for _, id := range []uint64{0, 16, 1 << 40} {
		if b.RefundReservation(t0, id) {
			t.Errorf("RefundReservation(%d) = true, want false", id)
		}
	}
	// A refund of an admitted-now reservation into a bucket that refilled is capped.
	if !b.RefundReservation(t0.Add(time.Hour), ds[0].ID) {
		t.Error("RefundReservation(1) = false, want true")
	}
	if got := b.Tokens(t0.Add(time.Hour)); got != 10 {
		t.Errorf("Tokens = %v, want 10", got)
	}
}

func TestRefundReservationWindow(t *testing.T) {
	b := NewBucket(Policy{RatePerMinute: 600, Burst: 1, Budget: DefaultBudget()}, t0)
	var ids []uint64
	for i := 0; i < refundWindow+2; i++ {
		d := b.Take(t0.Add(time.Duration(i) * 100 * time.Millisecond))
		if !d.Debited {
			t.Fatalf("Take %d = %+v, want debited", i, d)
		}
		ids = append(ids, d.ID)
	}
	now := t0.Add(time.Hour)
	if b.RefundReservation(now, ids[0]) || b.RefundReservation(now, ids[1]) {
		t.Error("RefundReservation of a reservation older than the window = true, want false")
	}
	if !b.RefundReservation(now, ids[2]) {
		t.Error("RefundReservation of the oldest remembered reservation = false, want true")
	}
	if !b.RefundReservation(now, ids[len(ids)-1]) {
		t.Error("RefundReservation of the newest reservation = false, want true")
	}
	// A slot reused by a newer reservation is refundable again, once.
	b2 := NewBucket(Policy{RatePerMinute: 600, Burst: 1, Budget: DefaultBudget()}, t0)
	first := b2.Take(t0)
	if !b2.RefundReservation(t0, first.ID) {
		t.Fatal("RefundReservation(first) = false")
	}
	var reuse Decision
	for i := 1; i <= refundWindow; i++ {
		reuse = b2.Take(t0.Add(time.Duration(i) * 100 * time.Millisecond))
	}
	if reuse.ID != first.ID+refundWindow {
		t.Fatalf("reuse ID = %d, want %d", reuse.ID, first.ID+refundWindow)
	}
	if !b2.RefundReservation(now, reuse.ID) {
		t.Error("RefundReservation of a reservation in a reused slot = false, want true")
	}
	if b2.RefundReservation(now, reuse.ID) {
		t.Error("second RefundReservation in a reused slot = true, want false")
	}
}

func TestSetPolicy(t *testing.T) {
	t.Run("keeps debt and switches the refill", func(t *testing.T) {
		b := NewBucket(DefaultPolicy(), t0)
		takeN(b, t0, 10)
		b.SetPolicy(t0.Add(2*time.Second), Policy{RatePerMinute: 600, Burst: 10, Budget: DefaultBudget()})
		if got := b.Tokens(t0.Add(2 * time.Second)); got != 2 {
			t.Errorf("Tokens at the switch = %v, want 2 (accrued at 60/min)", got)
		}
		if got := b.Tokens(t0.Add(2100 * time.Millisecond)); got != 3 {
			t.Errorf("Tokens 100ms after = %v, want 3 (accruing at 600/min)", got)
		}
		if got := b.Policy().RatePerMinute; got != 600 {
			t.Errorf("Policy().RatePerMinute = %d, want 600", got)
		}
	})
	t.Run("lower burst caps tokens", func(t *testing.T) {
		b := NewBucket(DefaultPolicy(), t0)
		b.SetPolicy(t0, Policy{RatePerMinute: 60, Burst: 5, Budget: DefaultBudget()})
		if got := b.Tokens(t0); got != 5 {
			t.Errorf("Tokens = %v, want 5", got)
		}
	})
	t.Run("higher burst does not mint tokens", func(t *testing.T) {
		b := NewBucket(DefaultPolicy(), t0)
		b.SetPolicy(t0, Policy{RatePerMinute: 60, Burst: 20, Budget: DefaultBudget()})
		if got := b.Tokens(t0); got != 10 {
			t.Errorf("Tokens = %v, want 10", got)
		}
		if got := b.Tokens(t0.Add(5 * time.Second)); got != 15 {
			t.Errorf("Tokens after 5s = %v, want 15", got)
		}
	})
	t.Run("enabling starts full", func(t *testing.T) {
		b := NewBucket(Policy{RatePerMinute: 0, Burst: 10, Budget: DefaultBudget()}, t0)
		b.SetPolicy(t0.Add(time.Minute), DefaultPolicy())
		if got := b.Tokens(t0.Add(time.Minute)); got != 10 {
			t.Errorf("Tokens = %v, want 10", got)
		}
		takeN(b, t0.Add(time.Minute), 10)
		if got := describe(b.Take(t0.Add(time.Minute))); got != "wait 1000ms" {
			t.Errorf("11th Take = %q, want wait 1000ms (refill measured from the switch)", got)
		}
	})
	t.Run("disabling then re-enabling starts full", func(t *testing.T) {
		b := NewBucket(DefaultPolicy(), t0)
		takeN(b, t0, 14)
		b.SetPolicy(t0, Policy{RatePerMinute: 0, Burst: 10, Budget: DefaultBudget()})
		if d := b.Take(t0); d.Kind != KindAdmit || d.Debited {
			t.Errorf("Take while disabled = %+v, want plain admit", d)
		}
		b.SetPolicy(t0.Add(time.Second), DefaultPolicy())
		if got := b.Tokens(t0.Add(time.Second)); got != 10 {
			t.Errorf("Tokens after re-enabling = %v, want 10", got)
		}
	})
	t.Run("switch to a refusing policy", func(t *testing.T) {
		b := NewBucket(policyAt(1, nil, nil), t0)
		takeN(b, t0, 10)
		b.SetPolicy(t0, DefaultPolicy())
		ds := takeN(b, t0, 5)
		if got := describe(ds[4]); got != "refuse 4s deficit 5000ms" {
			t.Errorf("5th Take = %q, want refuse 4s deficit 5000ms", got)
		}
	})
	t.Run("a clock stepping back does not rewind", func(t *testing.T) {
		b := NewBucket(DefaultPolicy(), t0)
		takeN(b, t0.Add(time.Second), 10)
		b.SetPolicy(t0, DefaultPolicy())
		if got := b.Tokens(t0.Add(2 * time.Second)); got != 1 {
			t.Errorf("Tokens = %v, want 1", got)
		}
	})
}

func TestPolicyIsClamped(t *testing.T) {
	b := NewBucket(Policy{RatePerMinute: 10000, Burst: 0, Budget: Budget{MaxRetries: 99, WaitBound: time.Hour}}, t0)
	want := Policy{RatePerMinute: 600, Burst: 1, Budget: Budget{MaxRetries: 10, WaitBound: 15 * time.Second}}
	if got := b.Policy(); got != want {
		t.Errorf("Policy() = %+v, want %+v", got, want)
	}
	if got := b.Tokens(t0); got != 1 {
		t.Errorf("Tokens = %v, want 1", got)
	}
	neg := NewBucket(Policy{RatePerMinute: -5, Burst: 2000, Budget: Budget{MaxRetries: -1, WaitBound: -time.Second}}, t0)
	want = Policy{RatePerMinute: 0, Burst: 1000, Budget: Budget{MaxRetries: 0, WaitBound: 0}}
	if got := neg.Policy(); got != want {
		t.Errorf("Policy() = %+v, want %+v", got, want)
	}
	if d := neg.Take(t0); d.Kind != KindAdmit || d.Debited {
		t.Errorf("Take with a negative rate = %+v, want plain admit", d)
	}
}

func TestClockEdges(t *testing.T) {
	b := NewBucket(DefaultPolicy(), t0)
	takeN(b, t0.Add(time.Second), 10)
	if d := b.Take(t0); d.Kind != KindWait || d.Wait != time.Second {
		t.Errorf("Take at an earlier instant = %q, want wait 1000ms (no refill, no rewind)", describe(d))
	}
	if got := b.Tokens(t0.Add(3 * time.Second)); got != 1 {
		t.Errorf("Tokens = %v, want 1", got)
	}
	// Tokens does not change the bucket.
	if got := b.Tokens(t0.Add(time.Hour)); got != 10 {
		t.Errorf("Tokens an hour later = %v, want 10", got)
	}
	if got := b.Tokens(t0.Add(time.Second)); got != -1 {
		t.Errorf("Tokens read again at the last update = %v, want -1", got)
	}
	// Enormous gaps saturate instead of overflowing.
	z := NewBucket(DefaultPolicy(), time.Time{})
	takeN(z, time.Time{}, 12)
	far := time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := z.Tokens(far); got != 10 {
		t.Errorf("Tokens across millennia = %v, want 10", got)
	}
	if d := z.Take(far); d.Kind != KindAdmit {
		t.Errorf("Take across millennia = %+v, want admit", d)
	}
	if got := z.Tokens(far); got != 9 {
		t.Errorf("Tokens = %v, want 9", got)
	}
}

// TestRefillIsExact: at 7/min one token takes 8571428571.43ns, so 8571428571ns after draining
// a one-token bucket it is 3 units (of 6e10 per token) short and the next request waits 1ms.
func TestRefillIsExact(t *testing.T) {
	b := NewBucket(Policy{RatePerMinute: 7, Burst: 1, Budget: DefaultBudget()}, t0)
	b.Take(t0)
	if d := b.Take(t0.Add(8571428571)); d.Kind != KindWait || d.Wait != time.Millisecond || d.RequiredWait != time.Millisecond {
		t.Errorf("Take 8571428571ns after draining = %+v, want wait 1ms", d)
	}
	c := NewBucket(Policy{RatePerMinute: 7, Burst: 1, Budget: DefaultBudget()}, t0)
	c.Take(t0)
	if d := c.Take(t0.Add(8571428572)); d.Kind != KindAdmit {
		t.Errorf("Take 8571428572ns after draining = %+v, want admit now", d)
	}
}

func TestTokensRefillExactly(t *testing.T) {
	b := NewBucket(Policy{RatePerMinute: 7, Burst: 3, Budget: DefaultBudget()}, t0)
	takeN(b, t0, 3)
	tests := []struct {
		at   time.Duration
		want float64
	}{
		{0, 0},
		{time.Minute, 3}, // 7 tokens' worth, capped at 3
		{time.Minute / 7 * 2, 2},
		{30 * time.Second, 3},
		{time.Minute / 14, 0.5},
	}
	for _, tt := range tests {
		if got := b.Tokens(t0.Add(tt.at)); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Tokens(t0+%v) = %v, want %v", tt.at, got, tt.want)
		}
	}
}

func TestStateRestore(t *testing.T) {
	p := DefaultPolicy()
	b := NewBucket(p, t0)
	takeN(b, t0, 14)
	s := b.State()
	if s.Tokens != -4 || !s.Updated.Equal(t0) {
		t.Fatalf("State() = %+v, want -4 tokens at t0", s)
	}
	r := Restore(p, s)
	if got := describe(r.Take(t0)); got != "refuse 4s deficit 5000ms" {
		t.Errorf("restored Take = %q, want refuse 4s deficit 5000ms", got)
	}
	if got := describe(r.Take(t0.Add(time.Second))); got != "wait 4000ms" {
		t.Errorf("restored Take 1s later = %q, want wait 4000ms", got)
	}
	tests := []struct {
		name string
		in   float64
		want float64
	}{
		{"NaN is full", math.NaN(), 10},
		{"+Inf is full", math.Inf(1), 10},
		{"above capacity is full", 11, 10},
		{"exact capacity", 10, 10},
		{"fraction", 2.5, 2.5},
		{"debt", -3, -3},
		{"-Inf clamps to the floor minus one", math.Inf(-1), -1 - 4.833},
		{"deep debt clamps", -1e18, -1 - 4.833},
	}
	for _, tt := range tests {
		r := Restore(p, State{Tokens: tt.in, Updated: t0})
		if got := r.Tokens(t0); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("%s: Restore(%v).Tokens = %v, want %v", tt.name, tt.in, got, tt.want)
		}
	}
}

func TestKindString(t *testing.T) {
	tests := map[Kind]string{KindAdmit: "admit", KindWait: "wait", KindRefuse: "refuse", 0: "Kind(0)", 9: "Kind(9)"}
	for k, want := range tests {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", int(k), got, want)
		}
	}
}

func TestPolicyNotices(t *testing.T) {
	p := DefaultPolicy()
	if n := p.RelaxedNotice(); n.Key != KeyCeilingRelaxed || !strings.Contains(n.Message, "past the 60/minute ceiling") {
		t.Errorf("RelaxedNotice() = %+v", n)
	}
	if n := p.DisabledNotice(); n.Key != KeyPacingDisabled {
		t.Errorf("DisabledNotice().Key = %q", n.Key)
	}
	// Safe on any policy, even one that is not pacing.
	off := Policy{RatePerMinute: 0, Burst: 10, Budget: DefaultBudget()}
	if n := off.NoRefuseNotice(); n.Key != KeyPacingNoRefuse || !strings.Contains(n.Message, "at 0/minute") {
		t.Errorf("NoRefuseNotice() at rate 0 = %+v", n)
	}
}

func TestCanRefuseRejectsNonsense(t *testing.T) {
	tests := []struct {
		name string
		p    Policy
		want bool
	}{
		{"negative rate and retries", Policy{RatePerMinute: -1, Burst: 10, Budget: Budget{MaxRetries: -100, WaitBound: ms(4833)}}, false},
		{"negative rate", Policy{RatePerMinute: -60, Burst: 10, Budget: Budget{MaxRetries: 5, WaitBound: ms(4833)}}, false},
		{"negative retries", Policy{RatePerMinute: 60, Burst: 10, Budget: Budget{MaxRetries: -5, WaitBound: ms(4833)}}, false},
		{"zero bound", Policy{RatePerMinute: 600, Burst: 10, Budget: Budget{MaxRetries: 10, WaitBound: 0}}, false},
		{"one retry of 1s at 60/min", Policy{RatePerMinute: 60, Burst: 10, Budget: Budget{MaxRetries: 1, WaitBound: ms(1000)}}, true},
		{"one retry of 1s at 59/min", Policy{RatePerMinute: 59, Burst: 10, Budget: Budget{MaxRetries: 1, WaitBound: ms(1999)}}, false},
	}
	for _, tt := range tests {
		if got := tt.p.CanRefuse(); got != tt.want {
			t.Errorf("%s: CanRefuse() = %v, want %v", tt.name, got, tt.want)
		}
	}
}
