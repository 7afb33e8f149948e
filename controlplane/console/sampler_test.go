package console

import (
	"testing"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func TestPerMinuteOverTheLastMinute(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	sr := &series{recent: []sample{
		{at: t0, refusals: 0, forbidden: 0},
		{at: t0.Add(30 * time.Second), refusals: 10, forbidden: 1},
		{at: t0.Add(90 * time.Second), refusals: 40, forbidden: 4},
		{at: t0.Add(120 * time.Second), refusals: 46, forbidden: 4},
	}}
	// The newest sample and the newest one at least a minute older (30 s):
	// 36 refusals and 3 403s in 90 s.
	rf, fb := sr.perMinute()
	if rf != 24 || fb != 2 {
		t.Errorf("perMinute() = %v, %v; want 24, 2", rf, fb)
	}
	// A replica restart resets its counters: no negative rate.
	sr.recent = append(sr.recent, sample{at: t0.Add(150 * time.Second), refusals: 1})
	if rf, fb := sr.perMinute(); rf != 0 || fb != 0 {
		t.Errorf("after a counter reset perMinute() = %v, %v; want 0, 0", rf, fb)
	}
}

// The forecast reads the window's burn rate and EMPTIES IN as ListQuotas
// answers them.
func TestForecast(t *testing.T) {
	win := func(used float64, burn *float64, empties *int64) *controlplanev1.QuotaWindow {
		return &controlplanev1.QuotaWindow{Name: "primary", UsedPercent: used, BurnPercentPerMinute: burn, EmptiesInSeconds: empties}
	}
	one, zero := 1.0, 0.0
	forty := int64(40 * 60)
	for _, tt := range []struct {
		w       *controlplanev1.QuotaWindow
		resetIn time.Duration
		want    string
	}{
		{win(60, &one, &forty), 5 * time.Hour, "full in 40m at 1.00 %/min"},
		{win(60, &one, &forty), 30 * time.Minute, "holds until the reset at 1.00 %/min"},
		{win(2, nil, nil), 5 * time.Hour, ""},
		{win(20, &zero, nil), 5 * time.Hour, "not rising"},
		{win(100, &one, new(int64)), 5 * time.Hour, "full"},
	} {
		if got := forecast(tt.w, tt.resetIn); got != tt.want {
			t.Errorf("forecast(%v, reset in %v) = %q, want %q", tt.w, tt.resetIn, got, tt.want)
		}
	}
}
