package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

func newTestHealth(t *testing.T, clk Clock, retries int) *Health {
	t.Helper()
	h, err := NewHealth(HealthConfig{FailureRetries: retries, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestNewHealth(t *testing.T) {
	for in, want := range map[int]int{0: DefaultFailureRetries, NoFailureRetries: 0, 1: 1, 3: 3, pacing.MaxMaxRetries: pacing.MaxMaxRetries} {
		h, err := NewHealth(HealthConfig{FailureRetries: in})
		if err != nil || h.FailureRetries() != want {
			t.Errorf("NewHealth(FailureRetries %d): %v, resolved %d; want %d", in, err, h.FailureRetries(), want)
		}
	}
	for _, bad := range []int{-2, pacing.MaxMaxRetries + 1} {
		if _, err := NewHealth(HealthConfig{FailureRetries: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewHealth(FailureRetries %d) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

// runWithHealth runs Do on h: attempt i returns script[i], and every attempt past the script
// succeeds.
func runWithHealth(t *testing.T, clk *fakeClock, h *Health, script []error) ([]record, error) {
	t.Helper()
	var recs []record
	err := Do(t.Context(), Config{Budget: defaultBudget, Clock: clk, Rand: fixedRand(0), Health: h, Upstream: "backend"},
		func(ctx context.Context, a Attempt) error {
			recs = append(recs, record{at: clk.since(), n: a.N, replacement: a.Replacement, waited: a.Waited})
			if i := len(recs) - 1; i < len(script) {
				return script[i]
			}
			return nil
		})
	return recs, err
}

func backoffErr(i int) error { return &Failure{Class: Backoff, Err: fmt.Errorf("server_error %d", i)} }

// TestDoWithHealth: a healthy upstream gets FailureRetries retries inside the data plane, a
// failing one none; refusals and replacements keep their own rules; a success heals.
func TestDoWithHealth(t *testing.T) {
	t.Run("persistent 5xx: one retry, then the client's turn", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		recs, err := runWithHealth(t, clk, h, repeat(10, backoffErr))
		// attempts at 0 and 2 s (the ladder's first rung); the second failure goes to the client
		if got, want := times(recs), secs(0, 2); !equalDurations(got, want) {
			t.Errorf("attempts at %v, want %v", got, want)
		}
		if err == nil || err.Error() != "retry: left to the client after 1 retries: server_error 1" {
			t.Errorf("Do() = %v, want the second failure left to the client", err)
		}
		st := h.Status("backend")
		if !st.Failing || st.Failures != 2 || !st.Since.Equal(epoch) || st.Unreachable {
			t.Errorf("status %+v, want failing since epoch with 2 failures, reachable", st)
		}
		// failing for 2 s: the next probe is due max(2 s / 4, 1 s) after the latest failure.
		if want := epoch.Add(3 * time.Second); !st.NextProbe.Equal(want) {
			t.Errorf("next probe at %v, want %v", st.NextProbe, want)
		}
		if got := h.RetryAfter("backend"); got != time.Second {
			t.Errorf("RetryAfter = %v, want 1s", got)
		}
		// The next request finds the upstream failing: one attempt, no retry.
		clk.Advance(5 * time.Second)
		recs, err = runWithHealth(t, clk, h, repeat(10, backoffErr))
		if len(recs) != 1 || err == nil {
			t.Errorf("request on a failing upstream: %d attempts, err %v; want 1 attempt and its failure", len(recs), err)
		}
		// failing for 7 s now: probe due 1.75 s after the failure at 7 s
		if got := h.RetryAfter("backend"); got != 1750*time.Millisecond {
			t.Errorf("RetryAfter = %v, want 1.75s", got)
		}
		// A success heals: the request after it has its retry again.
		if _, err := runWithHealth(t, clk, h, nil); err != nil {
			t.Fatal(err)
		}
		if st := h.Status("backend"); st.Failing {
			t.Errorf("after a success: %+v, want healthy", st)
		}
		recs, _ = runWithHealth(t, clk, h, repeat(10, backoffErr))
		if len(recs) != 2 {
			t.Errorf("after healing: %d attempts, want 2", len(recs))
		}
	})
	t.Run("a single failure is absorbed", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		recs, err := runWithHealth(t, clk, h, repeat(1, backoffErr))
		if err != nil || len(recs) != 2 {
			t.Errorf("one 5xx: %d attempts, err %v; want a successful retry", len(recs), err)
		}
		if h.Status("backend").Failing {
			t.Error("the successful retry left the upstream failing")
		}
	})
	t.Run("no failure retries", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, NoFailureRetries)
		recs, err := runWithHealth(t, clk, h, repeat(2, func(i int) error { return throttled(0, i) }))
		if len(recs) != 1 || err == nil {
			t.Errorf("%d attempts, err %v; want 1 attempt", len(recs), err)
		}
	})
	t.Run("three failure retries follow the ladder", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 3)
		recs, _ := runWithHealth(t, clk, h, repeat(10, backoffErr))
		if got, want := times(recs), secs(0, 2, 6, 14); !equalDurations(got, want) {
			t.Errorf("attempts at %v, want %v", got, want)
		}
	})
	t.Run("refusals keep every retry of the budget", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		refused := func(i int) error { return Refusal(4*time.Second, fmt.Errorf("refused %d", i)) }
		recs, _ := runWithHealth(t, clk, h, repeat(6, refused))
		if got, want := times(recs), secs(0, 4, 8, 12, 16, 20); !equalDurations(got, want) {
			t.Errorf("attempts at %v, want %v: the pacer's wait bound assumes every retry", got, want)
		}
		if h.Status("backend").Failing {
			t.Error("pacer refusals marked the upstream failing")
		}
	})
	t.Run("a replacement spends nothing; its failure does", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		repl := func(i int) error { return &Failure{Class: Replace, Err: fmt.Errorf("reused socket dropped %d", i)} }
		// replace (at once), then the replacement's failure is Backoff: one retry after 2 s,
		// replaced again at once, then left to the client.
		recs, err := runWithHealth(t, clk, h, repeat(10, repl))
		if got, want := times(recs), secs(0, 0, 2, 2); !equalDurations(got, want) {
			t.Errorf("attempts at %v, want %v", got, want)
		}
		if err == nil {
			t.Error("Do() = nil, want the failure")
		}
	})
	t.Run("an account's throttling is the account's, not the upstream's", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		on := func(acct string, script []error) ([]record, error) {
			var recs []record
			err := Do(t.Context(), Config{Budget: defaultBudget, Clock: clk, Rand: fixedRand(0), Health: h,
				Upstream: "backend", Account: acct},
				func(ctx context.Context, a Attempt) error {
					recs = append(recs, record{at: clk.since(), n: a.N})
					if i := len(recs) - 1; i < len(script) {
						return script[i]
					}
					return nil
				})
			return recs, err
		}
		throttledErr := func(i int) error { return throttled(0, i) }
		// Account A is rate limited: one retry, then its failure goes to the client.
		if recs, err := on("acct_a", repeat(10, throttledErr)); len(recs) != 2 || err == nil {
			t.Fatalf("account A: %d attempts, err %v; want 2 and the failure", len(recs), err)
		}
		if h.Status("backend").Failing {
			t.Error("one account's 429s marked the whole upstream failing")
		}
		if st := h.Status(AccountKey("backend", "acct_a")); !st.Failing || st.Failures != 2 {
			t.Errorf("account A status %+v, want failing with 2 failures", st)
		}
		// Account B still has its retry: a single 5xx is absorbed.
		if recs, err := on("acct_b", repeat(1, backoffErr)); len(recs) != 2 || err != nil {
			t.Errorf("account B: %d attempts, err %v; want the retry to succeed", len(recs), err)
		}
		// A's next request makes one attempt; the answer waits for A's probe.
		clk.Advance(time.Second)
		if recs, _ := on("acct_a", repeat(10, throttledErr)); len(recs) != 1 {
			t.Errorf("account A again: %d attempts, want 1", len(recs))
		}
		if got := h.RetryAfterAccount("backend", "acct_a"); got <= MinProbeInterval-time.Nanosecond || h.RetryAfterAccount("backend", "acct_b") != MinProbeInterval {
			t.Errorf("RetryAfterAccount: A %v, B %v; want A >= %v and B = %v", got, h.RetryAfterAccount("backend", "acct_b"), MinProbeInterval, MinProbeInterval)
		}
		// A success on A heals A.
		if _, err := on("acct_a", nil); err != nil || h.Status(AccountKey("backend", "acct_a")).Failing {
			t.Errorf("after a success on A: err %v, failing %v", err, h.Status(AccountKey("backend", "acct_a")).Failing)
		}
	})
	t.Run("fatal failures do not mark the upstream", func(t *testing.T) {
		clk := newFakeClock()
		h := newTestHealth(t, clk, 0)
		_, err := runWithHealth(t, clk, h, []error{&Failure{Class: Fatal, Err: errors.New("400")}})
		if err == nil || h.Status("backend").Failing {
			t.Errorf("err %v, failing %v; want the error and a healthy upstream", err, h.Status("backend").Failing)
		}
	})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHealthDialGate: an unreachable upstream refuses new sockets at once until the next probe
// is due; then one dial probes while the others are still refused.
func TestHealthDialGate(t *testing.T) {
	clk := newFakeClock()
	h := newTestHealth(t, clk, 0)
	refused := errors.New("dial tcp 127.0.0.1:9: connect: connection refused")

	d, err := h.Dial("backend")
	if err != nil {
		t.Fatalf("Dial on a healthy upstream: %v", err)
	}
	d.Unreachable(refused)
	d.Reached() // later settlements do nothing
	if st := h.Status("backend"); !st.Unreachable || !st.Failing {
		t.Fatalf("status %+v, want unreachable", st)
	}
	// Refused at once until the probe at +1 s, naming the cause.
	clk.Advance(500 * time.Millisecond)
	_, err = h.Dial("backend")
	var de *DownError
	if !errors.As(err, &de) || !errors.Is(err, refused) || de.RetryAfter != time.Second || !de.Since.Equal(epoch) || de.Upstream != "backend" {
		t.Fatalf("Dial before the probe = %v, want a DownError with the cause and a 1 s wait", err)
	}
	// Down tells the same without taking the probe.
	if err := h.Down("backend"); !errors.As(err, &de) || de.RetryAfter != time.Second {
		t.Fatalf("Down before the probe = %v, want the DownError Dial gives", err)
	}
	if err := h.Down("elsewhere"); err != nil {
		t.Fatalf("Down of an unknown upstream = %v, want nil", err)
	}
	clk.Advance(500 * time.Millisecond)
	for range 2 { // asking does not spend the probe
		if err := h.Down("backend"); err != nil {
			t.Fatalf("Down when the probe is due = %v, want nil", err)
		}
	}
	probe, err := h.Dial("backend")
	if err != nil {
		t.Fatalf("Dial when the probe is due: %v", err)
	}
	// While the probe is in flight the others are still refused.
	if _, err := h.Dial("backend"); !errors.As(err, &de) {
		t.Fatalf("Dial during the probe = %v, want a DownError", err)
	}
	if err := h.Down("backend"); !errors.As(err, &de) {
		t.Fatalf("Down during the probe = %v, want a DownError", err)
	}
	// The probe fails at 5 s: failing for 5 s, the next probe is 1.25 s later.
	clk.Advance(4 * time.Second)
	probe.Unreachable(refused)
	if _, err := h.Dial("backend"); !errors.As(err, &de) || de.RetryAfter != 1250*time.Millisecond {
		t.Fatalf("after a failed probe = %v, want a DownError with a 1.25 s wait", err)
	}
	if got := h.RetryAfter("backend"); got != 1250*time.Millisecond {
		t.Errorf("RetryAfter = %v, want 1.25s", got)
	}
	// The next probe reaches the backend: sockets may be opened again, but the upstream is
	// still failing (no response has succeeded) until an attempt succeeds.
	clk.Advance(1250 * time.Millisecond)
	probe, err = h.Dial("backend")
	if err != nil {
		t.Fatalf("second probe: %v", err)
	}
	probe.Reached()
	d2, err := h.Dial("backend")
	if err != nil {
		t.Fatalf("Dial after the backend answered: %v", err)
	}
	d2.Done()
	if st := h.Status("backend"); st.Unreachable || !st.Failing {
		t.Errorf("status %+v, want reachable but failing", st)
	}
	if got := h.allowance("backend"); got != 0 {
		t.Errorf("allowance = %d, want 0 until an attempt succeeds", got)
	}
	h.succeeded("backend")
	if st := h.Status("backend"); st.Failing {
		t.Errorf("after a success: %+v, want healthy", st)
	}
	// An abandoned probe lets the next request probe.
	d, _ = h.Dial("other")
	d.Unreachable(refused)
	clk.Advance(time.Second)
	probe, _ = h.Dial("other")
	probe.Done()
	if _, err := h.Dial("other"); err != nil {
		t.Errorf("Dial after an abandoned probe: %v, want a new probe", err)
	}
}

// TestHealthProbeSchedule: the probe interval is a quarter of the failing time, from 1 s up to
// 15 s, so the retry-after a client is told stays below Claude Code's own doubling delays.
func TestHealthProbeSchedule(t *testing.T) {
	clk := newFakeClock()
	h := newTestHealth(t, clk, 0)
	// failures at these offsets from the first; the wait after each, by hand: max(1 s,
	// min(15 s, (t − 0)/4))
	for _, tt := range []struct{ at, wait time.Duration }{
		{0, time.Second}, {2 * time.Second, time.Second}, {6 * time.Second, 1500 * time.Millisecond},
		{20 * time.Second, 5 * time.Second}, {60 * time.Second, 15 * time.Second}, {200 * time.Second, 15 * time.Second},
	} {
		clk.Advance(epoch.Add(tt.at).Sub(clk.Now()))
		h.failed("b", errors.New("x"))
		if got := h.RetryAfter("b"); got != tt.wait {
			t.Errorf("after a failure at %v: RetryAfter = %v, want %v", tt.at, got, tt.wait)
		}
	}
	if got := h.RetryAfter("healthy"); got != MinProbeInterval {
		t.Errorf("RetryAfter of a healthy upstream = %v, want %v", got, MinProbeInterval)
	}
}
