package pacing

import (
	"testing"
	"time"
)

// BenchmarkTake measures the bucket alone: a 600/min bucket advanced 100ms per call, so every
// call refills one token and admits.
func BenchmarkTake(b *testing.B) {
	bk := NewBucket(Policy{RatePerMinute: 600, Burst: 10, Budget: DefaultBudget()}, t0)
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Millisecond)
		if d := bk.Take(now); d.Kind != KindAdmit {
			b.Fatalf("Take = %+v", d)
		}
	}
}

// BenchmarkTakeMixed drives the full decision rule: simultaneous bursts that admit, queue and
// refuse, then a refill.
func BenchmarkTakeMixed(b *testing.B) {
	bk := NewBucket(DefaultPolicy(), t0)
	now := t0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		if i%16 == 0 {
			now = now.Add(15 * time.Second)
		}
		bk.Take(now)
	}
}

func BenchmarkTakeRefund(b *testing.B) {
	bk := NewBucket(DefaultPolicy(), t0)
	b.ReportAllocs()
	for b.Loop() {
		d := bk.Take(t0)
		bk.RefundReservation(t0, d.ID)
	}
}
