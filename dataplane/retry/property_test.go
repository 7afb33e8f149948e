package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// TestPropertyScheduleFitsDeadlines: when every attempt fails at once (so nothing resets the
// idle deadline), every attempt starts strictly before both deadlines, no more than
// MaxRetries+1 budgeted attempts run, each gap is the one the class prescribes (worked out
// here from the rules, not by calling the package), and Do ends with the last failure's error.
func TestPropertyScheduleFitsDeadlines(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		idle := time.Duration(rapid.IntRange(1_000, 600_000).Draw(t, "idle_ms")) * time.Millisecond
		total := time.Duration(rapid.IntRange(1_000, 900_000).Draw(t, "total_ms")) * time.Millisecond
		retries := rapid.IntRange(0, 10).Draw(t, "retries")
		rnd := rapid.Float64Range(0, 0.999999).Draw(t, "rand")
		type step struct {
			class Class
			hint  time.Duration
		}
		steps := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) step {
			return step{
				class: rapid.SampledFrom([]Class{Replace, Backoff, Throttled, Refused}).Draw(t, "class"),
				hint:  time.Duration(rapid.IntRange(0, 120_000).Draw(t, "hint_ms")) * time.Millisecond,
			}
		}), 1, 30).Draw(t, "steps")

		clk := newFakeClock()
		type seen struct {
			at   time.Duration
			a    Attempt
			fail *Failure
		}
		var log []seen
		err := Do(context.Background(), Config{Budget: budget(idle, total, retries), Clock: clk, Rand: fixedRand(rnd)},
			func(ctx context.Context, a Attempt) error {
				if len(log) > 2*(retries+1) {
					t.Fatalf("runaway: %d attempts for %d retries", len(log)+1, retries)
				}
				s := steps[len(log)%len(steps)]
				f := &Failure{Class: s.class, Hint: s.hint, Err: fmt.Errorf("failure %d", len(log))}
				log = append(log, seen{at: clk.since(), a: a, fail: f})
				return f
			})

		limit := min(idle, total)
		for i, s := range log {
			if s.at >= limit {
				t.Fatalf("attempt %d starts at %v, not before the deadline %v", i, s.at, limit)
			}
			if s.a.N > retries {
				t.Fatalf("attempt %d has N = %d > MaxRetries %d", i, s.a.N, retries)
			}
			if i == 0 {
				if s.at != 0 || s.a.N != 0 || s.a.Replacement {
					t.Fatalf("first attempt = %+v at %v, want N 0 at 0", s.a, s.at)
				}
				continue
			}
			prev := log[i-1]
			gap := s.at - prev.at
			if prev.fail.Class == Replace && !prev.a.Replacement {
				if !s.a.Replacement || s.a.N != prev.a.N || gap != 0 {
					t.Fatalf("after a Replace failure: attempt %+v after %v, want the same N replaced at once", s.a, gap)
				}
				continue
			}
			if s.a.Replacement || s.a.N != prev.a.N+1 {
				t.Fatalf("attempt %d = %+v after %+v, want N %d, no replacement", i, s.a, prev.a, prev.a.N+1)
			}
			r := s.a.N
			// Replace here is a replacement's own failure: treated as Backoff
			want := modelWait(prev.fail.Class, r, prev.fail.Hint, rnd)
			if gap != want {
				t.Fatalf("gap before attempt %d (retry %d after %v hint %v) = %v, want %v", i, r, prev.fail.Class, prev.fail.Hint, gap, want)
			}
		}
		// Do stopped: either the retries ran out, or the next wait would reach a deadline.
		end := log[len(log)-1]
		if end.fail.Class == Replace && !end.a.Replacement {
			t.Fatalf("Do stopped after a Replace failure of a budgeted attempt: %+v", end.a)
		}
		if end.a.N < retries {
			next := modelWait(end.fail.Class, end.a.N+1, end.fail.Hint, rnd)
			if end.at+next < limit {
				t.Fatalf("Do stopped at %v with %d retries left although the next wait %v ends at %v, before the deadline %v",
					end.at, retries-end.a.N, next, end.at+next, limit)
			}
		}
		last := end.fail
		if !errors.Is(err, last.Err) {
			t.Fatalf("Do() = %v, want it to wrap the last failure %v", err, last.Err)
		}
		if errors.Is(err, ErrIdleTimeout) || errors.Is(err, ErrTotalTimeout) {
			t.Fatalf("Do() = %v: a deadline expired, but every wait should have stopped short of it", err)
		}
	})
}

// modelWait is the wait before retry r (1-based) written out from the rules: the ladder
// 2000·2^(r−1) ms; a refusal's hint in [1 s, 60 s]; a throttle's max(rung, min(hint, 60 s))
// with rnd's share of 25 % on top. A Replace failure reaching it is a replacement's, so Backoff.
func modelWait(c Class, r int, hint time.Duration, rnd float64) time.Duration {
	rung := time.Duration(2000<<(r-1)) * time.Millisecond
	switch c {
	case Replace, Backoff:
		return rung
	case Refused:
		return min(max(hint, time.Second), 60*time.Second)
	case Throttled:
		return time.Duration(float64(max(rung, min(hint, 60*time.Second))) * (1 + 0.25*rnd))
	}
	return -1 // Fatal and unknown classes never wait
}
