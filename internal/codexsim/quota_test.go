package codexsim

import (
	"testing"
	"time"
)

// The windows advance with use, restart after their length, and a full
// window is a usage limit until it resets.
func TestPlanUsageWindows(t *testing.T) {
	q := Quota{PrimaryWindow: time.Hour, SecondaryWindow: 10 * time.Hour, PrimaryStart: -1,
		PrimaryPerResponse: 40, SecondaryPerResponse: 5}.withDefaults()
	var u planUsage
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	v := u.view("a", q, t0)
	if v[0].used != 0 || v[0].minutes != 60 || !v[0].resetAt.Equal(t0.Add(time.Hour)) || v[1].used != 29 || v[1].minutes != 600 {
		t.Fatalf("first view = %+v; want 0%% of 60 min resetting in an hour, 29%% of 600 min", v)
	}
	for range 2 {
		u.use("a", q, t0)
	}
	if _, ok := u.limit("a", q, t0); ok {
		t.Fatal("limit at 80%: reached, want not")
	}
	u.use("a", q, t0.Add(time.Minute))
	reset, ok := u.limit("a", q, t0.Add(2*time.Minute))
	if !ok || !reset.Equal(t0.Add(time.Hour)) {
		t.Fatalf("limit at 120%% = %v, %v; want reached until the primary window resets", reset, ok)
	}
	if v := u.view("b", q, t0); v[0].used != 0 || v[1].used != 29 {
		t.Errorf("another account's view = %+v; want its own windows", v)
	}
	v = u.view("a", q, t0.Add(time.Hour))
	if v[0].used != 0 || !v[0].resetAt.Equal(t0.Add(2*time.Hour)) || v[1].used != 44 {
		t.Errorf("view after the primary window = %+v; want it restarted at 0, the secondary at 44%%", v)
	}
	if _, ok := u.limit("a", q, t0.Add(time.Hour)); ok {
		t.Error("limit after the reset: reached, want not")
	}
}
