package storetest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

func policies(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	ctx := t.Context()
	if _, err := s.Account(ctx, key, t0); !errors.Is(err, store.ErrNotFound) {
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
	if _, err := s.Account(ctx, "acct_2222222222222222", t0); !errors.Is(err, store.ErrNotFound) {
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
}

func adaptive(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	ctx := t.Context()
	if _, _, err := s.Report403(ctx, key, t0, 0); !errors.Is(err, store.ErrNotFound) {
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
		if got := Describe(mustAdmit(t, s, key, t0.Add(at))); got != want {
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
}

// An account with the default policy learns too (adaptive is on by
// default), and a policy that cannot refuse waits out a pause within the
// bound instead of refusing.
func adaptiveDefault(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	ctx := t.Context()
	if got := Describe(mustAdmit(t, s, key, t0)); got != "now" {
		t.Fatalf("Admit = %q, want now", got)
	}
	a, changed, err := s.Report403(ctx, key, t0, 0)
	if err != nil || !changed || !a.Adaptive || a.EffectiveRate != 30 || a.Custom || !a.PausedUntil.Equal(t0.Add(time.Minute)) {
		t.Fatalf("Report403 = %+v, %v, %v; want the default account adaptive at 30, paused until +60s", a, changed, err)
	}
	if got := Describe(mustAdmit(t, s, key, t0.Add(time.Second))); got != "refuse 59s deficit 59000ms" {
		t.Fatalf("Admit while paused = %q, want refuse 59s deficit 59000ms", got)
	}
	// Retries 0: the policy cannot refuse, so a paused request waits
	// the bound (idle 120 s, no retries: bound 15000 ms).
	setPolicy(t, s, key2, t0, 60, 10, nil, intp(0))
	mustAdmit(t, s, key2, t0)
	if _, _, err := s.Report403(ctx, key2, t0, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := Describe(mustAdmit(t, s, key2, t0.Add(time.Second))); got != "wait 15000ms" {
		t.Fatalf("Admit while paused, cannot refuse = %q, want wait 15000ms", got)
	}
	if got := Describe(mustAdmit(t, s, key2, t0.Add(25*time.Second))); got != "wait 5000ms" {
		t.Fatalf("Admit 5 s before the pause's end, cannot refuse = %q, want wait 5000ms", got)
	}
}

func handOver(t *testing.T, k Kind) {
	s := k.Open(t, nil, nil)
	ctx := t.Context()
	// 12 grants at the defaults: 10 tokens, then waits of 1..4 s are
	// debited, the 15th would be refused: 14 debited, 4 in debt.
	r, err := s.HandOver(ctx, key, 20, "report-1", t0)
	if err != nil || r.Duplicate || r.Debited != 14 || r.Account.Tokens != -4 {
		t.Fatalf("HandOver(20) = %+v, %v; want 14 debited, tokens -4", r, err)
	}
	if got := Describe(mustAdmit(t, s, key, t0)); got != "refuse 4s deficit 5000ms" {
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
}
