package retry

import (
	"context"
	"testing"
	"time"
)

// BenchmarkDeadlineReset is the per-event cost on the stream hot path.
func BenchmarkDeadlineReset(b *testing.B) {
	d := NewDeadline(120*time.Second, nil)
	defer d.Stop()
	b.ReportAllocs()
	for b.Loop() {
		d.Reset()
	}
}

// BenchmarkDoFirstTry is Do's overhead per request when the first attempt succeeds.
func BenchmarkDoFirstTry(b *testing.B) {
	ctx := context.Background()
	cfg := Config{}
	attempt := func(context.Context, Attempt) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := Do(ctx, cfg, attempt); err != nil {
			b.Fatal(err)
		}
	}
}
