package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
)

func TestRetryDelay(t *testing.T) {
	r := Retry{MaxRetries: 10}
	tests := []struct {
		name       string
		attempt    int
		retryAfter time.Duration
		jitter     float64
		want       time.Duration
	}{
		// Claude Code: max(retry-after, min(500ms*2^(n-1), 32s)) * (1 + jitter*0.25).
		{"first rung", 1, 0, 0, 500 * time.Millisecond},
		{"second rung", 2, 0, 0, time.Second},
		{"retry-after wins over a short rung", 1, 2 * time.Second, 0, 2 * time.Second},
		{"rung wins over a short retry-after", 5, time.Second, 0, 8 * time.Second},
		{"capped at 32s", 7, 0, 0, 32 * time.Second},
		{"stays capped", 10, 0, 0, 32 * time.Second},
		{"full jitter adds a quarter", 3, 0, 1, 2500 * time.Millisecond},
		{"jitter applies on top of retry-after", 1, 2 * time.Second, 0.5, 2250 * time.Millisecond},
		{"attempt below 1 is the first rung", 0, 0, 0, 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := r.Delay(tt.attempt, tt.retryAfter, tt.jitter); got != tt.want {
				t.Errorf("Delay(%d, %v, %v) = %v, want %v", tt.attempt, tt.retryAfter, tt.jitter, got, tt.want)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"2", 2 * time.Second},
		{" 7 ", 7 * time.Second},
		{"", 0},
		{"-1", 0},
		{"1.5", 0},
		{"Wed, 21 Oct 2015 07:28:00 GMT", 0},
	}
	for _, tt := range tests {
		if got := ParseRetryAfter(tt.in); got != tt.want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, n := range v {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one value", ms(7), 99, 7 * time.Millisecond},
		{"median of four is the second (nearest rank)", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 99, 99 * time.Millisecond},
		{"p50 of 1..100", ms(hundred...), 50, 50 * time.Millisecond},
		{"p100 is the max", ms(1, 5, 9), 100, 9 * time.Millisecond},
		{"p0 is the min", ms(1, 5, 9), 0, 1 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestSumMetric(t *testing.T) {
	const exp = `# HELP clodex_controlplane_admissions_total Admission decisions.
# TYPE clodex_controlplane_admissions_total counter
clodex_controlplane_admissions_total{decision="admit"} 12
clodex_controlplane_admissions_total{decision="refuse"} 3
clodex_controlplane_admissions_total{decision="wait"} 0
clodex_controlplane_admissions_total_extra 100
clodex_controlplane_upstream_403_total 4
clodex_controlplane_agents 3
`
	tests := []struct {
		name string
		want float64
	}{
		{"clodex_controlplane_admissions_total", 15},
		{"clodex_controlplane_upstream_403_total", 4},
		{"clodex_controlplane_agents", 3},
		{"clodex_controlplane_missing", 0},
	}
	for _, tt := range tests {
		if got := SumMetric([]byte(exp), tt.name); got != tt.want {
			t.Errorf("SumMetric(%s) = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// The auth.json the fleet writes must be one the data plane reads, with
// the account taken from tokens.account_id since the token is opaque.
func TestAuthJSONIsReadByTheDataPlane(t *testing.T) {
	f, err := codexauth.ParseAuthFile("auth.json", AuthJSON("tok-x", "acct-x"))
	if err != nil {
		t.Fatalf("ParseAuthFile: %v", err)
	}
	c := f.Credential()
	if c.AccountID != "acct-x" {
		t.Errorf("account = %q, want acct-x", c.AccountID)
	}
	if got := c.AccessToken.Reveal(); got != "tok-x" {
		t.Errorf("access token = %q, want tok-x", got)
	}
	if f.AuthMode != "chatgpt" {
		t.Errorf("auth_mode = %q, want chatgpt", f.AuthMode)
	}
}

func TestTurnRequestIsANewClaudeCodeConversation(t *testing.T) {
	var body struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Metadata struct {
			UserID string `json:"user_id"`
		} `json:"metadata"`
		Messages []struct {
			Role    string `json:"role"`
			Content []struct {
				Type, Text string
			} `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(TurnRequest("sess-1"), &body); err != nil {
		t.Fatal(err)
	}
	if !body.Stream || body.Model == "" {
		t.Errorf("stream %v model %q, want a streaming request with a model", body.Stream, body.Model)
	}
	// Claude Code sends metadata.user_id as a JSON string holding the session id.
	var uid struct {
		SessionID string `json:"session_id"`
	}
	if err := json.Unmarshal([]byte(body.Metadata.UserID), &uid); err != nil || uid.SessionID != "sess-1" {
		t.Errorf("metadata.user_id = %q (%v), want a JSON string with session_id sess-1", body.Metadata.UserID, err)
	}
	if len(body.Messages) != 1 || body.Messages[0].Role != "user" || len(body.Messages[0].Content) != 1 ||
		body.Messages[0].Content[0].Text != "#sim reply ok" {
		t.Errorf("messages = %+v, want one user message \"#sim reply ok\"", body.Messages)
	}
	if a, b := NewSessionID(), NewSessionID(); a == b || !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`).MatchString(a) {
		t.Errorf("NewSessionID() = %q, %q; want distinct UUID-shaped ids", a, b)
	}
}

const okStream = "event: message_start\ndata: {\"type\":\"message_start\"}\n\n" +
	"event: content_block_delta\ndata: {\"type\":\"content_block_delta\"}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

// stub answers the scripted statuses in order, then OK streams.
func stub(t *testing.T, answers ...func(w http.ResponseWriter)) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost {
			http.Error(w, "wrong route", http.StatusNotFound)
			return
		}
		if i < len(answers) {
			answers[i](w)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, okStream)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

func status(code int, retryAfter string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if retryAfter != "" {
			w.Header().Set("retry-after", retryAfter)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, `{"type":"error","error":{"type":"rate_limit_error","message":"x"}}`)
	}
}

func sse(body string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, body)
	}
}

func TestRunTurn(t *testing.T) {
	tests := []struct {
		name         string
		answers      []func(http.ResponseWriter)
		maxRetries   int
		wantOK       bool
		wantReason   string
		wantAttempts int
		wantSleeps   []time.Duration
	}{
		{name: "ok at once", wantOK: true, wantAttempts: 1, maxRetries: 3},
		{
			name:    "429 then ok waits retry-after",
			answers: []func(http.ResponseWriter){status(429, "2")}, maxRetries: 3,
			wantOK: true, wantAttempts: 2, wantSleeps: []time.Duration{2 * time.Second},
		},
		{
			name:    "429 without retry-after follows the ladder",
			answers: []func(http.ResponseWriter){status(429, ""), status(429, ""), status(429, "")}, maxRetries: 3,
			wantOK: true, wantAttempts: 4, wantSleeps: []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second},
		},
		{
			name:    "retries exhausted fails",
			answers: []func(http.ResponseWriter){status(429, "1"), status(429, "1"), status(429, "1")}, maxRetries: 2,
			wantReason: "429 retries exhausted", wantAttempts: 3, wantSleeps: []time.Duration{time.Second, time.Second},
		},
		{
			name:    "no retries allowed",
			answers: []func(http.ResponseWriter){status(429, "1")}, maxRetries: 0,
			wantReason: "429 retries exhausted", wantAttempts: 1,
		},
		{
			name:    "a 500 fails at once",
			answers: []func(http.ResponseWriter){status(500, "")}, maxRetries: 5,
			wantReason: "status 500", wantAttempts: 1,
		},
		{
			name:    "an error event fails",
			answers: []func(http.ResponseWriter){sse("event: message_start\ndata: {}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n")}, maxRetries: 5,
			wantReason: "stream error: overloaded_error", wantAttempts: 1,
		},
		{
			name:    "a stream without message_stop fails",
			answers: []func(http.ResponseWriter){sse("event: message_start\ndata: {}\n\n")}, maxRetries: 5,
			wantReason: "stream ended without message_stop", wantAttempts: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv, _ := stub(t, tt.answers...)
			var slept []time.Duration
			r := Retry{MaxRetries: tt.maxRetries, Sleep: func(_ context.Context, d time.Duration) error {
				slept = append(slept, d)
				return nil
			}}
			got := RunTurn(t.Context(), srv.Client(), srv.URL, r, func() float64 { return 0 })
			if got.OK != tt.wantOK || got.Reason != tt.wantReason || got.Attempts != tt.wantAttempts || got.Cancelled {
				t.Errorf("RunTurn = ok %v reason %q attempts %d cancelled %v; want ok %v reason %q attempts %d",
					got.OK, got.Reason, got.Attempts, got.Cancelled, tt.wantOK, tt.wantReason, tt.wantAttempts)
			}
			if fmt.Sprint(slept) != fmt.Sprint(tt.wantSleeps) && !(len(slept) == 0 && len(tt.wantSleeps) == 0) {
				t.Errorf("slept %v, want %v", slept, tt.wantSleeps)
			}
		})
	}
}

func TestRunTurnCancelledIsNotFailed(t *testing.T) {
	srv, _ := stub(t, status(429, "30"))
	ctx, cancel := context.WithCancel(t.Context())
	r := Retry{MaxRetries: 5, Sleep: func(context.Context, time.Duration) error {
		cancel() // the run ends during the wait
		return context.Canceled
	}}
	got := RunTurn(ctx, srv.Client(), srv.URL, r, func() float64 { return 0 })
	if !got.Cancelled || got.OK || got.Reason != "" {
		t.Errorf("RunTurn = %+v, want cancelled, not ok, no failure reason", got)
	}
}

func TestRunLoadCounts(t *testing.T) {
	// Every third request is a 500: those turns fail; the rest succeed.
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, okStream)
	}))
	defer srv.Close()
	res, err := RunLoad(t.Context(), LoadConfig{
		BaseURLs: []string{srv.URL, srv.URL},
		Agents:   2,
		Duration: 200 * time.Millisecond,
		Client:   srv.Client(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Turns == 0 || res.OK+res.Failed+res.Unfinished != res.Turns || len(res.Results) != res.Turns {
		t.Fatalf("turns %d = ok %d + failed %d + unfinished %d (results %d); want a consistent, non-empty count",
			res.Turns, res.OK, res.Failed, res.Unfinished, len(res.Results))
	}
	if int(n.Load()) != res.Turns {
		t.Errorf("server saw %d requests for %d turns without retries", n.Load(), res.Turns)
	}
	if want := int(n.Load()) / 3; res.Failed != want || res.Reasons["status 500"] != want {
		t.Errorf("failed %d (reasons %v), want %d (every third request)", res.Failed, res.Reasons, want)
	}
	if len(res.Latencies) != res.OK {
		t.Errorf("%d latencies for %d successful turns", len(res.Latencies), res.OK)
	}
}

func TestRunLoadRejectsBadConfig(t *testing.T) {
	if _, err := RunLoad(t.Context(), LoadConfig{Duration: time.Second}); err == nil || !strings.Contains(err.Error(), "BaseURLs") {
		t.Errorf("RunLoad without BaseURLs: err = %v, want one naming BaseURLs", err)
	}
}

func TestLineWatcherFindsTheReadyLineAcrossWrites(t *testing.T) {
	var log strings.Builder
	found := make(chan string, 1)
	w := &lineWatcher{w: &log, re: simReady, found: found}
	for _, chunk := range []string{"noise\nws://127.0.0.1:", "4242/backend-api/codex/responses\n", "ws://127.0.0.1:1/again\n"} {
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-found:
		if got != "127.0.0.1:4242" {
			t.Errorf("ready address = %q, want 127.0.0.1:4242", got)
		}
	default:
		t.Fatal("no ready line found")
	}
	if !strings.Contains(log.String(), "noise") {
		t.Errorf("the log lost output: %q", log.String())
	}
}

func TestDataPlaneReadyLine(t *testing.T) {
	line := "export ANTHROPIC_BASE_URL=http://127.0.0.1:36411  # clodex-dataplane ready; any ANTHROPIC_API_KEY works on loopback"
	m := dataPlaneReady.FindStringSubmatch(line)
	if m == nil || m[1] != "http://127.0.0.1:36411" {
		t.Errorf("dataPlaneReady on %q = %v, want http://127.0.0.1:36411", line, m)
	}
}

func TestBinariesCheckNamesEveryMissingBinary(t *testing.T) {
	dir := t.TempDir()
	err := BinariesIn(dir).Check()
	if err == nil {
		t.Fatal("Check() on an empty directory = nil")
	}
	for _, name := range []string{"clodex-sim", "clodex-controlplane", "clodexctl", "clodex-dataplane"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("Check() = %v; does not name %s", err, name)
		}
	}
}

func TestStartRequiresDir(t *testing.T) {
	if _, err := Start(t.Context(), Options{}); err == nil || !strings.Contains(err.Error(), "Dir") {
		t.Errorf("Start without Dir: err = %v, want one naming Options.Dir", err)
	}
}
