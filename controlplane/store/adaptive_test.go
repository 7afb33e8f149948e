package store

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// step is one event of an adaptive timeline: a 403 (or, with tick, a
// periodic Adapt) at t0+at, and the effective rate expected after it.
type step struct {
	at      time.Duration
	tick    bool // Adapt instead of Report403
	want    int
	changed bool
}

func TestAdaptiveTimeline(t *testing.T) {
	tests := []struct {
		name       string
		configured int
		steps      []step
	}{
		{
			name:       "configured 60: 403s halve at most once per 10s, quiet 30s steps add 6",
			configured: 60,
			steps: []step{
				{at: 0, want: 30, changed: true},                            // floor(0.5*60), paused until +60s
				{at: 5 * time.Second, want: 30},                             // inside the pause and 5s after the lowering
				{at: 10 * time.Second, want: 15, changed: true},             // floor(0.5*30); quiet from the pause's end (+60s)
				{at: 15 * time.Second, tick: true, want: 15},                //
				{at: 89 * time.Second, tick: true, want: 15},                // 29s quiet
				{at: 90 * time.Second, tick: true, want: 21, changed: true}, // first quiet step: +6
				{at: 150 * time.Second, tick: true, want: 33, changed: true},
				{at: 151 * time.Second, want: 16, changed: true},                              // floor(0.5*33), paused until +211s
				{at: 211*time.Second + 4*30*time.Second, tick: true, want: 40, changed: true}, // 16+4*6
				{at: 211*time.Second + 9*30*time.Second, tick: true, want: 60, changed: true}, // capped at configured
				{at: 211*time.Second + 20*time.Minute, tick: true, want: 60},
			},
		},
		{
			name:       "configured 5: never below 1, raise step is 1",
			configured: 5,
			steps: []step{
				{at: 0, want: 2, changed: true},
				{at: 10 * time.Second, want: 1, changed: true},
				{at: 20 * time.Second, want: 1},
				{at: 90 * time.Second, tick: true, want: 2, changed: true},
				{at: 120 * time.Second, tick: true, want: 3, changed: true},
			},
		},
		{
			name:       "configured 600: raise step is 60",
			configured: 600,
			steps: []step{
				{at: 0, want: 300, changed: true},
				{at: 90 * time.Second, tick: true, want: 360, changed: true},
				{at: 180 * time.Second, tick: true, want: 540, changed: true},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := open(t, "")
			setRate(t, m, tt.configured)
			if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
				t.Fatal(err)
			}
			for _, s := range tt.steps {
				now := t0.Add(s.at)
				var got int
				var changed bool
				if s.tick {
					accts, err := m.Adapt(t.Context(), now)
					if err != nil {
						t.Fatal(err)
					}
					changed = len(accts) == 1
					a, err := m.Account(t.Context(), key, now)
					if err != nil {
						t.Fatal(err)
					}
					got = a.EffectiveRate
				} else {
					a, c, err := m.Report403(t.Context(), key, now, 0)
					if err != nil {
						t.Fatal(err)
					}
					got, changed = a.EffectiveRate, c
				}
				if got != s.want || changed != s.changed {
					t.Fatalf("at +%v (tick %v): effective %d changed %v, want %d changed %v", s.at, s.tick, got, changed, s.want, s.changed)
				}
			}
			a, err := m.Account(t.Context(), key, t0)
			if err != nil {
				t.Fatal(err)
			}
			if a.Policy.RatePerMinute != tt.configured || !a.Adaptive {
				t.Errorf("Account = configured %d adaptive %v, want %d true", a.Policy.RatePerMinute, a.Adaptive, tt.configured)
			}
		})
	}
}

// The learned pause: 60 s first, doubled (up to 4 min) by a 403 that comes
// within it after a pause ended, back to 60 s once the rate has recovered.
func TestAdaptiveLearnedPause(t *testing.T) {
	m := open(t, "")
	admit(t, m, key, t0)
	at := time.Duration(0)
	want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 4 * time.Minute}
	for i, w := range want {
		a, changed, err := m.Report403(t.Context(), key, t0.Add(at), 0)
		if err != nil || !changed {
			t.Fatalf("403 %d: changed %v, %v", i, changed, err)
		}
		if got := a.PausedUntil.Sub(t0.Add(at)); got != w {
			t.Fatalf("403 %d at +%v: pause %v, want %v", i, at, got, w)
		}
		at += w + time.Second // the next 403 comes 1 s after the pause ends
	}
	// Recovery (effective back at 60) forgets the learned interval.
	a, err := m.Account(t.Context(), key, t0.Add(at+time.Hour))
	if err != nil || a.EffectiveRate != 60 {
		t.Fatalf("an hour later: %+v, %v; want 60", a, err)
	}
	a, _, err = m.Report403(t.Context(), key, t0.Add(at+time.Hour), 0)
	if err != nil || a.PausedUntil.Sub(t0.Add(at+time.Hour)) != time.Minute {
		t.Fatalf("after recovery: paused until %v, %v; want 60 s", a.PausedUntil, err)
	}
}

func setRate(t *testing.T, m *Memory, rate int) {
	t.Helper()
	if _, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = rate
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The bucket paces at the effective rate: after a 403 lowers 60 to 30 an
// empty bucket refills one token per 2 s, not per second.
func TestAdaptiveBucketUsesEffectiveRate(t *testing.T) {
	m := open(t, "")
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatal(err)
	}
	for range 10 { // burst 10
		admit(t, m, key, t0)
	}
	if _, _, err := m.Report403(t.Context(), key, t0, 0); err != nil {
		t.Fatal(err)
	}
	// 14 s later: 14*30/60 = 7 tokens.
	a, err := m.Account(t.Context(), key, t0.Add(14*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if a.Tokens != 7 {
		t.Errorf("tokens after 14s at 30/min = %v, want 7", a.Tokens)
	}
}

func TestAdaptiveOffAndRateChange(t *testing.T) {
	m := open(t, "")
	admit(t, m, key, t0)
	// Switched off: a 403 changes nothing.
	if _, err := m.SetAdaptive(t.Context(), key, false, t0); err != nil {
		t.Fatal(err)
	}
	a, changed, err := m.Report403(t.Context(), key, t0, 0)
	if err != nil || changed || a.EffectiveRate != 60 || a.Adaptive || !a.PausedUntil.IsZero() {
		t.Fatalf("Report403 with adaptive off = %d %v %v %v %v, want 60 false false not paused nil", a.EffectiveRate, a.Adaptive, changed, a.PausedUntil, err)
	}
	if got := admit(t, m, key, t0); got.Decision.Kind != pacing.KindAdmit {
		t.Fatalf("Admit after a 403 with adaptive off = %v, want admit", got.Decision.Kind)
	}
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatal(err)
	}
	if a, _, _ := m.Report403(t.Context(), key, t0, 0); a.EffectiveRate != 30 {
		t.Fatalf("effective after 403 = %d, want 30", a.EffectiveRate)
	}
	// A budget change keeps the effective rate.
	a, err = m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.Budget.MaxRetries = 4
		return p, nil
	})
	if err != nil || a.EffectiveRate != 30 {
		t.Fatalf("effective after a budget change = %d (%v), want 30", a.EffectiveRate, err)
	}
	// A new configured rate starts over at it.
	setRate(t, m, 100)
	if a, _ := m.Account(t.Context(), key, t0); a.EffectiveRate != 100 || !a.Adaptive {
		t.Fatalf("after set-rate 100: effective %d adaptive %v, want 100 true", a.EffectiveRate, a.Adaptive)
	}
	if a, changed, err := m.Report403(t.Context(), key, t0.Add(time.Second), 0); err != nil || !changed || a.EffectiveRate >= 100 {
		t.Fatalf("403 at rate 100: effective %d changed %v (%v), want below 100, changed", a.EffectiveRate, changed, err)
	}
	// Turning it off restores the configured rate.
	a, err = m.SetAdaptive(t.Context(), key, false, t0.Add(2*time.Second))
	if err != nil || a.EffectiveRate != 100 || a.Adaptive {
		t.Fatalf("SetAdaptive(off) = %d %v (%v), want 100 false", a.EffectiveRate, a.Adaptive, err)
	}
	// Rate 0 (pacing off) is never adapted.
	setRate(t, m, 0)
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatalf("SetAdaptive(on) at rate 0: %v", err)
	}
	if a, changed, _ := m.Report403(t.Context(), key, t0.Add(time.Minute), 0); changed || a.EffectiveRate != 0 {
		t.Fatalf("403 at rate 0: effective %d changed %v, want 0 false", a.EffectiveRate, changed)
	}
}

func TestReport403UnknownAccount(t *testing.T) {
	m := open(t, "")
	if _, _, err := m.Report403(t.Context(), key, t0, 0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Report403(unknown) = %v, want ErrNotFound", err)
	}
}

func TestAdaptivePersists(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	if _, err := m.SetAdaptive(t.Context(), key, false, t0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, PolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"adaptive": false`) {
		t.Errorf("policy file lacks \"adaptive\": false:\n%s", b)
	}
	m2 := open(t, dir)
	a, err := m2.Account(t.Context(), key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if a.Adaptive || a.EffectiveRate != 60 || a.Policy.RatePerMinute != 60 || a.PolicyVersion != 1 {
		t.Errorf("reopened account = %+v, want adaptive off, 60/60, version 1", a)
	}
}

// A policy file written before adaptive mode was the default has no
// "adaptive" field: its accounts learn the throttle too.
func TestAdaptiveMissingFieldIsDefault(t *testing.T) {
	dir := t.TempDir()
	old := `{"format": 1, "version": 3, "accounts": {"` + key + `": {"version": 3, "rate_per_minute": 40, "burst": 5,
		"idle_timeout_ms": 120000, "total_timeout_ms": 600000, "max_retries": 5}}}`
	if err := os.WriteFile(filepath.Join(dir, PolicyFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := open(t, dir).Account(t.Context(), key, t0)
	if err != nil || !a.Adaptive || a.Policy.RatePerMinute != 40 {
		t.Fatalf("account from an old file = %+v, %v; want adaptive at 40", a, err)
	}
	bad := strings.Replace(old, `"burst": 5`, `"burst": 5, "brust": 1`, 1)
	if err := os.WriteFile(filepath.Join(dir, PolicyFile), []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "brust") {
		t.Errorf("Open with an unknown field = %v, want an error naming it", err)
	}
}
