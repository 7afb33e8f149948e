package retry

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name      string
		err       *UpstreamError
		facts     Facts
		wantClass Class
		wantHint  time.Duration
	}{
		{"previous_response_not_found", ClassifyFrame([]byte(`{"type":"error","error":{"code":"previous_response_not_found"}}`), false), Facts{}, Replace, 0},
		{"connection limit", ClassifyFrame([]byte(`{"type":"error","error":{"code":"websocket_connection_limit_reached"}}`), false), Facts{}, Replace, 5 * time.Second},
		{"upgrade 403 throttle", ClassifyUpgrade(403, "12"), Facts{}, Throttled, 12 * time.Second},
		{"upgrade 429 no hint", ClassifyUpgrade(429, ""), Facts{}, Throttled, 0},
		{"upgrade 503", ClassifyUpgrade(503, ""), Facts{}, Backoff, 0},
		{"upgrade 500", ClassifyUpgrade(500, ""), Facts{}, Backoff, 0},
		{"upgrade 401", ClassifyUpgrade(401, ""), Facts{}, Fatal, 0},
		{"upgrade 404", ClassifyUpgrade(404, ""), Facts{}, Fatal, 0},
		{"output-less server_error", ClassifyFrame([]byte(`{"type":"response.failed","response":{"error":{"code":"server_error"}}}`), false), Facts{}, Backoff, 0},
		{"overloaded", ClassifyFrame([]byte(`{"type":"response.failed","response":{"error":{"code":"overloaded_error"}}}`), false), Facts{}, Backoff, 0},
		{"context overflow", ClassifyFrame([]byte(`{"type":"error","error":{"code":"context_length_exceeded"}}`), false), Facts{}, Fatal, 0},
		{"content filter", ClassifyFrame([]byte(`{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}`), false), Facts{}, Fatal, 0},
		// A usage limit is never retried inside the data plane, whatever its reset.
		{"usage limit, reset unknown", ClassifyFrame([]byte(`{"type":"error","status":429,"error":{"code":"usage_limit_reached"}}`), false), Facts{}, Fatal, 0},
		{"usage limit in 30 s", ClassifyFrame([]byte(`{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_in_seconds":30}}`), false), Facts{}, Fatal, 0},
		{"usage limit in 2 h", ClassifyFrame([]byte(`{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_in_seconds":7200}}`), false), Facts{}, Fatal, 0},
		{"insufficient quota", ClassifyFrame([]byte(`{"type":"response.failed","response":{"error":{"code":"insufficient_quota"}}}`), false), Facts{}, Fatal, 0},
		{"rate_limit_exceeded without a hint", ClassifyFrame([]byte(`{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded"}}}`), false), Facts{}, Throttled, 0},
		{"overload code", ClassifyFrame([]byte(`{"type":"response.failed","response":{"error":{"code":"server_is_overloaded","type":"invalid_request_error"}}}`), false), Facts{}, Backoff, 0},
		{"408", &UpstreamError{Status: 408}, Facts{}, Backoff, 0},
		{"409", &UpstreamError{Status: 409}, Facts{}, Backoff, 0},
		{"400", &UpstreamError{Status: 400}, Facts{}, Fatal, 0},
		{"413", &UpstreamError{Status: 413}, Facts{}, Fatal, 0},
	}
	for _, tt := range tests {
		f := Classify(tt.err, tt.facts)
		if f == nil {
			t.Errorf("%s: Classify() = nil", tt.name)
			continue
		}
		if f.Class != tt.wantClass || f.Hint != tt.wantHint {
			t.Errorf("%s: Classify() = %v hint %v, want %v hint %v", tt.name, f.Class, f.Hint, tt.wantClass, tt.wantHint)
		}
		if f.Err != error(tt.err) {
			t.Errorf("%s: Classify().Err = %v, want the upstream error itself", tt.name, f.Err)
		}
	}
	if f := Classify(nil, Facts{}); f != nil {
		t.Errorf("Classify(nil) = %+v, want nil", f)
	}
}

func TestTransportAndRefusal(t *testing.T) {
	e := errors.New("websocket closed (1006)")
	if f := Transport(e, true); f.Class != Replace || f.Err != e {
		t.Errorf("Transport(reused) = %+v, want Replace with the error", f)
	}
	if f := Transport(e, false); f.Class != Backoff || f.Err != e {
		t.Errorf("Transport(new) = %+v, want Backoff with the error", f)
	}
	if f := Refusal(4*time.Second, e); f.Class != Refused || f.Hint != 4*time.Second || f.Err != e {
		t.Errorf("Refusal() = %+v, want Refused, hint 4s, with the error", f)
	}
}

func TestFailureError(t *testing.T) {
	inner := errors.New("inner")
	f := &Failure{Class: Backoff, Err: inner}
	if f.Error() != "inner" || !errors.Is(f, inner) {
		t.Errorf("Failure{Err: inner}: Error() = %q, Is(inner) = %v", f.Error(), errors.Is(f, inner))
	}
	if got := (&Failure{Class: Throttled}).Error(); got != "retry: throttled failure" {
		t.Errorf("Failure without Err: Error() = %q", got)
	}
	if got := Class(42).String(); got != "Class(42)" {
		t.Errorf("Class(42).String() = %q", got)
	}
}

func TestFinalStopsRetries(t *testing.T) {
	inner := &Failure{Class: Backoff, Err: errors.New("socket closed after output")}
	recs, err := runScript(t, defaultBudget, 0, []error{Final(inner)})
	if len(recs) != 1 {
		t.Errorf("attempts = %d, want 1: a failure after output is never retried", len(recs))
	}
	if err != error(inner) {
		t.Errorf("Do() = %v, want the wrapped error itself", err)
	}
	if Final(nil) != nil {
		t.Error("Final(nil) != nil")
	}
}

// A response that failed with a frame that ended it keeps its socket,
// whatever its class, except a rejected credential and the failures whose
// fix is a new socket; a frame that did not end the response (an
// unreadable event) and every failure without a frame never do.
func TestKeepSocket(t *testing.T) {
	tests := []struct {
		name  string
		frame string
		want  bool
	}{
		{"server_error", `{"type":"response.failed","response":{"error":{"code":"server_error"}}}`, true},
		{"overload", `{"type":"response.failed","response":{"error":{"code":"server_is_overloaded"}}}`, true},
		{"error frame 503", `{"type":"error","status":503,"error":{"code":"service_unavailable"}}`, true},
		{"rate limit", `{"type":"response.failed","response":{"error":{"code":"rate_limit_exceeded"}}}`, true},
		{"usage limit", `{"type":"error","status":429,"error":{"code":"usage_limit_reached"}}`, true},
		{"context overflow", `{"type":"error","error":{"code":"context_length_exceeded"}}`, true},
		{"incomplete", `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"content_filter"}}}`, true},
		{"401", `{"type":"error","status":401,"error":{"code":"token_expired"}}`, false},
		{"403", `{"type":"error","status":403,"error":{"code":"account_deactivated"}}`, false},
		{"previous_response_not_found", `{"type":"error","error":{"code":"previous_response_not_found"}}`, false},
		{"connection limit", `{"type":"error","error":{"code":"websocket_connection_limit_reached"}}`, false},
	}
	for _, tt := range tests {
		frame := []byte(tt.frame)
		if !EndsResponse(frame) {
			t.Errorf("%s: EndsResponse(%s) = false, want true", tt.name, tt.frame)
		}
		f := Classify(ClassifyFrame(frame, false), Facts{ResponseEnded: true})
		if f.KeepSocket != tt.want {
			t.Errorf("%s: Classify(ResponseEnded).KeepSocket = %v, want %v", tt.name, f.KeepSocket, tt.want)
		}
		if f := Classify(ClassifyFrame(frame, false), Facts{}); f.KeepSocket {
			t.Errorf("%s: Classify without ResponseEnded keeps the socket", tt.name)
		}
	}
	for _, frame := range []string{`{"type":"response.output_text.delta","delta":`, `not json`, `{"type":"response.output_item.added"}`, `[]`} {
		if EndsResponse([]byte(frame)) {
			t.Errorf("EndsResponse(%s) = true, want false: the response may go on", frame)
		}
	}
	for _, frame := range []string{`{"type":"response.completed","response":{"output":[]}}`, `{"type":"response.done"}`} {
		if !EndsResponse([]byte(frame)) {
			t.Errorf("EndsResponse(%s) = false, want true", frame)
		}
	}
	if f := Classify(errors.New("websocket closed (1006)"), Facts{Reused: true, ResponseEnded: true}); f.KeepSocket {
		t.Error("a transport failure keeps its socket")
	}
}

// refusedAgent stands for control.AgentRefusedError: what it says of
// itself is all the failure table reads.
type refusedAgent struct{ msg string }

func (e *refusedAgent) Error() string        { return "agent credential refused" }
func (e *refusedAgent) AgentRefused() string { return e.msg }

// A data plane whose agent credential the control plane refuses answers
// 403 permission_error in the refusal's words, x-should-retry: false and
// no retry-after, however the refusal is wrapped.
func TestClassifyAgentRefused(t *testing.T) {
	refused := fmt.Errorf("choose the upstream account: %w", &refusedAgent{msg: "This data plane's agent credential \"dp-1\" was revoked; an operator must create a new one"})
	f := Classify(refused, Facts{})
	if f == nil || f.Class != Fatal || f.Kind != KindCredential {
		t.Fatalf("Classify(refused) = %+v, want Fatal, KindCredential", f)
	}
	h := http.Header{}
	e := Answer(h, f.Err.(*UpstreamError), Facts{}, func() float64 { return 0 })
	if e.Status != 403 || e.Type != "permission_error" || e.Message != "This data plane's agent credential \"dp-1\" was revoked; an operator must create a new one" {
		t.Errorf("answer = %d %s %q, want 403 permission_error in the refusal's words", e.Status, e.Type, e.Message)
	}
	if h.Get("X-Should-Retry") != "false" || h.Get("Retry-After") != "" {
		t.Errorf("headers = %v, want x-should-retry: false and no retry-after", h)
	}
	if got := CredentialFailure(refused, ""); got.Status != 403 || !got.Permanent {
		t.Errorf("CredentialFailure(refused) = %+v, want a permanent 403", got)
	}
}
