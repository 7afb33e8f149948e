package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// 15 simultaneous requests at the defaults (docs/pacing.md §3 and §4.2):
// 10 now, waits of 1..4 s, then a refusal with the 4 s hint.
func fifteenAtDefaults(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	var got []string
	var waits []store.Admission
	for range 15 {
		a := mustAdmit(t, s, key, t0)
		got = append(got, Describe(a))
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
}

// docs/pacing.md §5: 20 simultaneous at 1/min and 2/min (policies that
// cannot refuse): 10 now, one waits the bound, 9 past the ceiling.
func twentyAtLowRates(t *testing.T, k Kind) {
	for _, rate := range []int{1, 2} {
		s := k.Open(t, nil, nil)
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
}

func refusalThresholds(t *testing.T, k Kind) {
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
	for _, tt := range tests {
		s := k.Open(t, nil, nil)
		setPolicy(t, s, key, t0, tt.rate, 10, tt.idle, tt.retries)
		got := admitN(t, s, key, t0, 11)
		if got[10] != tt.wantEleven {
			t.Errorf("%s: 11th of 11 = %q, want %q", tt.name, got[10], tt.wantEleven)
		}
	}
}

// With retries off nothing would retry a refusal: 40 at 60/min never refuse.
func noRetriesNeverRefuses(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
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
}

// The bucket's boundaries (docs/pacing.md §3), at microsecond instants.
func boundaries(t *testing.T, k Kind) {
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
	for _, tt := range tests {
		s := k.Open(t, nil, nil)
		setPolicy(t, s, key, t0, tt.s.rate, 10, tt.s.idle, nil)
		admitN(t, s, key, t0, tt.s.takes)
		if got := Describe(mustAdmit(t, s, key, t0.Add(tt.at))); got != tt.want {
			t.Errorf("%s: Admit(t0+%v) = %q, want %q", tt.name, tt.at, got, tt.want)
		}
	}
}

// The four-minute overload of docs/pacing.md §3: 82/min offered against 60/min; the last
// minute admits 60 ± 1.
func sustainedRate(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
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
}

// A refused request that retries never deepens the deficit that refused it.
func refusalDebitsNothing(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	admitN(t, s, key, t0, 14)
	for i := range 100 {
		if a := mustAdmit(t, s, key, t0); a.Decision.Kind != pacing.KindRefuse || a.Decision.Debited {
			t.Fatalf("Admit %d = %+v, want refused without debit", i, a)
		}
	}
	if got := mustTokens(t, s, key, t0); got != -4 {
		t.Errorf("tokens after 100 refusals = %v, want -4", got)
	}
	if got := Describe(mustAdmit(t, s, key, t0.Add(167*time.Millisecond))); got != "wait 4833ms" {
		t.Errorf("Admit after 167ms = %q, want wait 4833ms", got)
	}
}

func disabledAdmitsEverything(t *testing.T, k Kind) {
	for name, p := range map[string]pacing.Policy{
		"rate 0": {RatePerMinute: 0, Burst: 10, Budget: pacing.DefaultBudget()},
		"zero bound": {RatePerMinute: 60, Burst: 10, Budget: func() pacing.Budget {
			b, _ := pacing.ResolveBudget(pacing.BudgetInput{IdleTimeout: msp(14001)})
			return b
		}()},
	} {
		s := k.Open(t, nil, &p)
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
}

func cancel(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
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
	if got := Describe(mustAdmit(t, s, key, t0)); got != "wait 2000ms" {
		t.Errorf("Admit after the cancellation = %q, want wait 2000ms", got)
	}
}
