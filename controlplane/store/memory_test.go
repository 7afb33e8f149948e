package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const (
	key  = "acct_0123456789abcdef"
	key2 = "acct_fedcba9876543210"
)

func open(t *testing.T, dir string) *Memory {
	t.Helper()
	m, err := Open(Options{Dir: dir, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return m
}

func admit(t *testing.T, m *Memory, key string, now time.Time) Admission {
	t.Helper()
	a, err := m.Admit(t.Context(), key, now)
	if err != nil {
		t.Fatalf("Admit: %v", err)
	}
	return a
}

// With the default policy (60/min, burst 10, bound 4833ms) ten requests at
// one instant are admitted, the next four wait 1..4 s, and the fifteenth
// (5 s > bound) is refused with a 4 s hint and nothing debited.
func TestAdmitDefaultPolicy(t *testing.T) {
	m := open(t, "")
	for i := range 10 {
		a := admit(t, m, key, t0)
		if a.Decision.Kind != pacing.KindAdmit || a.Reservation != 0 || a.PolicyVersion != 0 {
			t.Fatalf("admission %d = %+v, want admit without reservation, version 0", i+1, a)
		}
	}
	for i := 1; i <= 4; i++ {
		a := admit(t, m, key, t0)
		if a.Decision.Kind != pacing.KindWait || a.Decision.Wait != time.Duration(i)*time.Second || a.Reservation == 0 {
			t.Fatalf("admission %d = %+v, want wait %ds with a reservation", 10+i, a, i)
		}
	}
	a := admit(t, m, key, t0)
	if a.Decision.Kind != pacing.KindRefuse || a.Decision.RetryAfter != 4*time.Second || a.Decision.Debited || a.Reservation != 0 {
		t.Fatalf("admission 15 = %+v, want refuse, retry after 4s, nothing debited", a)
	}
	acct, err := m.Account(t.Context(), key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if acct.Tokens != -4 || acct.Custom || acct.Policy.RatePerMinute != 60 {
		t.Errorf("Account = %+v, want tokens -4, default policy", acct)
	}
}

func TestCancelRefundsOncePendingOnly(t *testing.T) {
	m := open(t, "")
	for range 10 {
		admit(t, m, key, t0)
	}
	w1 := admit(t, m, key, t0) // waits 1s
	w2 := admit(t, m, key, t0) // waits 2s
	if w1.Reservation == 0 || w2.Reservation == 0 || w1.Reservation == w2.Reservation {
		t.Fatalf("reservations = %d, %d; want two distinct non-zero ids", w1.Reservation, w2.Reservation)
	}
	tokens := func(now time.Time) float64 {
		a, err := m.Account(t.Context(), key, now)
		if err != nil {
			t.Fatal(err)
		}
		return a.Tokens
	}
	ctx := t.Context()

	// w2 is pending: the first cancel refunds, the second does not.
	if ok, _ := m.Cancel(ctx, key, w2.Reservation, t0); !ok {
		t.Error("Cancel(pending) = false, want true")
	}
	if got := tokens(t0); got != -1 {
		t.Errorf("tokens after refund = %v, want -1", got)
	}
	if ok, _ := m.Cancel(ctx, key, w2.Reservation, t0); ok {
		t.Error("second Cancel = true, want false")
	}
	if got := tokens(t0); got != -1 {
		t.Errorf("tokens after second cancel = %v, want -1", got)
	}

	// w1 departs at t0+1s: cancelling it then refunds nothing.
	later := t0.Add(time.Second)
	if ok, _ := m.Cancel(ctx, key, w1.Reservation, later); ok {
		t.Error("Cancel(departed) = true, want false")
	}
	// Unknown id, id 0 and unknown account.
	for _, tt := range []struct {
		key string
		id  uint64
	}{{key, 999}, {key, 0}, {"acct_ffffffffffffffff", w1.Reservation}} {
		if ok, _ := m.Cancel(ctx, tt.key, tt.id, t0); ok {
			t.Errorf("Cancel(%s, %d) = true, want false", tt.key, tt.id)
		}
	}
}

func TestPendingIsForgottenAfterDeparture(t *testing.T) {
	m := open(t, "")
	for range 14 {
		admit(t, m, key, t0)
	}
	sh := m.shard(key)
	if n := len(sh.accounts[key].pending); n != 4 {
		t.Fatalf("pending = %d, want 4", n)
	}
	admit(t, m, key, t0.Add(time.Hour))
	if n := len(sh.accounts[key].pending); n != 0 {
		t.Errorf("pending after departures = %d, want 0", n)
	}
}

func TestUpdatePolicyPersistsAcrossOpen(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	acct, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		if p.RatePerMinute != 60 || p.Burst != 10 {
			t.Errorf("update got %+v, want the default policy", p)
		}
		p.RatePerMinute, p.Burst = 120, 20
		return p, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if acct.PolicyVersion != 1 || !acct.Custom || acct.Tokens != 20 {
		t.Errorf("UpdatePolicy = %+v, want version 1, custom, 20 tokens", acct)
	}
	if _, err := m.UpdatePolicy(t.Context(), "acct_1111111111111111", t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = 0
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
	if a := admit(t, m, key, t0); a.PolicyVersion != 1 {
		t.Errorf("Admit.PolicyVersion = %d, want 1", a.PolicyVersion)
	}

	fi, err := os.Stat(filepath.Join(dir, PolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("policy file mode = %v, want 0600", fi.Mode().Perm())
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if got := strings.Join(names, " "); got != PolicyFile+" "+PolicyFile+".bak" {
		t.Errorf("data dir holds %q, want only the policy file and its last good copy (no temp files left)", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, PolicyFile+".bak")); len(b) == 0 {
		t.Error("the last good copy is empty")
	} else if fi, err := os.Stat(filepath.Join(dir, PolicyFile+".bak")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("last good copy: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}

	m2 := open(t, dir)
	got, err := m2.Account(t.Context(), key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Policy.RatePerMinute != 120 || got.Policy.Burst != 20 || got.PolicyVersion != 1 || !got.Custom {
		t.Errorf("after reopen = %+v, want 120/min burst 20 version 1", got)
	}
	if got.Policy.Budget.WaitBound != 4833*time.Millisecond {
		t.Errorf("after reopen wait bound = %v, want 4.833s", got.Policy.Budget.WaitBound)
	}
	if v := m2.Version(); v != 2 {
		t.Errorf("Version after reopen = %d, want 2", v)
	}
	acct2, err := m2.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) { return p, nil })
	if err != nil || acct2.PolicyVersion != 3 {
		t.Errorf("next update version = %d, %v; want 3", acct2.PolicyVersion, err)
	}
}

func TestUpdatePolicyErrorChangesNothing(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	boom := errors.New("boom")
	_, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) { return p, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("UpdatePolicy error = %v, want boom", err)
	}
	if _, err := m.Account(t.Context(), key, t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Account after failed update: %v, want ErrNotFound", err)
	}
	if m.Version() != 0 {
		t.Errorf("Version = %d, want 0", m.Version())
	}
}

func TestUpdatePolicyWriteFailureChangesNothing(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	// A directory in the policy file's place makes the rename fail, even as root.
	if err := os.MkdirAll(filepath.Join(dir, PolicyFile, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) { return p, nil })
	if err == nil {
		t.Fatal("UpdatePolicy succeeded although the policy file cannot be replaced")
	}
	if _, err := m.Account(t.Context(), key, t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Account after failed write: %v, want ErrNotFound", err)
	}
	if m.Version() != 0 {
		t.Errorf("Version after failed write = %d, want 0", m.Version())
	}
}

func TestOpenBadPolicyFile(t *testing.T) {
	tests := []struct {
		name    string
		content string
		want    string
	}{
		{"not json", "{", "parse policy file"},
		{"unknown field", `{"format":1,"version":1,"accounts":{},"extra":1}`, "unknown field"},
		{"bad format", `{"format":7,"version":0,"accounts":{}}`, "format 7 is not supported"},
		{"rate out of range", `{"format":1,"version":1,"accounts":{"acct_0123456789abcdef":{"version":1,"rate_per_minute":601,"burst":10,"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`, "rate_per_minute 601 is out of range; allowed 0..600"},
		{"bad key", `{"format":1,"version":1,"accounts":{"bad key":{"version":1,"rate_per_minute":60,"burst":10,"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`, "allowed printable ASCII"},
		{"inconsistent budget", `{"format":1,"version":1,"accounts":{"acct_0123456789abcdef":{"version":1,"rate_per_minute":60,"burst":10,"idle_timeout_ms":10000,"total_timeout_ms":600000,"max_retries":5}}}`, "max_retries=5 is inconsistent"},
		{"version ahead", `{"format":1,"version":1,"accounts":{"acct_0123456789abcdef":{"version":5,"rate_per_minute":60,"burst":10,"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`, "version 5 is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, PolicyFile), []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(Options{Dir: dir})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestPolicyFileShape(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	if _, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = 30
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, PolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := `{"accounts":{"acct_0123456789abcdef":{"adaptive":true,"burst":10,"idle_timeout_ms":120000,"max_retries":5,"rate_per_minute":30,"total_timeout_ms":600000,"version":1}},"format":1,"version":1}`
	if g, _ := json.Marshal(got); string(g) != want {
		t.Errorf("policy file = %s\nwant %s", g, want)
	}
}

func TestAccountsSortedAndNotFound(t *testing.T) {
	m := open(t, "")
	for _, k := range []string{"acct_c", "acct_a", "acct_b"} {
		admit(t, m, k, t0)
	}
	accts, err := m.Accounts(t.Context(), t0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, a := range accts {
		keys = append(keys, a.Key)
	}
	if got := strings.Join(keys, ","); got != "acct_a,acct_b,acct_c" {
		t.Errorf("Accounts keys = %s, want acct_a,acct_b,acct_c", got)
	}
	if _, err := m.Account(t.Context(), "acct_zzz", t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Account(unknown) error = %v, want ErrNotFound", err)
	}
}

func TestValidateKey(t *testing.T) {
	for _, k := range []string{"acct_0123456789abcdef", "x", strings.Repeat("a", MaxKeyLen)} {
		if err := ValidateKey(k); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", k, err)
		}
	}
	for _, k := range []string{"", "a b", "a\nb", strings.Repeat("a", MaxKeyLen+1), "ключ"} {
		if err := ValidateKey(k); err == nil {
			t.Errorf("ValidateKey(%q) = nil, want an error", k)
		}
	}
}

// 64 goroutines over 1000 accounts: every admission is accounted for, and
// the race detector watches the shards.
func TestConcurrentAdmit(t *testing.T) {
	m := open(t, "")
	const workers, accounts, perWorker = 64, 1000, 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	debited := map[string]int{}
	for w := range workers {
		wg.Go(func() {
			local := map[string]int{}
			for i := range perWorker {
				k := fmt.Sprintf("acct_%016x", (w*perWorker+i)%accounts)
				a, err := m.Admit(context.Background(), k, t0)
				if err != nil {
					t.Error(err)
					return
				}
				if a.Decision.Debited {
					local[k]++
				}
			}
			mu.Lock()
			for k, n := range local {
				debited[k] += n
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if n := m.Len(); n != accounts {
		t.Fatalf("Len = %d, want %d", n, accounts)
	}
	for k, n := range debited {
		a, err := m.Account(t.Context(), k, t0)
		if err != nil {
			t.Fatal(err)
		}
		if want := float64(10 - n); a.Tokens != want {
			t.Errorf("%s tokens = %v after %d debits, want %v", k, a.Tokens, n, want)
		}
	}
}

func BenchmarkMemoryAdmit(b *testing.B) {
	m, _ := Open(Options{Defaults: &pacing.Policy{RatePerMinute: 600, Burst: 1000, Budget: pacing.DefaultBudget()}})
	ctx := context.Background()
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	now := t0
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		_, _ = m.Admit(ctx, keys[i%len(keys)], now)
		i++
	}
}

func BenchmarkMemoryAdmitParallel(b *testing.B) {
	m, _ := Open(Options{Defaults: &pacing.Policy{RatePerMinute: 600, Burst: 1000, Budget: pacing.DefaultBudget()}})
	ctx := context.Background()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			_, _ = m.Admit(ctx, keys[i%len(keys)], time.Now())
			i++
		}
	})
}

func TestSweep(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	admit(t, m, "acct_idle", t0) // refills to full after 1s
	for range 12 {               // two pending waits
		admit(t, m, "acct_pending", t0)
	}
	admit(t, m, "acct_custom", t0)
	if _, err := m.UpdatePolicy(t.Context(), "acct_custom", t0, func(p pacing.Policy) (pacing.Policy, error) { return p, nil }); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(t0.Add(time.Second), 10*time.Minute); n != 0 {
		t.Errorf("Sweep before the idle time forgot %d accounts, want 0", n)
	}
	later := t0.Add(10 * time.Minute)
	admit(t, m, "acct_recent", later.Add(-time.Minute))
	if n := m.Sweep(later, 10*time.Minute); n != 2 { // acct_idle, and acct_pending whose waits departed
		keys := []string{}
		accts, _ := m.Accounts(t.Context(), later)
		for _, a := range accts {
			keys = append(keys, a.Key)
		}
		t.Errorf("Sweep forgot %d accounts, want 2; left %v", n, keys)
	}
	for _, k := range []string{"acct_custom", "acct_recent"} {
		if _, err := m.Account(t.Context(), k, later); err != nil {
			t.Errorf("Account(%s) after Sweep: %v, want kept", k, err)
		}
	}
}

func TestRunSweeps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, err := Open(Options{SweepEvery: time.Minute, SweepIdle: 5 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Admit(t.Context(), key, time.Now()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- m.Run(ctx) }()
		time.Sleep(4 * time.Minute)
		synctest.Wait()
		if n := m.Len(); n != 1 {
			t.Errorf("Len after 4m = %d, want 1 (not idle long enough)", n)
		}
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		if n := m.Len(); n != 0 {
			t.Errorf("Len after 6m = %d, want 0 (swept)", n)
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	})
}

// During the cold start after Open a new bucket starts empty: at the default
// 60/min the first four requests wait 1..4 s for the refill and the fifth
// would wait 5 s > the 4833 ms bound, so it is refused. After the cold start a new
// account's bucket starts full again.
func TestColdStartBucketsStartEmpty(t *testing.T) {
	m, err := Open(Options{ColdStart: time.Minute, Now: func() time.Time { return t0 }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 4; i++ {
		a := admit(t, m, key, t0)
		if a.Decision.Kind != pacing.KindWait || a.Decision.Wait != time.Duration(i)*time.Second {
			t.Fatalf("cold admission %d = %+v, want wait %ds", i, a, i)
		}
	}
	if a := admit(t, m, key, t0); a.Decision.Kind != pacing.KindRefuse {
		t.Fatalf("cold admission 5 = %+v, want refuse (5 s > 4833 ms bound)", a)
	}
	later := t0.Add(time.Minute)
	other := "acct_00000000000000ff"
	if a := admit(t, m, other, later); a.Decision.Kind != pacing.KindAdmit {
		t.Fatalf("admission after the cold start = %+v, want admit from a full bucket", a)
	}
}
