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
			name:       "configured 60: 403s lower by 0.7 at most once per 10s, quiet minutes add 6",
			configured: 60,
			steps: []step{
				{at: 0, want: 42, changed: true},                // floor(0.7*60)
				{at: 5 * time.Second, want: 42},                 // 5s after the lowering: ignored, but restarts the quiet minute
				{at: 10 * time.Second, want: 29, changed: true}, // floor(0.7*42)
				{at: 15 * time.Second, tick: true, want: 29},
				{at: 20 * time.Second, want: 20, changed: true},                            // floor(0.7*29)
				{at: 79 * time.Second, tick: true, want: 20},                               // 59s quiet
				{at: 80 * time.Second, tick: true, want: 26, changed: true},                // first full quiet minute: +6
				{at: 140 * time.Second, tick: true, want: 32, changed: true},               // +6
				{at: 260 * time.Second, tick: true, want: 44, changed: true},               // two more minutes: +12
				{at: 261 * time.Second, want: 30, changed: true},                           // floor(0.7*44)
				{at: 261*time.Second + 4*time.Minute, tick: true, want: 54, changed: true}, // 30+4*6
				{at: 261*time.Second + 9*time.Minute, tick: true, want: 60, changed: true}, // capped at configured
				{at: 261*time.Second + 20*time.Minute, tick: true, want: 60},
			},
		},
		{
			name:       "configured 5: never below 1, raise step is 1",
			configured: 5,
			steps: []step{
				{at: 0, want: 3, changed: true},                // floor(3.5)
				{at: 10 * time.Second, want: 2, changed: true}, // floor(2.1)
				{at: 20 * time.Second, want: 1, changed: true}, // floor(1.4)
				{at: 30 * time.Second, want: 1},                // max(1, floor(0.7))
				{at: 90 * time.Second, tick: true, want: 2, changed: true},
				{at: 150 * time.Second, tick: true, want: 3, changed: true},
			},
		},
		{
			name:       "configured 600: raise step is 60",
			configured: 600,
			steps: []step{
				{at: 0, want: 420, changed: true},
				{at: time.Minute, tick: true, want: 480, changed: true},
				{at: 3 * time.Minute, tick: true, want: 600, changed: true},
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
					a, c, err := m.Report403(t.Context(), key, now)
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

func setRate(t *testing.T, m *Memory, rate int) {
	t.Helper()
	if _, err := m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.RatePerMinute = rate
		return p, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// The bucket paces at the effective rate: after a 403 lowers 60 to 42 an
// empty bucket refills one token per 60/42 s, not per second.
func TestAdaptiveBucketUsesEffectiveRate(t *testing.T) {
	m := open(t, "")
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Report403(t.Context(), key, t0); err != nil {
		t.Fatal(err)
	}
	for range 10 { // burst 10
		admit(t, m, key, t0)
	}
	// 14 s later: 14*42/60 = 9.8 tokens.
	a, err := m.Account(t.Context(), key, t0.Add(14*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if a.Tokens < 9.79 || a.Tokens > 9.81 {
		t.Errorf("tokens after 14s at 42/min = %v, want 9.8", a.Tokens)
	}
}

func TestAdaptiveOffAndRateChange(t *testing.T) {
	m := open(t, "")
	// Off (the default): a 403 changes nothing.
	admit(t, m, key, t0)
	a, changed, err := m.Report403(t.Context(), key, t0)
	if err != nil || changed || a.EffectiveRate != 60 || a.Adaptive {
		t.Fatalf("Report403 with adaptive off = %d %v %v %v, want 60 false false nil", a.EffectiveRate, a.Adaptive, changed, err)
	}
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatal(err)
	}
	if a, _, _ := m.Report403(t.Context(), key, t0); a.EffectiveRate != 42 {
		t.Fatalf("effective after 403 = %d, want 42", a.EffectiveRate)
	}
	// A budget change keeps the effective rate.
	a, err = m.UpdatePolicy(t.Context(), key, t0, func(p pacing.Policy) (pacing.Policy, error) {
		p.Budget.MaxRetries = 4
		return p, nil
	})
	if err != nil || a.EffectiveRate != 42 {
		t.Fatalf("effective after a budget change = %d (%v), want 42", a.EffectiveRate, err)
	}
	// A new configured rate starts over at it.
	setRate(t, m, 100)
	if a, _ := m.Account(t.Context(), key, t0); a.EffectiveRate != 100 || !a.Adaptive {
		t.Fatalf("after set-rate 100: effective %d adaptive %v, want 100 true", a.EffectiveRate, a.Adaptive)
	}
	if a, changed, err := m.Report403(t.Context(), key, t0.Add(time.Second)); err != nil || !changed || a.EffectiveRate >= 100 {
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
	if a, changed, _ := m.Report403(t.Context(), key, t0.Add(time.Minute)); changed || a.EffectiveRate != 0 {
		t.Fatalf("403 at rate 0: effective %d changed %v, want 0 false", a.EffectiveRate, changed)
	}
}

func TestReport403UnknownAccount(t *testing.T) {
	m := open(t, "")
	if _, _, err := m.Report403(t.Context(), key, t0); !errors.Is(err, ErrNotFound) {
		t.Errorf("Report403(unknown) = %v, want ErrNotFound", err)
	}
}

func TestAdaptivePersists(t *testing.T) {
	dir := t.TempDir()
	m := open(t, dir)
	if _, err := m.SetAdaptive(t.Context(), key, true, t0); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, PolicyFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"adaptive": true`) {
		t.Errorf("policy file lacks \"adaptive\": true:\n%s", b)
	}
	m2 := open(t, dir)
	a, err := m2.Account(t.Context(), key, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Adaptive || a.EffectiveRate != 60 || a.Policy.RatePerMinute != 60 || a.PolicyVersion != 1 {
		t.Errorf("reopened account = %+v, want adaptive, 60/60, version 1", a)
	}
}
