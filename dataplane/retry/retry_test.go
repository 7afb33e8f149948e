package retry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// record is what an attempt saw.
type record struct {
	at          time.Duration // since epoch
	n           int
	replacement bool
	waited      time.Duration
}

// runScript runs Do on a fake clock; attempt i returns script[i], and every attempt past the
// script succeeds.
func runScript(t *testing.T, budget pacing.Budget, rnd float64, script []error) ([]record, error) {
	t.Helper()
	clk := newFakeClock()
	var recs []record
	err := Do(t.Context(), Config{Budget: budget, Clock: clk, Rand: fixedRand(rnd)}, func(ctx context.Context, a Attempt) error {
		recs = append(recs, record{at: clk.since(), n: a.N, replacement: a.Replacement, waited: a.Waited})
		i := len(recs) - 1
		if i >= 50 {
			t.Errorf("runaway: %d attempts", i+1)
			return errors.New("runaway")
		}
		if i > 0 && a.Previous == nil {
			t.Errorf("attempt %d: Previous = nil, want the failure that led to it", i)
		}
		if i < len(script) {
			return script[i]
		}
		return nil
	})
	return recs, err
}

func times(recs []record) []time.Duration {
	var out []time.Duration
	for _, r := range recs {
		out = append(out, r.at)
	}
	return out
}

func secs(fs ...float64) []time.Duration {
	var out []time.Duration
	for _, f := range fs {
		out = append(out, sec(f))
	}
	return out
}

func throttled(hint time.Duration, i int) error {
	return &Failure{Class: Throttled, Hint: hint, Err: fmt.Errorf("throttle %d", i)}
}

func repeat(n int, f func(i int) error) []error {
	var out []error
	for i := range n {
		out = append(out, f(i))
	}
	return out
}

// budget returns a budget with the given idle and total timeouts and retries.
func budget(idle, total time.Duration, retries int) pacing.Budget {
	return pacing.Budget{IdleTimeout: idle, TotalTimeout: total, MaxRetries: retries}
}

var defaultBudget = budget(120*time.Second, 600*time.Second, 5)

// TestDoSchedule asserts the attempt times; every expected time is worked out by hand in the
// row's comment.
func TestDoSchedule(t *testing.T) {
	backoff := func(i int) error { return &Failure{Class: Backoff, Err: fmt.Errorf("transport %d", i)} }
	refused := func(hint time.Duration) func(int) error {
		return func(i int) error { return &Failure{Class: Refused, Hint: hint, Err: fmt.Errorf("refused %d", i)} }
	}
	tests := []struct {
		name      string
		budget    pacing.Budget
		rand      float64
		script    []error
		wantTimes []time.Duration
		wantN     []int
		wantErr   error // nil: success
	}{
		{
			// waits max(2,5)·1.125 = 5.625, max(4,5)·1.125 = 5.625, max(8,5)·1.125 = 9
			name: "three throttled 403s, hint 5s, rand 0.5", budget: defaultBudget, rand: 0.5,
			script:    repeat(3, func(i int) error { return throttled(5*time.Second, i) }),
			wantTimes: secs(0, 5.625, 11.25, 20.25), wantN: []int{0, 1, 2, 3},
		},
		{
			// waits max(2,5) = 5, max(4,5) = 5, max(8,5) = 8
			name: "three throttled 403s, hint 5s, rand 0", budget: defaultBudget, rand: 0,
			script:    repeat(3, func(i int) error { return throttled(5*time.Second, i) }),
			wantTimes: secs(0, 5, 10, 18), wantN: []int{0, 1, 2, 3},
		},
		{
			// no hint: max(rung, 0) = rung, and rand 0 adds no jitter: 2, 4, 8
			name: "throttled, no hint, rand 0: plain ladder", budget: defaultBudget, rand: 0,
			script:    repeat(3, func(i int) error { return throttled(0, i) }),
			wantTimes: secs(0, 2, 6, 14), wantN: []int{0, 1, 2, 3},
		},
		{
			// waits min(hint 300, 60) = 60, then 60 → 120 is not before the idle deadline at 120
			name: "throttled hint above 60s is clamped and stops at the idle deadline", budget: defaultBudget,
			script:    repeat(6, func(i int) error { return throttled(300*time.Second, i) }),
			wantTimes: secs(0, 60), wantN: []int{0, 1}, wantErr: errors.New("throttle 1"),
		},
		{
			// exactly the hint: 0, 4, 8, 12, 16, 20; the sixth failure spends no seventh attempt
			name: "refusals with hint 4s at the default budget", budget: defaultBudget,
			script:    repeat(6, refused(4*time.Second)),
			wantTimes: secs(0, 4, 8, 12, 16, 20), wantN: []int{0, 1, 2, 3, 4, 5}, wantErr: errors.New("refused 5"),
		},
		{
			// a refusal's zero hint is floored at 1 s, a 90 s one capped at 60 s
			name: "refusal hints floored at 1s and capped at 60s", budget: defaultBudget,
			script:    []error{refused(0)(0), refused(90 * time.Second)(1)},
			wantTimes: secs(0, 1, 61), wantN: []int{0, 1, 2},
		},
		{
			// rungs 2, 4, 8, 16, 32
			name: "transport failures walk the ladder", budget: defaultBudget,
			script:    repeat(6, backoff),
			wantTimes: secs(0, 2, 6, 14, 30, 62), wantN: []int{0, 1, 2, 3, 4, 5}, wantErr: errors.New("transport 5"),
		},
		{
			// refused 4 → wait 4; backoff → rung 2 = 4; throttled hint 5 → max(rung 3 = 8, 5) = 8
			name: "mixed classes use the retry number for the rung", budget: defaultBudget,
			script:    []error{refused(4 * time.Second)(0), backoff(1), throttled(5*time.Second, 2)},
			wantTimes: secs(0, 4, 8, 16), wantN: []int{0, 1, 2, 3},
		},
		{
			// 0, 2, 6, 14; the next wait (16) would end at 30 ≥ 20
			name: "a wait that would pass the idle deadline stops early", budget: budget(20*time.Second, 600*time.Second, 5),
			script:    repeat(6, backoff),
			wantTimes: secs(0, 2, 6, 14), wantN: []int{0, 1, 2, 3}, wantErr: errors.New("transport 3"),
		},
		{
			// 0, 2, 6, 14; the next wait (16) would end at 30 ≥ the total 25
			name: "a wait that would pass the total deadline stops early", budget: budget(120*time.Second, 25*time.Second, 5),
			script:    repeat(6, backoff),
			wantTimes: secs(0, 2, 6, 14), wantN: []int{0, 1, 2, 3}, wantErr: errors.New("transport 3"),
		},
		{
			// the wait of 8 ending exactly at the 14 s deadline is not started
			name: "a wait ending exactly at the idle deadline is not started", budget: budget(14*time.Second, 600*time.Second, 5),
			script:    repeat(6, backoff),
			wantTimes: secs(0, 2, 6), wantN: []int{0, 1, 2}, wantErr: errors.New("transport 2"),
		},
		{
			name: "no retries: one attempt", budget: budget(120*time.Second, 600*time.Second, 0),
			script:    repeat(2, backoff),
			wantTimes: secs(0), wantN: []int{0}, wantErr: errors.New("transport 0"),
		},
		{
			name: "fatal: no retry", budget: defaultBudget,
			script:    []error{&Failure{Class: Fatal, Err: errors.New("bad request")}},
			wantTimes: secs(0), wantN: []int{0}, wantErr: errors.New("bad request"),
		},
		{
			name: "a plain error is fatal", budget: defaultBudget,
			script:    []error{errors.New("after output")},
			wantTimes: secs(0), wantN: []int{0}, wantErr: errors.New("after output"),
		},
		{
			name: "a wrapped failure is classified", budget: defaultBudget,
			script:    []error{fmt.Errorf("read frame: %w", backoff(0))},
			wantTimes: secs(0, 2), wantN: []int{0, 1},
		},
		{
			name: "zero budget means the default budget", budget: pacing.Budget{},
			script:    repeat(6, backoff),
			wantTimes: secs(0, 2, 6, 14, 30, 62), wantN: []int{0, 1, 2, 3, 4, 5}, wantErr: errors.New("transport 5"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := runScript(t, tt.budget, tt.rand, tt.script)
			if got := times(recs); !slices.Equal(got, tt.wantTimes) {
				t.Errorf("attempt times = %v, want %v", got, tt.wantTimes)
			}
			var gotN []int
			for _, r := range recs {
				gotN = append(gotN, r.n)
			}
			if !slices.Equal(gotN, tt.wantN) {
				t.Errorf("attempt numbers = %v, want %v", gotN, tt.wantN)
			}
			switch {
			case tt.wantErr == nil && err != nil:
				t.Errorf("Do() = %v, want nil", err)
			case tt.wantErr != nil && err == nil:
				t.Errorf("Do() = nil, want the error %q", tt.wantErr)
			case tt.wantErr != nil && !errors.Is(err, scriptErr(tt.script, tt.wantErr.Error())):
				t.Errorf("Do() = %v, want an error wrapping %q", err, tt.wantErr)
			}
		})
	}
}

// scriptErr finds, by text, the error value in script whose surfaced error reads msg, so the
// assertion is identity (errors.Is), not text.
func scriptErr(script []error, msg string) error {
	for _, e := range script {
		var f *Failure
		if errors.As(e, &f) && f.Err != nil && f.Err.Error() == msg {
			return f.Err
		}
		if e.Error() == msg {
			return e
		}
	}
	return errors.New("not in script: " + msg)
}

func TestDoFatalReturnsErrUnwrapped(t *testing.T) {
	ue := &UpstreamError{Status: 400, Type: "invalid_request_error", Message: "bad"}
	_, err := runScript(t, defaultBudget, 0, []error{&Failure{Class: Fatal, Err: ue}})
	if err != error(ue) {
		t.Errorf("Do() = %#v, want the fatal failure's Err itself", err)
	}
}

func TestDoThrottledJitterRange(t *testing.T) {
	// rand just below 1: hint 5 → 5·(1+0.25·r) < 6.25, and ≥ 6.2499 s
	recs, err := runScript(t, defaultBudget, 0.9999999999, []error{throttled(5*time.Second, 0)})
	if err != nil {
		t.Fatalf("Do() = %v", err)
	}
	if got := recs[1].at; got >= sec(6.25) || got < sec(6.2499) {
		t.Errorf("second attempt at %v, want in [6.2499s, 6.25s)", got)
	}
	if recs[1].waited != recs[1].at {
		t.Errorf("Attempt.Waited = %v, want %v", recs[1].waited, recs[1].at)
	}
}

func TestDoReplacement(t *testing.T) {
	replace := func(i int) error { return &Failure{Class: Replace, Err: fmt.Errorf("replace %d", i)} }
	backoff := func(i int) error { return &Failure{Class: Backoff, Err: fmt.Errorf("transport %d", i)} }
	tests := []struct {
		name    string
		retries int
		script  []error
		want    []record
		wantErr string // "" = success
	}{
		{
			// the replacement runs at once and spends no retry, even with none to spend
			name: "replacement with no retries", retries: 0,
			script: []error{replace(0)},
			want:   []record{{at: 0, n: 0}, {at: 0, n: 0, replacement: true}},
		},
		{
			// each budgeted attempt has its own replacement; a backoff then waits rung 1 = 2 s
			name: "one replacement per budgeted attempt", retries: 1,
			script: []error{replace(0), backoff(1), replace(2), backoff(3)},
			want: []record{
				{at: 0, n: 0}, {at: 0, n: 0, replacement: true},
				{at: sec(2), n: 1, waited: sec(2)}, {at: sec(2), n: 1, replacement: true},
			},
			wantErr: "transport 3",
		},
		{
			// the replacement's own Replace failure is a Backoff: rung 1 = 2 s, one retry spent
			name: "replace after a replacement backs off", retries: 5,
			script: []error{replace(0), replace(1)},
			want: []record{
				{at: 0, n: 0}, {at: 0, n: 0, replacement: true},
				{at: sec(2), n: 1, waited: sec(2)},
			},
		},
		{
			// with no retries left, the replacement's failure is final
			name: "replace after a replacement with no retries", retries: 0,
			script:  []error{replace(0), replace(1)},
			want:    []record{{at: 0, n: 0}, {at: 0, n: 0, replacement: true}},
			wantErr: "replace 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs, err := runScript(t, budget(120*time.Second, 600*time.Second, tt.retries), 0, tt.script)
			if !slices.Equal(recs, tt.want) {
				t.Errorf("attempts = %+v, want %+v", recs, tt.want)
			}
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("Do() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, scriptErr(tt.script, tt.wantErr)) {
				t.Errorf("Do() = %v, want an error wrapping %q", err, tt.wantErr)
			}
		})
	}
}

func TestDoCancelDuringWait(t *testing.T) {
	clk := newFakeClock()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	clk.onSleep = func(time.Duration) { cancel() }
	attempts := 0
	err := Do(ctx, Config{Budget: defaultBudget, Clock: clk}, func(ctx context.Context, a Attempt) error {
		attempts++
		return &Failure{Class: Backoff, Err: errors.New("transport")}
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do() = %v, want context.Canceled", err)
	}
	if attempts != 1 {
		t.Errorf("attempts = %d, want 1", attempts)
	}
	if got := clk.since(); got != 0 {
		t.Errorf("clock moved %v, want 0: the wait must not run out", got)
	}
}

// TestDoCancelDuringWaitSystemClock checks that the real Sleep returns at once on
// cancellation, inside a synctest bubble (fake time, real timers).
func TestDoCancelDuringWaitSystemClock(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		start := time.Now()
		go func() {
			time.Sleep(500 * time.Millisecond) // inside the first 2 s wait
			cancel()
		}()
		err := Do(ctx, Config{Budget: defaultBudget}, func(ctx context.Context, a Attempt) error {
			return &Failure{Class: Backoff, Err: errors.New("transport")}
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Do() = %v, want context.Canceled", err)
		}
		if got := time.Since(start); got != 500*time.Millisecond {
			t.Errorf("Do returned after %v, want 500ms (at the cancellation)", got)
		}
	})
}

func TestDoSystemClockSchedule(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		start := time.Now()
		var got []time.Duration
		err := Do(t.Context(), Config{}, func(ctx context.Context, a Attempt) error {
			got = append(got, time.Since(start))
			return &Failure{Class: Backoff, Err: errors.New("transport")}
		})
		if err == nil {
			t.Fatal("Do() = nil, want the last transport error")
		}
		if want := secs(0, 2, 6, 14, 30, 62); !slices.Equal(got, want) {
			t.Errorf("attempt times = %v, want %v", got, want)
		}
	})
}

func TestDoCancelledDuringAttempt(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	err := Do(ctx, Config{Budget: defaultBudget, Clock: newFakeClock()}, func(actx context.Context, a Attempt) error {
		cancel()
		return &Failure{Class: Backoff, Err: actx.Err()}
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Do() = %v, want context.Canceled", err)
	}
}

func TestDoInvalidConfig(t *testing.T) {
	tests := []struct {
		name    string
		budget  pacing.Budget
		attempt func(context.Context, Attempt) error
		want    []string // substrings
	}{
		{
			name:   "every budget problem at once",
			budget: pacing.Budget{IdleTimeout: -time.Second, TotalTimeout: 0, MaxRetries: 11},
			want:   []string{"idle timeout -1s", "total timeout 0s", "max retries 11", "allowed: 0..10"},
		},
		{
			name:   "negative retries",
			budget: budget(time.Minute, time.Minute, -1),
			want:   []string{"max retries -1"},
		},
		{name: "nil attempt", want: []string{"nil attempt function"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			attempt := tt.attempt
			if attempt == nil && tt.name != "nil attempt" {
				attempt = func(context.Context, Attempt) error { called = true; return nil }
			}
			err := Do(t.Context(), Config{Budget: tt.budget, Clock: newFakeClock()}, attempt)
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Do() = %v, want ErrInvalidConfig", err)
			}
			for _, s := range tt.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Do() = %q, want it to mention %q", err, s)
				}
			}
			if called {
				t.Error("attempt ran despite the bad config")
			}
		})
	}
}

func TestDoUnknownClass(t *testing.T) {
	inner := errors.New("odd")
	recs, err := runScript(t, defaultBudget, 0, []error{&Failure{Class: 0, Err: inner}})
	if len(recs) != 1 {
		t.Errorf("attempts = %d, want 1", len(recs))
	}
	if !errors.Is(err, inner) || !strings.Contains(err.Error(), "unknown class 0") {
		t.Errorf("Do() = %v, want an unknown-class error wrapping %v", err, inner)
	}
}

func TestDoAttemptContextEndsWithAttempt(t *testing.T) {
	var first context.Context
	clk := newFakeClock()
	n := 0
	err := Do(t.Context(), Config{Budget: defaultBudget, Clock: clk}, func(ctx context.Context, a Attempt) error {
		n++
		if n == 1 {
			first = ctx
			return &Failure{Class: Backoff, Err: errors.New("x")}
		}
		if first.Err() == nil {
			t.Error("the first attempt's context is still live during the second attempt")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Do() = %v", err)
	}
}
