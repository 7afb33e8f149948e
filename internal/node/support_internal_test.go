package node

import (
	"testing"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// The data plane reports an account's codex.rate_limits to the control
// plane: a changed report at once, the same one at most once a second;
// other frames are not reports.
func TestRateLimitsSink(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var sent []*controlplanev1.RateLimits
	s := &rateLimitsSink{now: func() time.Time { return now }, report: func(rl *controlplanev1.RateLimits) { sent = append(sent, rl) }}
	const key = "acct_0123456789abcdef"
	frame := func(used int) []byte {
		return []byte(`{"type":"codex.rate_limits","plan_type":"pro","rate_limits":{"allowed":true,"limit_reached":false,` +
			`"primary":{"used_percent":` + string(rune('0'+used)) + `,"window_minutes":300,"reset_after_seconds":60,"reset_at":1796140860},` +
			`"secondary":null}}`)
	}
	s.frame(key, []byte(`{"type":"response.created","response":{"id":"r"}}`))
	s.frame(key, frame(7))
	s.frame(key, frame(7))
	if len(sent) != 1 {
		t.Fatalf("reports = %d, want 1 (the same figures within a second are sent once)", len(sent))
	}
	r := sent[0]
	if r.GetAccount() != key || r.GetPlanType() != "pro" || r.GetAtUnixMs() != now.UnixMilli() || len(r.GetWindows()) != 1 {
		t.Fatalf("report = %v; want %s's pro plan, one window, read now", r, key)
	}
	if w := r.GetWindows()[0]; w.GetName() != "primary" || w.GetUsedPercent() != 7 || w.GetWindowMinutes() != 300 || w.GetResetsAtUnixMs() != 1796140860000 {
		t.Errorf("window = %v; want primary, 7%% of 300 min, resetting at 1796140860 s", w)
	}
	s.frame(key, frame(8))
	now = now.Add(2 * time.Second)
	s.frame(key, frame(8))
	if len(sent) != 3 || sent[1].GetWindows()[0].GetUsedPercent() != 8 {
		t.Fatalf("reports = %d, want 3: a change at once, the same figures again after a second", len(sent))
	}
	// A usage-limit error reports the limit reached (no windows).
	s.frame(key, []byte(`{"type":"error","status":429,"error":{"type":"usage_limit_reached","code":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"pro","resets_in_seconds":600}}`))
	if len(sent) != 4 || !sent[3].GetLimitReached() || len(sent[3].GetWindows()) != 0 {
		t.Errorf("reports = %d, last %v; want a fourth saying the limit is reached", len(sent), sent[len(sent)-1])
	}
}

// A refused upgrade's Retry-After is whole seconds, capped at an hour, for
// the 403 report.
func TestParseRetryAfter(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7": 7 * time.Second, " 30 ": 30 * time.Second, "99999": time.Hour,
		"": 0, "0": 0, "-3": 0, "soon": 0, "Wed, 21 Oct 2026 07:28:00 GMT": 0,
	} {
		if got := parseRetryAfter(in); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}
