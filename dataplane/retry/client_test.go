package retry

import (
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"
)

func TestRetryAfterHeaderRange(t *testing.T) {
	// lo = the hint in whole seconds (rounded up; default 5; at most 60), hi = ceil(1.25 lo)
	tests := []struct {
		hint   time.Duration
		lo, hi int
	}{
		{0, 5, 7},
		{-3 * time.Second, 5, 7},
		{500 * time.Millisecond, 1, 2},
		{time.Second, 1, 2},
		{2 * time.Second, 2, 3},
		{4 * time.Second, 4, 5},
		{5 * time.Second, 5, 7},
		{10 * time.Second, 10, 13},
		{4200 * time.Millisecond, 5, 7},
		{59200 * time.Millisecond, 60, 75},
		{60 * time.Second, 60, 75},
		{100 * time.Second, 60, 75},
		{24 * time.Hour, 60, 75},
	}
	for _, tt := range tests {
		r := rand.New(rand.NewPCG(1, uint64(tt.hint))) //nolint:gosec // G404: a seeded generator makes the jitter sample repeatable
		seen := map[int]int{}
		for range 5000 {
			got := RetryAfterHeader(tt.hint, r.Float64)
			if got < tt.lo || got > tt.hi {
				t.Fatalf("RetryAfterHeader(%v) = %d, want in [%d, %d]", tt.hint, got, tt.lo, tt.hi)
			}
			seen[got]++
		}
		for v := tt.lo; v <= tt.hi; v++ {
			if seen[v] == 0 {
				t.Errorf("RetryAfterHeader(%v): %d never drawn in 5000 draws, want every value in [%d, %d]", tt.hint, v, tt.lo, tt.hi)
			}
		}
		// roughly uniform: each of k values near 5000/k
		k := tt.hi - tt.lo + 1
		for v, c := range seen {
			if want := 5000.0 / float64(k); math.Abs(float64(c)-want) > want*0.2 {
				t.Errorf("RetryAfterHeader(%v): %d drawn %d times, want about %.0f (uniform)", tt.hint, v, c, want)
			}
		}
	}
}

func TestRetryAfterHeaderEdges(t *testing.T) {
	tests := []struct {
		name string
		hint time.Duration
		rnd  func() float64
		want int
	}{
		{"rand 0 gives the hint", 5 * time.Second, fixedRand(0), 5},
		{"rand just below 1 gives the top", 5 * time.Second, fixedRand(math.Nextafter(1, 0)), 7},
		{"rand 1 is clamped to the top", 5 * time.Second, fixedRand(1), 7},
		{"rand above 1 is clamped to the top", 60 * time.Second, fixedRand(7), 75},
		{"negative rand is clamped to the bottom", 60 * time.Second, fixedRand(-1), 60},
		{"NaN rand gives the bottom", 8 * time.Second, fixedRand(math.NaN()), 8},
		{"rand 0.5 of 5..7", 5 * time.Second, fixedRand(0.5), 6},
	}
	for _, tt := range tests {
		if got := RetryAfterHeader(tt.hint, tt.rnd); got != tt.want {
			t.Errorf("%s: RetryAfterHeader(%v) = %d, want %d", tt.name, tt.hint, got, tt.want)
		}
	}
	if got := RetryAfterHeader(0, nil); got < 5 || got > 7 {
		t.Errorf("RetryAfterHeader(0, nil) = %d, want in [5, 7]", got)
	}
}

func TestShouldRetry(t *testing.T) {
	usage := func(in time.Duration) *UpstreamError {
		return &UpstreamError{Status: 429, Code: "usage_limit_reached", UsageLimit: true, ResetsIn: in}
	}
	tests := []struct {
		name  string
		err   *UpstreamError
		facts Facts
		want  string // "" = no header
	}{
		{"nil", nil, Facts{}, ""},
		{"context overflow", &UpstreamError{Status: 400, ContextOverflow: true}, Facts{}, "false"},
		{"usage limit in 2 hours", usage(2 * time.Hour), Facts{}, "false"},
		{"usage limit in 61 s", usage(61 * time.Second), Facts{}, "false"},
		{"usage limit in exactly 60 s", usage(60 * time.Second), Facts{}, "true"},
		{"usage limit in 1 s", usage(time.Second), Facts{}, "true"},
		{"usage limit, reset unknown", usage(0), Facts{}, "false"},
		{"throttle 429", &UpstreamError{Status: 429, RetryAfter: 5 * time.Second}, Facts{}, "true"},
		{"429 without a hint", &UpstreamError{Status: 429}, Facts{}, "true"},
		{"401 before refresh", &UpstreamError{Status: 401}, Facts{}, ""},
		{"401 after refresh", &UpstreamError{Status: 401}, Facts{AuthRefreshed: true}, "false"},
		{"403 after refresh", &UpstreamError{Status: 403}, Facts{AuthRefreshed: true}, "false"},
		{"529 overloaded", &UpstreamError{Status: 529}, Facts{AuthRefreshed: true}, "true"},
		{"502", &UpstreamError{Status: 502}, Facts{}, "true"},
		{"408", &UpstreamError{Status: 408}, Facts{}, "true"},
		{"409", &UpstreamError{Status: 409}, Facts{}, "true"},
		{"plain 400", &UpstreamError{Status: 400}, Facts{}, ""},
		{"404", &UpstreamError{Status: 404}, Facts{}, ""},
	}
	for _, tt := range tests {
		v, ok := ShouldRetry(tt.err, tt.facts)
		if v != tt.want || ok != (tt.want != "") {
			t.Errorf("%s: ShouldRetry() = (%q, %v), want %q", tt.name, v, ok, tt.want)
		}
	}
}

// TestAnswer: every retryable answer carries retry-after and x-should-retry, and its message
// says when to retry; what a retry cannot fix says so. rand 0.5 draws h + floor(0.5 × the
// ceil(1.25 h) − h + 1 values).
func TestAnswer(t *testing.T) {
	tests := []struct {
		name           string
		err            *UpstreamError
		facts          Facts
		wantRetryAfter string
		wantShould     string
		wantMsg        string
	}{
		{"upgrade 403 as 429, hint 5: 5..7", ClassifyUpgrade(403, ""), Facts{}, "6", "true",
			"OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 5s"},
		{"connection limit, hint 10: 10..13", &UpstreamError{Status: 429, Code: CodeConnectionLimit, RetryAfter: 10 * time.Second, Message: "m; retry after 10s"},
			Facts{}, "12", "true", "m; retry after 10s"},
		{"429 without a hint waits for the upstream: 3..4", &UpstreamError{Status: 429, Message: "rate limited"}, Facts{Wait: 3 * time.Second}, "4", "true",
			"rate limited; retry after 4s"},
		{"502 without a wait: the default 5..7", &UpstreamError{Status: 502, Message: "gone"}, Facts{}, "6", "true", "gone; retry after 6s"},
		{"529 with a 1 s wait: 1..2", &UpstreamError{Status: 529, Type: "overloaded_error", Message: "busy"}, Facts{Wait: time.Second}, "2", "true",
			"busy; retry after 2s"},
		{"usage limit 30 s away: 30..38", &UpstreamError{Status: 429, UsageLimit: true, ResetsIn: 30 * time.Second, Message: "limit; it resets in 30s"},
			Facts{Wait: time.Second}, "34", "true", "limit; it resets in 30s; retry after 34s"},
		{"usage limit hours away: no retry-after", &UpstreamError{Status: 429, UsageLimit: true, ResetsIn: 3 * time.Hour, Message: "limit; retrying before then will not help"},
			Facts{}, "", "false", "limit; retrying before then will not help"},
		{"overflow", &UpstreamError{Status: 400, ContextOverflow: true, Message: "prompt is too long"}, Facts{}, "", "false", "prompt is too long"},
		{"plain 400", &UpstreamError{Status: 400, Message: "bad"}, Facts{}, "", "", "bad"},
	}
	for _, tt := range tests {
		h := http.Header{}
		var before UpstreamError
		if tt.err != nil {
			before = *tt.err
		}
		got := Answer(h, tt.err, tt.facts, fixedRand(0.5))
		if got := h.Get("Retry-After"); got != tt.wantRetryAfter {
			t.Errorf("%s: retry-after = %q, want %q", tt.name, got, tt.wantRetryAfter)
		}
		if got := h.Get("X-Should-Retry"); got != tt.wantShould {
			t.Errorf("%s: x-should-retry = %q, want %q", tt.name, got, tt.wantShould)
		}
		if got.Message != tt.wantMsg {
			t.Errorf("%s: message %q, want %q", tt.name, got.Message, tt.wantMsg)
		}
		if *tt.err != before {
			t.Errorf("%s: Answer modified its argument", tt.name)
		}
	}
	if Answer(http.Header{}, nil, Facts{}, nil) != nil {
		t.Error("Answer(nil) != nil")
	}
}

// TestAnswerUsageLimit: a usage limit says when it resets, in its message and in the
// anthropic-ratelimit-*-reset headers (RFC 3339); only one resetting within 60 s gets a
// retry-after (the reset) and x-should-retry: true. A reset further away, or unknown, gets
// x-should-retry: false and no retry-after, which clients that ignore x-should-retry would
// wait out. A reset known only as resets_in_seconds is dated from Facts.Now.
func TestAnswerUsageLimit(t *testing.T) {
	now := time.Date(2026, 5, 4, 10, 0, 0, 400_000_000, time.UTC)
	frame := func(fields string) *UpstreamError {
		return ClassifyFrame([]byte(`{"type":"error","status":429,"error":{"type":"usage_limit_reached","code":"usage_limit_reached"`+fields+`}}`), false)
	}
	all := &allLimitedErr{account: "acct_b", at: time.Date(2026, 5, 4, 12, 30, 0, 0, time.UTC), in: 2*time.Hour + 30*time.Minute}
	allNear := &allLimitedErr{account: "acct_b", at: time.Date(2026, 5, 4, 10, 0, 40, 0, time.UTC), in: 40 * time.Second}
	tests := []struct {
		name           string
		err            *UpstreamError
		wantRetryAfter string
		wantShould     string
		wantReset      string
		wantMsg        string
	}{
		{"resets in 2h30m, resets_in_seconds only", frame(`,"plan_type":"pro","resets_in_seconds":9000`), "", "false", "2026-05-04T12:30:01Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached, pro plan); it resets in 2h30m (at 2026-05-04T12:30:01Z); retrying before then will not help"},
		{"resets in 2h30m, resets_at too", frame(`,"resets_in_seconds":9000,"resets_at":1777905000`), "", "false", "2026-05-04T14:30:00Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 2h30m (at 2026-05-04T14:30:00Z); retrying before then will not help"},
		{"resets_at only", frame(`,"resets_at":1777905000`), "", "false", "2026-05-04T14:30:00Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets at 2026-05-04T14:30:00Z; retrying before then will not help"},
		{"resets in 61 s", frame(`,"resets_in_seconds":61`), "", "false", "2026-05-04T10:01:02Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 1m1s (at 2026-05-04T10:01:02Z); retrying before then will not help"},
		{"resets in 60 s: retry-after 60..75", frame(`,"resets_in_seconds":60`), "68", "true", "2026-05-04T10:01:01Z",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 1m (at 2026-05-04T10:01:01Z); retry after 68s"},
		{"reset unknown", frame(``), "", "false", "",
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); the backend did not say when it resets, so retrying soon will not help"},
		{"every account limited, 2h30m", CredentialFailure(all, ""), "", "false", "2026-05-04T12:30:00Z",
			"Every ChatGPT account this data plane serves is at its usage limit; the first to reset is acct_b, at 2026-05-04T12:30:00Z (in 2h30m)"},
		{"every account limited, 40 s: retry-after 40..50", CredentialFailure(allNear, ""), "45", "true", "2026-05-04T10:00:40Z",
			"Every ChatGPT account this data plane serves is at its usage limit; the first to reset is acct_b, at 2026-05-04T10:00:40Z (in 40s); retry after 45s"},
	}
	for _, tt := range tests {
		h := http.Header{}
		got := Answer(h, tt.err, Facts{Now: now, Wait: time.Second}, fixedRand(0.5))
		if got.Status != 429 || got.Type != "rate_limit_error" {
			t.Errorf("%s: %d %s, want 429 rate_limit_error", tt.name, got.Status, got.Type)
		}
		if v := h.Get("Retry-After"); v != tt.wantRetryAfter {
			t.Errorf("%s: retry-after = %q, want %q", tt.name, v, tt.wantRetryAfter)
		}
		if v := h.Get("X-Should-Retry"); v != tt.wantShould {
			t.Errorf("%s: x-should-retry = %q, want %q", tt.name, v, tt.wantShould)
		}
		for _, k := range []string{"anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset"} {
			if v := h.Get(k); v != tt.wantReset {
				t.Errorf("%s: %s = %q, want %q", tt.name, k, v, tt.wantReset)
			}
		}
		if got.Message != tt.wantMsg {
			t.Errorf("%s: message\n %q\nwant\n %q", tt.name, got.Message, tt.wantMsg)
		}
	}
	// Without a clock the reset of resets_in_seconds stays undated: no header, and the
	// message says only how long.
	h := http.Header{}
	got := Answer(h, frame(`,"resets_in_seconds":9000`), Facts{}, fixedRand(0.5))
	if h.Get("anthropic-ratelimit-requests-reset") != "" || h.Get("Retry-After") != "" ||
		got.Message != "The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 2h30m; retrying before then will not help" {
		t.Errorf("no clock: headers %v, message %q; want no reset header, no retry-after, the wait only", h, got.Message)
	}
}

// allLimitedErr is an accounts.AllLimitedError as Classify reads it.
type allLimitedErr struct {
	account string
	at      time.Time
	in      time.Duration
}

func (e *allLimitedErr) Error() string { return "every account is at its usage limit" }
func (e *allLimitedErr) AllLimited() (string, time.Time, time.Duration) {
	return e.account, e.at, e.in
}
