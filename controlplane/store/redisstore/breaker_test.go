package redisstore

import (
	"testing"
	"time"

	"github.com/clodex/clodex/internal/pacing"
)

// Calls that fail together (one slow pipeline) do not open the breaker;
// the same number spread over the span do, and a success in between starts
// the count again.
func TestBreakerNeedsASpan(t *testing.T) {
	const span = 100 * time.Millisecond
	t0 := time.Unix(1_000_000, 0)
	var b breaker
	b.threshold = 3
	for i := range 50 { // one pipeline's calls, failing within 5 ms
		if b.failure(t0.Add(time.Duration(i)*100*time.Microsecond), span) {
			t.Fatalf("failure %d of one slow round trip opened the breaker", i+1)
		}
	}
	b.success()
	if b.failure(t0.Add(time.Second), span) || b.failure(t0.Add(time.Second+50*time.Millisecond), span) {
		t.Fatal("two failures opened the breaker")
	}
	if !b.failure(t0.Add(time.Second+span), span) {
		t.Fatalf("three consecutive failures %v apart did not open the breaker", span)
	}
}

// A replica's share starts empty, and below empty by its part of the
// queue Redis had granted: 600/min between 2 replicas is 5/s each; a queue
// ending 1 s after the switch is 5 of this replica's tokens.
func TestFallbackStartsBelowTheQueue(t *testing.T) {
	p := pacing.Policy{RatePerMinute: 600, Burst: 10, Budget: pacing.DefaultBudget()}
	now := time.Unix(1_000_000, 0)
	for _, tt := range []struct {
		name  string
		queue time.Duration // the latest reservation's departure after now; 0: none
		want  float64
	}{
		{"no queue", 0, 0},
		{"a queue of 1s", time.Second, -5},
		{"a queue that departed", -time.Second, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFallback(func() time.Time { return now })
			if tt.queue != 0 {
				f.queue("k", now.Add(tt.queue))
			}
			a := f.admit("k", p, 2, now)
			got, _ := f.tokens("k", now)
			// admit debited one token (a wait) from the starting level.
			if got+1 != tt.want {
				t.Errorf("share bucket started at %v tokens (decision %v); want %v", got+1, a.Decision.Kind, tt.want)
			}
		})
	}
}
