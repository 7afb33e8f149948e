package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

// The conformance suite: every case runs against Memory and against Redis
// (a real redis-server), with the same clock readings. The Redis store
// reads instants at microsecond resolution (Redis TIME's), so the suite's
// instants are whole microseconds; the nanosecond edges of the bucket
// math are covered by internal/pacing's own tests.

// fakeClock is a clock safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// storeKind opens a fresh, empty store of one kind.
type storeKind struct {
	name string
	open func(t *testing.T, now func() time.Time, defaults *pacing.Policy) Store
}

var prefixSeq atomic.Int64

// openRedisAt opens a Redis store with a prefix no other store in this
// process uses, so stores sharing one redis-server start empty.
func openRedisAt(t testing.TB, srv *redistest.Server, now func() time.Time, defaults *pacing.Policy) *Redis {
	t.Helper()
	r, err := OpenRedis(t.Context(), RedisOptions{
		URL:      srv.URL,
		Prefix:   fmt.Sprintf("t%d:", prefixSeq.Add(1)),
		Defaults: defaults,
		Now:      now,
		Timeout:  5 * time.Second, // tests assert decisions here, not deadlines
	})
	if err != nil {
		t.Fatalf("OpenRedis: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func kinds(t *testing.T) []storeKind {
	srv := redistest.Start(t)
	return []storeKind{
		{"memory", func(t *testing.T, now func() time.Time, defaults *pacing.Policy) Store {
			m, err := Open(Options{Now: now, Defaults: defaults})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}},
		{"redis", func(t *testing.T, now func() time.Time, defaults *pacing.Policy) Store {
			return openRedisAt(t, srv, now, defaults)
		}},
	}
}

// forEach runs fn once per store kind.
func forEach(t *testing.T, fn func(t *testing.T, k storeKind)) {
	for _, k := range kinds(t) {
		t.Run(k.name, func(t *testing.T) { fn(t, k) })
	}
}

func describeAdmission(a Admission) string {
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

func mustAdmit(t *testing.T, s Store, key string, now time.Time) Admission {
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
		out[i] = describeAdmission(mustAdmit(t, s, key, now))
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

func setPolicy(t *testing.T, s Store, key string, now time.Time, rate, burst int, idle *time.Duration, retries *int) Account {
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

// 15 simultaneous requests at the defaults (docs/pacing.md §3 and §4.2):
// 10 now, waits of 1..4 s, then a refusal with the 4 s hint.
func TestConformanceFifteenAtDefaults(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		var got []string
		var waits []Admission
		for range 15 {
			a := mustAdmit(t, s, key, t0)
			got = append(got, describeAdmission(a))
			if a.Decision.Kind == pacing.KindWait {
				waits = append(waits, a)
			}
			if a.Decision.Kind == pacing.KindAdmit && a.Reservation != 0 {
				t.Errorf("admit now has reservation %d, want none", a.Reservation)
			}
		}
		want := append(repeatString("now", 10), "wait 1000ms", "wait 2000ms", "wait 3000ms", "wait 4000ms", "refuse 4s deficit 5000ms")
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Fatalf("15 simultaneous at defaults:\n got %q\nwant %q", got, want)
		}
		for i, w := range waits {
			if w.Reservation == 0 || !w.Decision.Debited || w.PolicyVersion != 0 {
				t.Errorf("wait %d = %+v, want debited with a reservation under version 0", i+1, w)
			}
		}
		if got := mustTokens(t, s, key, t0); got != -4 {
			t.Errorf("tokens = %v, want -4 (14 debits, the refusal debits nothing)", got)
		}
	})
}

// docs/pacing.md §5: 20 simultaneous at 1/min and 2/min (policies that
// cannot refuse): 10 now, one waits the bound, 9 past the ceiling.
func TestConformanceTwentyAtLowRates(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		for _, rate := range []int{1, 2} {
			s := k.open(t, nil, nil)
			setPolicy(t, s, key, t0, rate, 10, nil, nil)
			got := admitN(t, s, key, t0, 20)
			want := append(append(repeatString("now", 10), "wait 4833ms"), repeatString("now-relaxed", 9)...)
			if strings.Join(got, ", ") != strings.Join(want, ", ") {
				t.Errorf("20 simultaneous at %d/min:\n got %q\nwant %q", rate, got, want)
			}
			if tok := mustTokens(t, s, key, t0); tok != -1 {
				t.Errorf("%d/min: tokens = %v, want -1", rate, tok)
			}
		}
	})
}

func TestConformanceRefusalThresholds(t *testing.T) {
	tests := []struct {
		name       string
		rate       int
		idle       *time.Duration
		retries    *int
		wantEleven string
	}{
		{"2/min default budget never refuses", 2, nil, nil, "wait 4833ms"},
		{"3/min default budget refuses", 3, nil, nil, "refuse 4s deficit 20000ms"},
		{"29/min at IDLE=10000 never refuses", 29, msp(10000), nil, "wait 666ms"},
		{"30/min at IDLE=10000 refuses", 30, msp(10000), nil, "refuse 1s deficit 2000ms"},
		{"60/min at IDLE=30000", 60, msp(30000), nil, "wait 1000ms"},
		{"600/min at IDLE=10000", 600, msp(10000), nil, "wait 100ms"},
		{"60/min without retries waits", 60, nil, intp(0), "wait 1000ms"},
	}
	forEach(t, func(t *testing.T, k storeKind) {
		for _, tt := range tests {
			s := k.open(t, nil, nil)
			setPolicy(t, s, key, t0, tt.rate, 10, tt.idle, tt.retries)
			got := admitN(t, s, key, t0, 11)
			if got[10] != tt.wantEleven {
				t.Errorf("%s: 11th of 11 = %q, want %q", tt.name, got[10], tt.wantEleven)
			}
		}
	})
}

// With retries off nothing would retry a refusal: 40 at 60/min never refuse.
func TestConformanceNoRetriesNeverRefuses(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		setPolicy(t, s, key, t0, 60, 10, nil, intp(0))
		got := admitN(t, s, key, t0, 40)
		want := repeatString("now", 10)
		for w := 1; w <= 15; w++ {
			want = append(want, fmt.Sprintf("wait %dms", w*1000))
		}
		want = append(want, repeatString("now-relaxed", 15)...)
		if strings.Join(got, ", ") != strings.Join(want, ", ") {
			t.Errorf("40 simultaneous at 60/min without retries:\n got %q\nwant %q", got, want)
		}
	})
}

// The bucket's boundaries (docs/pacing.md §3), at microsecond instants.
func TestConformanceBoundaries(t *testing.T) {
	type setup struct {
		rate  int
		idle  *time.Duration
		takes int
	}
	def := setup{60, nil, 10}
	tests := []struct {
		name string
		s    setup
		at   time.Duration
		want string
	}{
		{"exactly one token admits now", def, time.Second, "now"},
		{"just under one token waits 1ms", def, 999 * time.Millisecond, "wait 1ms"},
		{"a microsecond short rounds up to 1ms", def, time.Second - time.Microsecond, "wait 1ms"},
		{"wait exactly the bound admits", setup{60, nil, 14}, 167 * time.Millisecond, "wait 4833ms"},
		{"a microsecond over the bound refuses", setup{60, nil, 14}, 167*time.Millisecond - time.Microsecond, "refuse 4s deficit 4834ms"},
		{"hint capped below the deficit", setup{60, msp(30000), 12}, 0, "refuse 2s deficit 3000ms"},
		{"sub-second bound asks 1s", setup{60, msp(10000), 10}, 0, "refuse 1s deficit 1000ms"},
		{"sub-second bound admits at exactly 666ms", setup{60, msp(10000), 10}, 334 * time.Millisecond, "wait 666ms"},
		{"tokens exactly at the floor relax", setup{1, nil, 11}, 55167 * time.Millisecond, "now-relaxed"},
		{"tokens just above the floor wait the bound", setup{1, nil, 11}, 55167*time.Millisecond + time.Microsecond, "wait 4833ms"},
		{"no-refuse just past bound waits the bound", setup{1, nil, 10}, 60*time.Second - 4833*time.Millisecond - time.Microsecond, "wait 4833ms"},
	}
	forEach(t, func(t *testing.T, k storeKind) {
		for _, tt := range tests {
			s := k.open(t, nil, nil)
			setPolicy(t, s, key, t0, tt.s.rate, 10, tt.s.idle, nil)
			admitN(t, s, key, t0, tt.s.takes)
			if got := describeAdmission(mustAdmit(t, s, key, t0.Add(tt.at))); got != tt.want {
				t.Errorf("%s: Admit(t0+%v) = %q, want %q", tt.name, tt.at, got, tt.want)
			}
		}
	})
}

// The four-minute overload of docs/pacing.md §3: 82/min offered against 60/min; the last
// minute admits 60 ± 1.
func TestConformanceSustainedRate(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		count, refused := 0, 0
		for i := int64(0); ; i++ {
			at := (time.Duration(i * int64(60*time.Second) / 82)).Truncate(time.Microsecond)
			if at >= 240*time.Second {
				break
			}
			a := mustAdmit(t, s, key, t0.Add(at))
			if a.Decision.Relaxed {
				t.Fatalf("relaxed at +%v under a policy that can refuse", at)
			}
			if a.Decision.Kind == pacing.KindRefuse {
				refused++
			} else if at >= 180*time.Second {
				count++
			}
		}
		if count < 59 || count > 61 || refused == 0 {
			t.Errorf("final-minute admissions at 82/min offered = %d (refusals %d), want 60 ± 1 and some refusals", count, refused)
		}
	})
}

// A refused request that retries never deepens the deficit that refused it.
func TestConformanceRefusalDebitsNothing(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		admitN(t, s, key, t0, 14)
		for i := range 100 {
			if a := mustAdmit(t, s, key, t0); a.Decision.Kind != pacing.KindRefuse || a.Decision.Debited {
				t.Fatalf("Admit %d = %+v, want refused without debit", i, a)
			}
		}
		if got := mustTokens(t, s, key, t0); got != -4 {
			t.Errorf("tokens after 100 refusals = %v, want -4", got)
		}
		if got := describeAdmission(mustAdmit(t, s, key, t0.Add(167*time.Millisecond))); got != "wait 4833ms" {
			t.Errorf("Admit after 167ms = %q, want wait 4833ms", got)
		}
	})
}

func TestConformanceDisabledAdmitsEverything(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		for name, p := range map[string]pacing.Policy{
			"rate 0": {RatePerMinute: 0, Burst: 10, Budget: pacing.DefaultBudget()},
			"zero bound": {RatePerMinute: 60, Burst: 10, Budget: func() pacing.Budget {
				b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: msp(14001)})
				return b
			}()},
		} {
			s := k.open(t, nil, &p)
			for i := range 50 {
				a := mustAdmit(t, s, key, t0)
				if a.Decision != (pacing.Decision{Kind: pacing.KindAdmit}) || a.Reservation != 0 {
					t.Fatalf("%s: Admit %d = %+v, want a plain admit", name, i, a)
				}
			}
			if got := mustTokens(t, s, key, t0); got != 10 {
				t.Errorf("%s: tokens = %v, want 10 (untouched)", name, got)
			}
		}
	})
}

func TestConformanceCancel(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		ctx := t.Context()
		admitN(t, s, key, t0, 10)
		w1 := mustAdmit(t, s, key, t0) // waits 1s
		w2 := mustAdmit(t, s, key, t0) // waits 2s
		if w1.Reservation == 0 || w2.Reservation == 0 || w1.Reservation == w2.Reservation {
			t.Fatalf("reservations %d, %d; want two distinct non-zero ids", w1.Reservation, w2.Reservation)
		}
		if ok, err := s.Cancel(ctx, key, w2.Reservation, t0); !ok || err != nil {
			t.Errorf("Cancel(pending) = %v, %v; want true", ok, err)
		}
		if got := mustTokens(t, s, key, t0); got != -1 {
			t.Errorf("tokens after the refund = %v, want -1", got)
		}
		if ok, _ := s.Cancel(ctx, key, w2.Reservation, t0); ok {
			t.Error("second Cancel = true, want false")
		}
		if got := mustTokens(t, s, key, t0); got != -1 {
			t.Errorf("tokens after the second cancel = %v, want -1", got)
		}
		if ok, _ := s.Cancel(ctx, key, w1.Reservation, t0.Add(time.Second)); ok {
			t.Error("Cancel(departed) = true, want false")
		}
		for _, c := range []struct {
			key string
			id  uint64
		}{{key, 999}, {key, 0}, {"acct_ffffffffffffffff", w1.Reservation}} {
			if ok, _ := s.Cancel(ctx, c.key, c.id, t0); ok {
				t.Errorf("Cancel(%s, %d) = true, want false", c.key, c.id)
			}
		}
		// The queue behind a cancelled reservation keeps its deadlines; the
		// next request takes the freed slot.
		if got := describeAdmission(mustAdmit(t, s, key, t0)); got != "wait 2000ms" {
			t.Errorf("Admit after the cancellation = %q, want wait 2000ms", got)
		}
	})
}

func TestConformancePolicies(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		ctx := t.Context()
		if _, err := s.Account(ctx, key, t0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Account(unknown) = %v, want ErrNotFound", err)
		}
		admitN(t, s, key, t0, 10)
		// 2 s later 2 tokens accrued at 60/min; then 600/min refills 10x faster.
		a := setPolicy(t, s, key, t0.Add(2*time.Second), 600, 10, nil, nil)
		if a.PolicyVersion != 1 || !a.Custom || a.Tokens != 2 || a.Policy.RatePerMinute != 600 || a.EffectiveRate != 600 {
			t.Errorf("UpdatePolicy = %+v, want version 1, custom, 2 tokens, 600/min", a)
		}
		if got := mustTokens(t, s, key, t0.Add(2100*time.Millisecond)); got != 3 {
			t.Errorf("tokens 100ms after the switch = %v, want 3", got)
		}
		if got := mustAdmit(t, s, key, t0.Add(2100*time.Millisecond)); got.PolicyVersion != 1 {
			t.Errorf("Admit under the new policy: version %d, want 1", got.PolicyVersion)
		}
		// A lower burst caps the tokens; the version is store-wide.
		other := "acct_1111111111111111"
		if a := setPolicy(t, s, other, t0, 60, 5, nil, nil); a.PolicyVersion != 2 || a.Tokens != 5 {
			t.Errorf("second account's policy = %+v, want version 2 and a full bucket of 5", a)
		}
		if a := setPolicy(t, s, other, t0, 60, 3, nil, nil); a.PolicyVersion != 3 || a.Tokens != 3 {
			t.Errorf("lower burst = %+v, want version 3 and 3 tokens", a)
		}
		// A failing update changes nothing.
		boom := errors.New("boom")
		if _, err := s.UpdatePolicy(ctx, "acct_2222222222222222", t0, func(p pacing.Policy) (pacing.Policy, error) { return p, boom }); !errors.Is(err, boom) {
			t.Errorf("UpdatePolicy error = %v, want boom", err)
		}
		if _, err := s.Account(ctx, "acct_2222222222222222", t0); !errors.Is(err, ErrNotFound) {
			t.Errorf("Account after a failed update = %v, want ErrNotFound", err)
		}
		// The update function sees the current policy.
		if _, err := s.UpdatePolicy(ctx, other, t0, func(p pacing.Policy) (pacing.Policy, error) {
			if p.RatePerMinute != 60 || p.Burst != 3 || p.Budget.WaitBound != 4833*time.Millisecond {
				t.Errorf("update saw %+v, want 60/min burst 3, bound 4833ms", p)
			}
			return p, nil
		}); err != nil {
			t.Fatal(err)
		}
		accts, err := s.Accounts(ctx, t0.Add(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, a := range accts {
			keys = append(keys, a.Key)
		}
		if got := strings.Join(keys, ","); got != key+","+other {
			t.Errorf("Accounts = %s, want %s,%s", got, key, other)
		}
	})
}

func TestConformanceAdaptive(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		ctx := t.Context()
		if _, _, err := s.Report403(ctx, key, t0, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Report403(unknown) = %v, want ErrNotFound", err)
		}
		setPolicy(t, s, key, t0, 600, 10, nil, nil)
		a, err := s.SetAdaptive(ctx, key, true, t0)
		if err != nil || !a.Adaptive || a.EffectiveRate != 600 || a.PolicyVersion != 2 || !a.PausedUntil.IsZero() {
			t.Fatalf("SetAdaptive = %+v, %v; want adaptive at 600, version 2, not paused", a, err)
		}
		report := func(at, retryAfter time.Duration, want int, wantChanged bool, wantPause time.Duration) {
			t.Helper()
			a, changed, err := s.Report403(ctx, key, t0.Add(at), retryAfter)
			if err != nil || a.EffectiveRate != want || changed != wantChanged || a.Policy.RatePerMinute != 600 {
				t.Fatalf("Report403 at +%v = %d (changed %v, configured %d), %v; want %d (changed %v), configured 600",
					at, a.EffectiveRate, changed, a.Policy.RatePerMinute, err, want, wantChanged)
			}
			if wantPause == 0 && !a.PausedUntil.IsZero() || wantPause != 0 && !a.PausedUntil.Equal(t0.Add(wantPause)) {
				t.Fatalf("Report403 at +%v: paused until +%v, want +%v", at, a.PausedUntil.Sub(t0), wantPause)
			}
		}
		adapt := func(at time.Duration, want int) {
			t.Helper()
			accts, err := s.Adapt(ctx, t0.Add(at))
			if err != nil {
				t.Fatal(err)
			}
			got := -1
			if len(accts) == 1 && accts[0].Key == key {
				got = accts[0].EffectiveRate
			} else if len(accts) > 1 {
				t.Fatalf("Adapt at +%v returned %d accounts, want at most 1", at, len(accts))
			}
			if got != want {
				t.Fatalf("Adapt at +%v raised to %d, want %d (-1: no change)", at, got, want)
			}
		}
		admitAt := func(at time.Duration, want string) {
			t.Helper()
			if got := describeAdmission(mustAdmit(t, s, key, t0.Add(at))); got != want {
				t.Fatalf("Admit at +%v = %q, want %q", at, got, want)
			}
		}
		if got := admitN(t, s, key, t0, 10); strings.Join(got, ",") != strings.Join(repeatString("now", 10), ",") {
			t.Fatalf("burst = %v, want 10 x now", got)
		}
		// A 403 without a retry-after pauses for the learned interval
		// (first 60 s) and halves the rate.
		report(0, 0, 300, true, 60*time.Second)
		// The bucket paces at the effective rate: 300/min is 5 tokens a second.
		if a, err := s.Account(ctx, key, t0.Add(time.Second)); err != nil || a.Tokens != 5 || a.EffectiveRate != 300 || !a.PausedUntil.Equal(t0.Add(time.Minute)) {
			t.Fatalf("Account 1s later = %+v, %v; want 5 tokens at 300/min, paused until +60s", a, err)
		}
		// Paused: refused with the pause's end as the hint, nothing debited.
		admitAt(time.Second, "refuse 59s deficit 59000ms")
		admitAt(1500*time.Millisecond, "refuse 59s deficit 58500ms")
		report(5*time.Second, 0, 300, false, 60*time.Second) // inside the pause, within 10 s of the lowering
		report(10*time.Second, 0, 150, true, 60*time.Second) // lowers again; the pause stays
		// A pause ending within the bound (4833 ms at the defaults): wait for it.
		admitAt(56*time.Second, "wait 4000ms")
		admitAt(60*time.Second, "now")
		adapt(89*time.Second, -1) // quiet since the pause's end: 29 s
		adapt(90*time.Second, 210)
		adapt(90*time.Second, -1)
		if a, err := s.Account(ctx, key, t0.Add(150*time.Second)); err != nil || a.EffectiveRate != 330 || !a.PausedUntil.IsZero() {
			t.Fatalf("Account at +150s = %+v, %v; want 330 (two more quiet steps), not paused", a, err)
		}
		// Long after the last pause: the learned interval stays 60 s.
		report(151*time.Second, 0, 165, true, 211*time.Second)
		// Right after that pause: it was too short, so the interval doubles.
		report(212*time.Second, 0, 82, true, 332*time.Second)
		// A retry-after pauses for exactly that long.
		report(213*time.Second, 200*time.Second, 82, true, 413*time.Second)
		admitAt(214*time.Second, "refuse 199s deficit 199000ms")
		a, err = s.SetAdaptive(ctx, key, false, t0.Add(220*time.Second))
		if err != nil || a.Adaptive || a.EffectiveRate != 600 || !a.PausedUntil.IsZero() {
			t.Fatalf("SetAdaptive(off) = %+v, %v; want the configured 600, not paused", a, err)
		}
		admitAt(221*time.Second, "now")
		report(230*time.Second, 0, 600, false, 0)
		adapt(400*time.Second, -1)
	})
}

// An account with the default policy learns too (adaptive is on by
// default), and a policy that cannot refuse waits out a pause within the
// bound instead of refusing.
func TestConformanceAdaptiveDefault(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		ctx := t.Context()
		if got := describeAdmission(mustAdmit(t, s, key, t0)); got != "now" {
			t.Fatalf("Admit = %q, want now", got)
		}
		a, changed, err := s.Report403(ctx, key, t0, 0)
		if err != nil || !changed || !a.Adaptive || a.EffectiveRate != 30 || a.Custom || !a.PausedUntil.Equal(t0.Add(time.Minute)) {
			t.Fatalf("Report403 = %+v, %v, %v; want the default account adaptive at 30, paused until +60s", a, changed, err)
		}
		if got := describeAdmission(mustAdmit(t, s, key, t0.Add(time.Second))); got != "refuse 59s deficit 59000ms" {
			t.Fatalf("Admit while paused = %q, want refuse 59s deficit 59000ms", got)
		}
		// Retries 0: the policy cannot refuse, so a paused request waits
		// the bound (idle 120 s, no retries: bound 15000 ms).
		setPolicy(t, s, key2, t0, 60, 10, nil, intp(0))
		mustAdmit(t, s, key2, t0)
		if _, _, err := s.Report403(ctx, key2, t0, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if got := describeAdmission(mustAdmit(t, s, key2, t0.Add(time.Second))); got != "wait 15000ms" {
			t.Fatalf("Admit while paused, cannot refuse = %q, want wait 15000ms", got)
		}
		if got := describeAdmission(mustAdmit(t, s, key2, t0.Add(25*time.Second))); got != "wait 5000ms" {
			t.Fatalf("Admit 5 s before the pause's end, cannot refuse = %q, want wait 5000ms", got)
		}
	})
}

func TestConformanceHandOver(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		ctx := t.Context()
		// 12 grants at the defaults: 10 tokens, then waits of 1..4 s are
		// debited, the 15th would be refused: 14 debited, 4 in debt.
		r, err := s.HandOver(ctx, key, 20, "report-1", t0)
		if err != nil || r.Duplicate || r.Debited != 14 || r.Account.Tokens != -4 {
			t.Fatalf("HandOver(20) = %+v, %v; want 14 debited, tokens -4", r, err)
		}
		if got := describeAdmission(mustAdmit(t, s, key, t0)); got != "refuse 4s deficit 5000ms" {
			t.Errorf("Admit after the hand-over = %q, want refuse 4s deficit 5000ms", got)
		}
		if r, err := s.HandOver(ctx, key, 20, "report-1", t0.Add(time.Second)); err != nil || !r.Duplicate || r.Debited != 0 {
			t.Errorf("repeated report = %+v, %v; want a duplicate", r, err)
		}
		if got := mustTokens(t, s, key, t0.Add(time.Second)); got != -3 {
			t.Errorf("tokens after the duplicate = %v, want -3 (refilled 1, nothing debited)", got)
		}
		other := "acct_1111111111111111"
		if r, err := s.HandOver(ctx, other, 3, "report-1", t0); err != nil || r.Duplicate || r.Debited != 3 || r.Account.Tokens != 7 {
			t.Errorf("same report id, another account = %+v, %v; want 3 debited, 7 tokens", r, err)
		}
		if r, err := s.HandOver(ctx, "acct_2222222222222222", 0, "report-2", t0); err != nil || r.Debited != 0 || r.Account.Tokens != 10 {
			t.Errorf("HandOver(0) = %+v, %v; want nothing debited, a full bucket", r, err)
		}
	})
}

// The live-agent directory: agents touched through one store handle are
// counted through another sharing the same state (for Redis, another
// replica), until their until passes or their stream is dropped; a
// dropped old stream does not forget the agent's newer one.
func TestConformanceLiveAgents(t *testing.T) {
	srv := redistest.Start(t)
	pairs := []struct {
		name string
		open func(t *testing.T, now func() time.Time) (a, b Store)
	}{
		{"memory", func(t *testing.T, now func() time.Time) (Store, Store) {
			m, err := Open(Options{Now: now})
			if err != nil {
				t.Fatal(err)
			}
			return m, m
		}},
		{"redis", func(t *testing.T, now func() time.Time) (Store, Store) {
			a := openRedisAt(t, srv, now, nil)
			b, err := OpenRedis(t.Context(), RedisOptions{URL: srv.URL, Prefix: a.prefix, Now: now, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return a, b
		}},
	}
	const (
		k1 = "acct_00000000000000a1"
		k2 = "acct_00000000000000a2"
		k3 = "acct_00000000000000a3"
	)
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			clk := newFakeClock()
			a, b := p.open(t, clk.Now)
			ctx := t.Context()
			count := func(s Store, at time.Duration) []int {
				t.Helper()
				n, err := s.LiveAgents(ctx, []string{k1, k2, k3}, t0.Add(at))
				if err != nil {
					t.Fatalf("LiveAgents: %v", err)
				}
				return n
			}
			touch := func(s Store, agent, stream string, until time.Duration, keys ...string) {
				t.Helper()
				if err := s.TouchAgent(ctx, AgentStream{agent, stream}, keys, t0.Add(until)); err != nil {
					t.Fatalf("TouchAgent: %v", err)
				}
			}
			drop := func(s Store, agent, stream string, keys ...string) {
				t.Helper()
				if err := s.DropAgent(ctx, AgentStream{agent, stream}, keys); err != nil {
					t.Fatalf("DropAgent: %v", err)
				}
			}
			check := func(what string, got []int, want ...int) {
				t.Helper()
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: live agents = %v, want %v", what, got, want)
				}
			}
			check("empty", count(b, 0), 0, 0, 0)
			touch(a, "h1", "s1", 15*time.Second, k1, k2) // on replica a
			touch(b, "h2", "s1", 15*time.Second, k1)     // on replica b
			touch(b, "h3", "s1", 20*time.Second, k1, k3)
			check("three agents on two replicas", count(a, time.Second), 3, 1, 1)
			check("read through the other replica", count(b, time.Second), 3, 1, 1)
			// h1 reconnects to b with a new stream; a drops the old one.
			touch(b, "h1", "s2", 16*time.Second, k1, k2)
			drop(a, "h1", "s1", k1, k2)
			check("the old stream's drop keeps the new one", count(a, 2*time.Second), 3, 1, 1)
			// h2 leaves: its stream is dropped.
			drop(b, "h2", "s1", k1)
			check("after a goodbye", count(a, 2*time.Second), 2, 1, 1)
			// Liveness ends at until: h1 at 16 s, h3 at 20 s.
			check("just before h1's until", count(a, 16*time.Second-time.Millisecond), 2, 1, 1)
			check("at h1's until", count(b, 16*time.Second), 1, 0, 1)
			check("at h3's until", count(a, 20*time.Second), 0, 0, 0)
			// A heartbeat extends it.
			touch(a, "h3", "s1", 40*time.Second, k3)
			check("after a heartbeat", count(b, 30*time.Second), 0, 0, 1)
		})
	}
}

func TestConformanceQuotas(t *testing.T) {
	forEach(t, func(t *testing.T, k storeKind) {
		s := k.open(t, nil, nil)
		qs, ok := s.(interface {
			PutQuota(ctx context.Context, q Quota) (prev, next Quota, err error)
			Quotas(ctx context.Context, key string) ([]Quota, error)
		})
		if !ok {
			t.Fatalf("%T has no quotas", s)
		}
		ctx := t.Context()
		reset := t0.Add(5 * time.Hour)
		prim := QuotaWindow{Name: "primary", UsedPercent: 7, Window: 5 * time.Hour, ResetsAt: reset}
		sec := QuotaWindow{Name: "secondary", UsedPercent: 29, Window: 7 * 24 * time.Hour, ResetsAt: t0.Add(100 * time.Hour)}
		if q, err := qs.Quotas(ctx, ""); err != nil || len(q) != 0 {
			t.Fatalf("Quotas of an empty store = %v, %v; want none", q, err)
		}
		prev, next, err := qs.PutQuota(ctx, Quota{Key: key, PlanType: "pro", Windows: []QuotaWindow{sec, prim}, ReportedAt: t0, AgentID: "a-1"})
		if err != nil || prev.Key != "" || len(next.Windows) != 2 || next.Windows[0].Name != "primary" {
			t.Fatalf("first PutQuota = %+v, %+v, %v; want no previous quota and both windows, primary first", prev, next, err)
		}
		// A newer report with only the primary window keeps the secondary.
		prim2 := prim
		prim2.UsedPercent = 91.5
		if _, _, err := qs.PutQuota(ctx, Quota{Key: key, PlanType: "pro", Windows: []QuotaWindow{prim2}, ReportedAt: t0.Add(time.Minute), AgentID: "a-2"}); err != nil {
			t.Fatal(err)
		}
		// An older report (from a slow agent) changes nothing.
		prim3 := prim
		prim3.UsedPercent = 1
		prev, _, err = qs.PutQuota(ctx, Quota{Key: key, Windows: []QuotaWindow{prim3}, ReportedAt: t0.Add(30 * time.Second), AgentID: "a-3"})
		if err != nil || prev.AgentID != "a-2" || len(prev.Windows) != 2 || prev.Windows[0].UsedPercent != 91.5 {
			t.Fatalf("PutQuota of an older report: previous %+v, %v; want a-2's, 91.5%% primary", prev, err)
		}
		if _, _, err := qs.PutQuota(ctx, Quota{Key: key2, PlanType: "plus", LimitReached: true, ReportedAt: t0}); err != nil {
			t.Fatal(err)
		}
		all, err := qs.Quotas(ctx, "")
		if err != nil || len(all) != 2 || all[0].Key != key || all[1].Key != key2 {
			t.Fatalf("Quotas = %+v, %v; want %s then %s", all, err, key, key2)
		}
		q := all[0]
		if q.PlanType != "pro" || q.AgentID != "a-2" || !q.ReportedAt.Equal(t0.Add(time.Minute)) || len(q.Windows) != 2 {
			t.Fatalf("quota = %+v; want a-2's report of both windows", q)
		}
		p, s2 := q.Windows[0], q.Windows[1]
		if p.UsedPercent != 91.5 || p.Window != 5*time.Hour || !p.ResetsAt.Equal(reset) || !p.ReportedAt.Equal(t0.Add(time.Minute)) {
			t.Errorf("primary = %+v; want 91.5%% of 5h resetting at +5h, reported at +1m", p)
		}
		if s2.UsedPercent != 29 || !s2.ReportedAt.Equal(t0) {
			t.Errorf("secondary = %+v; want the first report's 29%%", s2)
		}
		one, err := qs.Quotas(ctx, key2)
		if err != nil || len(one) != 1 || !one[0].LimitReached || one[0].PlanType != "plus" {
			t.Errorf("Quotas(%s) = %+v, %v; want its limit-reached quota", key2, one, err)
		}
	})
}
