package retry

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func synctestRun(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}

func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestDeadlineResetsOnlyOnReset(t *testing.T) {
	clk := newFakeClock()
	d := NewDeadline(10*time.Second, clk)
	defer d.Stop()
	clk.Advance(9 * time.Second)
	if isDone(d.Done()) || d.Err() != nil {
		t.Fatal("expired at 9s, want alive until 10s")
	}
	if !d.Reset() {
		t.Fatal("Reset() = false before expiry, want true")
	}
	if got, want := d.Expiry(), epoch.Add(19*time.Second); !got.Equal(want) {
		t.Errorf("Expiry() = %v, want %v", got, want)
	}
	clk.Advance(9 * time.Second) // t = 18: the original timer fired at 10 and re-armed
	if isDone(d.Done()) {
		t.Fatal("expired at 18s after a Reset at 9s, want alive until 19s")
	}
	clk.Advance(time.Second) // t = 19
	if !isDone(d.Done()) {
		t.Fatal("alive at 19s, want expired 10s after the Reset at 9s")
	}
	var te *TimeoutError
	if err := d.Err(); !errors.As(err, &te) || !te.Idle || te.Limit != 10*time.Second {
		t.Errorf("Err() = %#v, want an idle *TimeoutError of 10s", err)
	}
	if d.Reset() {
		t.Error("Reset() = true after expiry, want false")
	}
}

func TestDeadlineZeroTimeoutExpiresAtOnce(t *testing.T) {
	d := NewDeadline(0, newFakeClock())
	if !isDone(d.Done()) {
		t.Error("a zero timeout is not expired at once")
	}
	d.Stop()
}

func TestDeadlineStop(t *testing.T) {
	clk := newFakeClock()
	d := NewDeadline(time.Second, clk)
	ctx, cancel := d.Context(t.Context())
	defer cancel()
	d.Stop()
	d.Stop()
	clk.Advance(time.Hour)
	if isDone(d.Done()) || ctx.Err() != nil {
		t.Error("a stopped deadline expired")
	}
	if d.Reset() {
		t.Error("Reset() = true after Stop, want false")
	}
}

func TestDeadlineContext(t *testing.T) {
	clk := newFakeClock()
	d := NewDeadline(5*time.Second, clk)
	defer d.Stop()
	ctx1, cancel1 := d.Context(t.Context())
	defer cancel1()
	ctx2, cancel2 := d.Context(t.Context())
	cancel2() // released: the expiry must not matter to it
	clk.Advance(5 * time.Second)
	if !errors.Is(context.Cause(ctx1), ErrIdleTimeout) {
		t.Errorf("Cause(ctx1) = %v, want ErrIdleTimeout", context.Cause(ctx1))
	}
	if !errors.Is(context.Cause(ctx2), context.Canceled) {
		t.Errorf("Cause(ctx2) = %v, want context.Canceled (released before expiry)", context.Cause(ctx2))
	}
	ctx3, cancel3 := d.Context(t.Context())
	defer cancel3()
	if !errors.Is(context.Cause(ctx3), ErrIdleTimeout) {
		t.Errorf("Context after expiry: Cause = %v, want ErrIdleTimeout at once", context.Cause(ctx3))
	}
}

func TestDeadlineSystemClock(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		start := time.Now()
		d := NewDeadline(3*time.Second, nil)
		defer d.Stop()
		time.Sleep(2 * time.Second)
		d.Reset()
		<-d.Done()
		if got := time.Since(start); got != 5*time.Second {
			t.Errorf("expired after %v, want 5s (3s after the Reset at 2s)", got)
		}
	})
}

func TestTimeoutError(t *testing.T) {
	tests := []struct {
		err     *TimeoutError
		want    string
		is, not error
	}{
		{&TimeoutError{Idle: true, Limit: 120 * time.Second}, "no data received from provider for 120s", ErrIdleTimeout, ErrTotalTimeout},
		{&TimeoutError{Limit: 600 * time.Second}, "provider stream exceeded 600s", ErrTotalTimeout, ErrIdleTimeout},
		{&TimeoutError{Idle: true, Limit: 1500 * time.Millisecond}, "no data received from provider for 1.5s", ErrIdleTimeout, ErrTotalTimeout},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
		if !errors.Is(tt.err, tt.is) || errors.Is(tt.err, tt.not) {
			t.Errorf("%q: errors.Is(%v) = false or errors.Is(%v) = true", tt.want, tt.is, tt.not)
		}
		u := tt.err.Upstream()
		if u.Status != 502 || u.Type != "api_error" || u.Message != tt.want {
			t.Errorf("Upstream() = %+v, want 502 api_error %q", u, tt.want)
		}
	}
}

// idleAttempt walks the fake clock in 1 s steps for up to steps seconds, calling Reset at the
// listed offsets (seconds since the attempt started), and returns when its context ends. It
// reports the time (since epoch) at which it saw the context end, or -1.
func idleAttempt(clk *fakeClock, steps int, resets map[int]bool, doneAt *time.Duration) func(context.Context, Attempt) error {
	return func(ctx context.Context, a Attempt) error {
		for i := 1; i <= steps; i++ {
			clk.Advance(time.Second)
			if ctx.Err() != nil {
				*doneAt = clk.since()
				return &Failure{Class: Backoff, Err: fmt.Errorf("read: %w", ctx.Err())}
			}
			if resets[i] {
				a.Idle.Reset()
			}
		}
		*doneAt = -1
		return &Failure{Class: Backoff, Err: errors.New("transport")}
	}
}

func TestIdleDeadlineSpansAttempts(t *testing.T) {
	tests := []struct {
		name       string
		budget     [2]time.Duration // idle, total
		first      int              // seconds the first attempt runs before failing
		resets     map[int]bool     // Reset offsets in the first attempt
		secondRes  map[int]bool     // Reset offsets in the second attempt
		wantDoneAt time.Duration
		wantErr    error
		wantMsg    string
	}{
		{
			// no event: 100 s, wait 2 s, second attempt at 102 dies at 120: the wait did not reset
			name: "no events: the second attempt dies at the first attempt's deadline", budget: [2]time.Duration{120 * time.Second, 600 * time.Second},
			first: 100, wantDoneAt: 120 * time.Second, wantErr: ErrIdleTimeout, wantMsg: "no data received from provider for 120s",
		},
		{
			// an event at 90 moves the deadline to 210
			name: "an event in the first attempt moves the shared deadline", budget: [2]time.Duration{120 * time.Second, 600 * time.Second},
			first: 100, resets: map[int]bool{90: true}, wantDoneAt: 210 * time.Second, wantErr: ErrIdleTimeout,
		},
		{
			// events every 10 s keep idle alive; the total deadline ends it at 150
			name: "the total deadline is not reset by events", budget: [2]time.Duration{120 * time.Second, 150 * time.Second},
			first: 10, resets: map[int]bool{5: true}, secondRes: every(10, 300),
			wantDoneAt: 150 * time.Second, wantErr: ErrTotalTimeout, wantMsg: "provider stream exceeded 150s",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			var doneAt time.Duration
			n := 0
			err := Do(t.Context(), Config{Budget: budget(tt.budget[0], tt.budget[1], 5), Clock: clk},
				func(ctx context.Context, a Attempt) error {
					n++
					if n == 1 {
						return idleAttempt(clk, tt.first, tt.resets, new(time.Duration))(ctx, a)
					}
					return idleAttempt(clk, 1000, tt.secondRes, &doneAt)(ctx, a)
				})
			if doneAt != tt.wantDoneAt {
				t.Errorf("second attempt's context ended at %v, want %v", doneAt, tt.wantDoneAt)
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("Do() = %v, want %v", err, tt.wantErr)
			}
			if tt.wantMsg != "" && (err == nil || err.Error() != tt.wantMsg) {
				t.Errorf("Do() = %v, want the message %q", err, tt.wantMsg)
			}
			if n != 2 {
				t.Errorf("attempts = %d, want 2", n)
			}
		})
	}
}

func every(step, upto int) map[int]bool {
	m := map[int]bool{}
	for i := step; i <= upto; i += step {
		m[i] = true
	}
	return m
}

// TestDeadlineConcurrentResets resets from another goroutine while the timer fires and
// re-arms (run with -race); in the bubble the expiry lands exactly 3 s after the last Reset.
func TestDeadlineConcurrentResets(t *testing.T) {
	synctestRun(t, func(t *testing.T) {
		start := time.Now()
		d := NewDeadline(3*time.Second, nil)
		defer d.Stop()
		ctx, cancel := d.Context(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for range 10 {
				time.Sleep(2500 * time.Millisecond)
				d.Reset()
			}
		}()
		<-ctx.Done()
		<-done
		if got := time.Since(start); got != 28*time.Second {
			t.Errorf("expired after %v, want 28s (3s after the last Reset at 25s)", got)
		}
		if !errors.Is(context.Cause(ctx), ErrIdleTimeout) {
			t.Errorf("Cause = %v, want ErrIdleTimeout", context.Cause(ctx))
		}
	})
}
