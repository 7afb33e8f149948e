package accounts

import (
	"testing"
	"time"
)

func TestParseRateLimits(t *testing.T) {
	now := time.Unix(1779385617, 0)
	// The shape from the backend's public clients (backend events spec).
	frame := []byte(`{"type": "codex.rate_limits", "plan_type": "pro",
	 "rate_limits": {"allowed": true, "limit_reached": false,
	   "primary":   {"used_percent": 7,  "window_minutes": 300,   "reset_after_seconds": 13168,  "reset_at": 1779398785},
	   "secondary": {"used_percent": 29.5, "window_minutes": 10080, "reset_after_seconds": 434962}},
	 "code_review_rate_limits": null, "additional_rate_limits": null}`)
	rl, ok := ParseRateLimits(frame, now)
	if !ok {
		t.Fatal("ParseRateLimits = false, want the event read")
	}
	if rl.PlanType != "pro" || rl.LimitReached || len(rl.Windows) != 2 {
		t.Fatalf("ParseRateLimits = %+v, want plan pro, not reached, two windows", rl)
	}
	p, s := rl.Windows[0], rl.Windows[1]
	if p.Name != "primary" || p.UsedPercent != 7 || p.Window != 5*time.Hour || !p.ResetsAt.Equal(time.Unix(1779398785, 0)) {
		t.Errorf("primary = %+v, want 7%% of 5h resetting at 1779398785", p)
	}
	if s.Name != "secondary" || s.UsedPercent != 29.5 || s.Window != 7*24*time.Hour || !s.ResetsAt.Equal(now.Add(434962*time.Second)) {
		t.Errorf("secondary = %+v, want 29.5%% of 7 days resetting 434962 s from now", s)
	}
	if h := rl.Headroom(now); h != 70.5 {
		t.Errorf("Headroom = %v, want 70.5 (the weekly window is the tightest)", h)
	}
	if h := rl.Headroom(now.Add(500000 * time.Second)); h != 100 {
		t.Errorf("Headroom after both resets = %v, want 100", h)
	}

	for name, tc := range map[string]struct {
		frame  string
		ok     bool
		reach  bool
		nwin   int
		headrm float64
	}{
		"another event":          {frame: `{"type":"response.created","response":{"id":"r"}}`},
		"other codex event":      {frame: `{"type":"codex.response.metadata","headers":{}}`},
		"not json":               {frame: `codex.rate_limits`},
		"no rate_limits":         {frame: `{"type":"codex.rate_limits","plan_type":"plus"}`},
		"null windows":           {frame: `{"type":"codex.rate_limits","rate_limits":{"primary":null,"secondary":null}}`, ok: true, headrm: 100},
		"limit reached":          {frame: `{"type":"codex.rate_limits","rate_limits":{"limit_reached":true,"primary":{"used_percent":100}}}`, ok: true, reach: true, nwin: 1},
		"not allowed":            {frame: `{"type":"codex.rate_limits","rate_limits":{"allowed":false}}`, ok: true, reach: true},
		"wrong types tolerated":  {frame: `{"type":"codex.rate_limits","plan_type":7,"rate_limits":{"primary":{"used_percent":"x","window_minutes":-3}}}`, ok: true, nwin: 1, headrm: 100},
		"percent above 100 kept": {frame: `{"type":"codex.rate_limits","rate_limits":{"secondary":{"used_percent":104}}}`, ok: true, nwin: 1},
	} {
		t.Run(name, func(t *testing.T) {
			rl, ok := ParseRateLimits([]byte(tc.frame), now)
			if ok != tc.ok || rl.LimitReached != tc.reach || len(rl.Windows) != tc.nwin {
				t.Fatalf("ParseRateLimits = %+v, %v; want ok %v, reached %v, %d windows", rl, ok, tc.ok, tc.reach, tc.nwin)
			}
			if ok && rl.Headroom(now) != tc.headrm {
				t.Errorf("Headroom = %v, want %v", rl.Headroom(now), tc.headrm)
			}
		})
	}
}
