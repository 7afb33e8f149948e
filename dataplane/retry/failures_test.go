package retry

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestClassifyUpgrade(t *testing.T) {
	tests := []struct {
		status     int
		retryAfter string
		wantStatus int
		wantType   string
		wantMsg    string
		wantRetry  time.Duration
	}{
		{403, "", 429, "rate_limit_error", "OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 5s", 5 * time.Second},
		{403, "12", 429, "rate_limit_error", "OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 12s", 12 * time.Second},
		{403, "600", 429, "rate_limit_error", "OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 60s", 60 * time.Second},
		{403, "Wed, 21 Oct 2026 07:28:00 GMT", 429, "rate_limit_error", "OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 5s", 5 * time.Second},
		{403, "-3", 429, "rate_limit_error", "OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after 5s", 5 * time.Second},
		{401, "", 401, "authentication_error", "WebSocket upgrade failed (HTTP 401); retrying the same request will not help", 0},
		{404, "", 404, "not_found_error", "WebSocket upgrade failed (HTTP 404); retrying the same request will not help", 0},
		{429, "", 429, "rate_limit_error", "WebSocket upgrade failed (HTTP 429)", 0},
		{429, "7", 429, "rate_limit_error", "WebSocket upgrade failed (HTTP 429); retry after 7s", 7 * time.Second},
		{500, "", 502, "api_error", "WebSocket upgrade failed (HTTP 500)", 0},
		{502, "", 502, "api_error", "WebSocket upgrade failed (HTTP 502)", 0},
		{503, "9", 529, "overloaded_error", "WebSocket upgrade failed (HTTP 503)", 0},
		{0, "", 502, "api_error", "WebSocket upgrade failed (no HTTP status)", 0},
		{200, "", 502, "api_error", "WebSocket upgrade failed (HTTP 200)", 0},
	}
	for _, tt := range tests {
		e := ClassifyUpgrade(tt.status, tt.retryAfter)
		if e.Status != tt.wantStatus || e.Type != tt.wantType || e.Message != tt.wantMsg || e.RetryAfter != tt.wantRetry {
			t.Errorf("ClassifyUpgrade(%d, %q) = %d %s %q %v; want %d %s %q %v", tt.status, tt.retryAfter,
				e.Status, e.Type, e.Message, e.RetryAfter, tt.wantStatus, tt.wantType, tt.wantMsg, tt.wantRetry)
		}
	}
}

func TestClassifyFrame(t *testing.T) {
	tests := []struct {
		name       string
		frame      string
		wantStatus int
		wantType   string
		wantCode   string
		wantMsg    string
		wantRetry  time.Duration
		overflow   bool
	}{
		{"connection limit with hint", `{"type":"error","error":{"code":"websocket_connection_limit_reached","message":"Responses websocket connection limit reached (60 minutes).","retry_after_seconds":12}}`,
			429, "rate_limit_error", "websocket_connection_limit_reached", "OpenAI reported the Responses WebSocket connection limit was reached; retry after 12s", 12 * time.Second, false},
		{"connection limit default hint", `{"type":"error","error":{"code":"websocket_connection_limit_reached"}}`,
			429, "rate_limit_error", "websocket_connection_limit_reached", "OpenAI reported the Responses WebSocket connection limit was reached; retry after 5s", 5 * time.Second, false},
		{"connection limit string hint clamped", `{"type":"error","code":"websocket_connection_limit_reached","retry_after":"300"}`,
			429, "rate_limit_error", "websocket_connection_limit_reached", "OpenAI reported the Responses WebSocket connection limit was reached; retry after 60s", 60 * time.Second, false},
		{"previous response not found", `{"type":"error","status":400,"error":{"code":"previous_response_not_found","message":"Previous response with id 'resp_x' not found."}}`,
			400, "invalid_request_error", "previous_response_not_found", "OpenAI could not find the previous response to continue (previous_response_not_found)", 0, false},
		{"status 400 unsupported parameter", `{"type":"error","status":400,"error":{"type":"invalid_request_error","code":"unsupported_parameter","message":"Unsupported parameter: reasoning.summary","param":"reasoning.summary"}}`,
			400, "invalid_request_error", "unsupported_parameter", "OpenAI rejected the request (HTTP 400: invalid_request_error / unsupported_parameter); retrying the same request will not help", 0, false},
		{"usage limit: no invented hint", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"Usage limit reached. Resets in 4 hours."}}`,
			429, "rate_limit_error", "", "The ChatGPT plan's usage limit was reached (usage_limit_reached); the backend did not say when it resets, so retrying soon will not help", 0, false},
		{"429 with stated hint", `{"type":"error","status":429,"error":{"type":"rate_limit_exceeded","retry_after_seconds":3}}`,
			429, "rate_limit_error", "", "OpenAI rejected the request (HTTP 429: rate_limit_exceeded); retry after 3s", 3 * time.Second, false},
		{"error.status 503 is overloaded", `{"type":"error","error":{"status":503,"message":"busy"}}`,
			529, "overloaded_error", "", "OpenAI rejected the request (HTTP 503)", 0, false},
		{"status 500 becomes 502", `{"type":"error","status":500,"error":{"type":"server_error"}}`,
			502, "api_error", "", "OpenAI rejected the request (HTTP 500: server_error)", 0, false},
		{"status 401", `{"type":"error","status":401,"error":{"type":"invalid_api_key"}}`,
			401, "authentication_error", "", "OpenAI rejected the request (HTTP 401: invalid_api_key); retrying the same request will not help", 0, false},
		{"failed usage_limit_reached code", `{"type":"response.failed","response":{"id":"r","status":"failed","error":{"code":"usage_limit_reached","message":"x"}}}`,
			429, "rate_limit_error", "usage_limit_reached", "The ChatGPT plan's usage limit was reached (usage_limit_reached); the backend did not say when it resets, so retrying soon will not help", 0, false},
		{"failed overloaded", `{"type":"response.failed","response":{"error":{"type":"overloaded_error"}}}`,
			529, "overloaded_error", "", "OpenAI ended the response with no output (overloaded_error)", 0, false},
		{"failed server_error", `{"type":"response.failed","response":{"error":{"code":"server_error"}}}`,
			502, "api_error", "server_error", "OpenAI ended the response with no output (server_error)", 0, false},
		{"failed authentication", `{"type":"response.failed","response":{"error":{"type":"authentication_error"}}}`,
			401, "authentication_error", "", "OpenAI ended the response with no output (authentication_error); retrying the same request will not help", 0, false},
		{"failed permission", `{"type":"response.failed","response":{"error":{"code":"permission_denied"}}}`,
			403, "permission_error", "permission_denied", "OpenAI ended the response with no output (permission_denied); retrying the same request will not help", 0, false},
		{"code 401 digits", `{"type":"response.failed","response":{"error":{"code":"401"}}}`,
			401, "authentication_error", "401", "OpenAI ended the response with no output (401); retrying the same request will not help", 0, false},
		{"timeout is 504 → 502", `{"type":"response.failed","response":{"error":{"code":"upstream_timeout"}}}`,
			502, "api_error", "upstream_timeout", "OpenAI ended the response with no output (upstream_timeout)", 0, false},
		{"error without status or ids", `{"type":"error","message":"something"}`,
			502, "api_error", "", "OpenAI ended the response with no output (error)", 0, false},
		{"incomplete content_filter", `{"type":"response.incomplete","response":{"status":"incomplete","incomplete_details":{"reason":"content_filter"}}}`,
			400, "invalid_request_error", "", "OpenAI ended the response with no output (content_filter); retrying the same request will not help", 0, false},
		{"incomplete max_output_tokens", `{"type":"response.incomplete","response":{"incomplete_details":{"reason":"max_output_tokens"}}}`,
			400, "invalid_request_error", "", "OpenAI ended the response with no output (max_output_tokens); retrying the same request will not help", 0, false},
		{"context length code", `{"type":"response.failed","response":{"error":{"code":"context_length_exceeded","message":"too long"}}}`,
			400, "invalid_request_error", "context_length_exceeded", "prompt is too long", 0, true},
		{"context length from prose", `{"type":"error","status":400,"error":{"message":"This model's maximum context length is 272000 tokens."}}`,
			400, "invalid_request_error", "", "prompt is too long", 0, true},
		{"unbounded identifiers dropped", `{"type":"response.failed","response":{"error":{"code":"has spaces and is prose","type":"` + strings.Repeat("x", 80) + `"}}}`,
			502, "api_error", "", "OpenAI ended the response with no output (response.failed)", 0, false},
		{"response.status string is not an HTTP status", `{"type":"response.failed","status":"failed","response":{"status":"failed"}}`,
			502, "api_error", "", "OpenAI ended the response with no output (response.failed)", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ClassifyFrame([]byte(tt.frame), false)
			if e == nil {
				t.Fatal("nil")
			}
			if e.Status != tt.wantStatus || e.Type != tt.wantType || e.Code != tt.wantCode || e.Message != tt.wantMsg || e.RetryAfter != tt.wantRetry || e.ContextOverflow != tt.overflow {
				t.Errorf("got %d %s code=%q %q retry=%v overflow=%v\nwant %d %s code=%q %q retry=%v overflow=%v",
					e.Status, e.Type, e.Code, e.Message, e.RetryAfter, e.ContextOverflow,
					tt.wantStatus, tt.wantType, tt.wantCode, tt.wantMsg, tt.wantRetry, tt.overflow)
			}
		})
	}
	if e := ClassifyFrame([]byte(`{"type":"response.output_text.delta","delta":"x"}`), false); e != nil {
		t.Errorf("non-failure frame classified: %+v", e)
	}
	if e := ClassifyFrame([]byte(`garbage`), false); e == nil || e.Status != 502 {
		t.Errorf("garbage: %+v", e)
	}
}

func TestErrorBody(t *testing.T) {
	e := &UpstreamError{Status: 529, Type: "overloaded_error", Message: `say "hi"`}
	if got, want := string(ErrorBody(e)), `{"type":"error","error":{"type":"overloaded_error","message":"say \"hi\""}}`; got != want {
		t.Errorf("got %s want %s", got, want)
	}
	o := &UpstreamError{Status: 400, Type: "invalid_request_error", Message: "prompt is too long: 5 tokens > 4 maximum", ContextOverflow: true}
	got := string(ErrorBody(o))
	if !strings.HasPrefix(got, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 5 tokens > 4 maximum"},"request_id":"`) || len(got) < 100 {
		t.Errorf("overflow body %s", got)
	}
	if got := string(ErrorBody(nil)); got != `{"type":"error","error":{"type":"api_error","message":"Upstream model request failed."}}` {
		t.Errorf("nil body %s", got)
	}
}

func TestRetryable(t *testing.T) {
	for status, want := range map[int]bool{400: false, 401: false, 403: false, 408: true, 409: true, 429: true, 502: true, 529: true} {
		if got := (&UpstreamError{Status: status}).Retryable(); got != want {
			t.Errorf("Retryable(%d) = %v", status, got)
		}
	}
}

// A usage limit carries its reset time (resets_in_seconds) wherever the
// backend put it; anything else has none.
func TestClassifyFrameUsageLimitReset(t *testing.T) {
	tests := []struct {
		name       string
		frame      string
		wantStatus int
		wantReset  time.Duration
	}{
		{"error object, 4 h", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"x","plan_type":"plus","resets_in_seconds":14400}}`,
			429, 4 * time.Hour},
		{"error object, 30 s", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":30}}`,
			429, 30 * time.Second},
		{"numeric string", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":" 8123 "}}`,
			429, 8123 * time.Second},
		{"fraction rounds", `{"type":"error","error":{"code":"usage_limit_reached","resets_in_seconds":29.6}}`,
			429, 30 * time.Second},
		{"response.error of response.failed", `{"type":"response.failed","response":{"error":{"code":"usage_limit_reached","resets_in_seconds":45}}}`,
			429, 45 * time.Second},
		{"on the frame", `{"type":"error","code":"usage_limit_reached","resets_in_seconds":120}`,
			429, 2 * time.Minute},
		{"usage_not_included without status", `{"type":"error","error":{"type":"usage_not_included","resets_in_seconds":600}}`,
			429, 10 * time.Minute},
		{"huge is bounded", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":1e300}}`,
			429, MaxResetsIn},
		{"negative is unknown", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":-5}}`,
			429, 0},
		{"not a number is unknown", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","resets_in_seconds":"soon"}}`,
			429, 0},
		{"absent is unknown", `{"type":"error","status":429,"error":{"type":"usage_limit_reached"}}`,
			429, 0},
		{"other 429 ignores it", `{"type":"error","status":429,"error":{"type":"rate_limit_exceeded","resets_in_seconds":30}}`,
			429, 0},
		{"usage limit with a non-429 status ignores it", `{"type":"error","status":400,"error":{"type":"usage_limit_reached","resets_in_seconds":30}}`,
			400, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ClassifyFrame([]byte(tt.frame), false)
			if e == nil {
				t.Fatal("ClassifyFrame = nil, want a failure")
			}
			if e.Status != tt.wantStatus || e.ResetsIn != tt.wantReset {
				t.Errorf("status %d, ResetsIn %v; want %d, %v", e.Status, e.ResetsIn, tt.wantStatus, tt.wantReset)
			}
			if strings.Contains(e.Message, "8123") || strings.Contains(e.Message, "14400") {
				t.Errorf("message %q echoes the upstream numbers", e.Message)
			}
		})
	}
}

// TestClassifyKnownCodes runs every error code the backend is known to send
// through a failed response, paired with the error type the backend (or
// clodex-sim) sends with it, plus codes nobody has seen. The code decides:
// an overload code paired with invalid_request_error is still an overload.
func TestClassifyKnownCodes(t *testing.T) {
	tests := []struct {
		code, errType string
		wantStatus    int
		wantType      string
	}{
		// Overload: 529, retryable.
		{"server_is_overloaded", "service_unavailable_error", 529, "overloaded_error"},
		{"server_is_overloaded", "invalid_request_error", 529, "overloaded_error"},
		{"overloaded", "", 529, "overloaded_error"},
		{"overloaded_error", "", 529, "overloaded_error"},
		{"slow_down", "rate_limit_error", 529, "overloaded_error"},
		{"slow_down", "invalid_request_error", 529, "overloaded_error"},
		{"service_unavailable", "", 529, "overloaded_error"},
		{"service_unavailable_error", "", 529, "overloaded_error"},
		// Server failures: 502, retryable.
		{"server_error", "server_error", 502, "api_error"},
		{"server_error", "invalid_request_error", 502, "api_error"},
		{"internal_server_error", "", 502, "api_error"},
		{"internal_error", "", 502, "api_error"},
		{"api_error", "", 502, "api_error"},
		{"bad_gateway", "", 502, "api_error"},
		{"vector_store_timeout", "", 502, "api_error"},
		{"timeout", "", 502, "api_error"},
		{"upstream_timeout", "", 502, "api_error"},
		// Limits.
		{"rate_limit_exceeded", "rate_limit_error", 429, "rate_limit_error"},
		{"rate_limit_error", "", 429, "rate_limit_error"},
		{"too_many_requests", "", 429, "rate_limit_error"},
		{"usage_limit_reached", "usage_limit_reached", 429, "rate_limit_error"},
		{"usage_not_included", "usage_not_included", 429, "rate_limit_error"},
		{"insufficient_quota", "insufficient_quota", 429, "rate_limit_error"},
		{"response_in_progress", "invalid_request_error", 409, "api_error"},
		{"conflict", "", 409, "api_error"},
		{"request_timeout", "", 408, "api_error"},
		// Credentials and access.
		{"authentication_error", "", 401, "authentication_error"},
		{"token_expired", "invalid_request_error", 401, "authentication_error"},
		{"token_invalidated", "", 401, "authentication_error"},
		{"invalid_api_key", "", 400, "invalid_request_error"},
		{"account_deactivated", "", 403, "permission_error"},
		{"permission_error", "", 403, "permission_error"},
		{"permission_denied", "", 403, "permission_error"},
		{"unsupported_country", "", 403, "permission_error"},
		{"not_found_error", "", 404, "not_found_error"},
		{"model_not_found", "invalid_request_error", 404, "not_found_error"},
		// The request is refused.
		{"request_too_large", "invalid_request_error", 413, "request_too_large"},
		{"string_above_max_length", "invalid_request_error", 400, "invalid_request_error"},
		{"invalid_request_error", "", 400, "invalid_request_error"},
		{"invalid_prompt", "invalid_request_error", 400, "invalid_request_error"},
		{"invalid_value", "invalid_request_error", 400, "invalid_request_error"},
		{"invalid_type", "invalid_request_error", 400, "invalid_request_error"},
		{"invalid_json", "invalid_request_error", 400, "invalid_request_error"},
		{"unsupported_parameter", "invalid_request_error", 400, "invalid_request_error"},
		{"unsupported_value", "invalid_request_error", 400, "invalid_request_error"},
		{"unknown_parameter", "invalid_request_error", 400, "invalid_request_error"},
		{"missing_required_parameter", "invalid_request_error", 400, "invalid_request_error"},
		{"content_policy_violation", "", 400, "invalid_request_error"},
		{"cyber_policy", "", 400, "invalid_request_error"},
		{"invalid_image", "", 400, "invalid_request_error"},
		{"invalid_image_format", "", 400, "invalid_request_error"},
		{"invalid_base64_image", "", 400, "invalid_request_error"},
		{"invalid_image_url", "", 400, "invalid_request_error"},
		{"image_too_large", "", 400, "invalid_request_error"},
		{"image_too_small", "", 400, "invalid_request_error"},
		{"image_parse_error", "", 400, "invalid_request_error"},
		{"image_content_policy_violation", "", 400, "invalid_request_error"},
		{"invalid_image_mode", "", 400, "invalid_request_error"},
		{"image_file_too_large", "", 400, "invalid_request_error"},
		{"unsupported_image_media_type", "", 400, "invalid_request_error"},
		{"empty_image_file", "", 400, "invalid_request_error"},
		{"failed_to_download_image", "", 400, "invalid_request_error"},
		{"context_length_exceeded", "invalid_request_error", 400, "invalid_request_error"},
		{"image_file_not_found", "", 400, "invalid_request_error"},
		{"invalid_file", "", 400, "invalid_request_error"},
		{"unsupported_file", "", 400, "invalid_request_error"},
		// Unknown codes: the type decides, else indeterminate (502).
		{"brand_new_failure", "", 502, "api_error"},
		{"brand_new_failure", "server_error", 502, "api_error"},
		{"brand_new_failure", "invalid_request_error", 400, "invalid_request_error"},
		{"new_overload_signal", "", 529, "overloaded_error"},
		// An unknown code's own words decide before a known type.
		{"server_overloaded_now", "invalid_request_error", 529, "overloaded_error"},
		{"backend_unavailable", "invalid_request_error", 529, "overloaded_error"},
		{"weird_rate_limit_thing", "invalid_request_error", 429, "rate_limit_error"},
		{"weird_rate_limit_thing", "", 429, "rate_limit_error"},
		{"", "", 502, "api_error"},
		{"", "overloaded_error", 529, "overloaded_error"},
		{"", "server_error", 502, "api_error"},
	}
	tested := map[string]bool{}
	for _, tt := range tests {
		tested[tt.code] = true
		frame := fmt.Sprintf(`{"type":"response.failed","response":{"status":"failed","error":{"code":%q,"type":%q,"message":"prose"}}}`, tt.code, tt.errType)
		e := ClassifyFrame([]byte(frame), false)
		if e == nil {
			t.Errorf("%s/%s: ClassifyFrame = nil", tt.code, tt.errType)
			continue
		}
		if e.Status != tt.wantStatus || e.Type != tt.wantType {
			t.Errorf("%s/%s: status %d %s, want %d %s", tt.code, tt.errType, e.Status, e.Type, tt.wantStatus, tt.wantType)
		}
		if strings.Contains(e.Message, "prose") {
			t.Errorf("%s: message %q copies upstream prose", tt.code, e.Message)
		}
		// The same code in an error frame without a status classifies alike.
		e2 := ClassifyFrame(fmt.Appendf(nil, `{"type":"error","error":{"code":%q,"type":%q}}`, tt.code, tt.errType), false)
		if e2.Status != tt.wantStatus {
			t.Errorf("%s/%s in an error frame: status %d, want %d", tt.code, tt.errType, e2.Status, tt.wantStatus)
		}
	}
	for code := range knownCodes {
		if !tested[code] {
			t.Errorf("known code %q has no row in this table", code)
		}
	}
}

func TestUsageLimitMessages(t *testing.T) {
	tests := []struct {
		name, frame string
		want        string
		retryable   bool
	}{
		{"far, with plan and reset time", `{"type":"error","status":429,"error":{"type":"usage_limit_reached","code":"usage_limit_reached","plan_type":"plus","resets_in_seconds":8123,"resets_at":1779398785}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached, plus plan); it resets in 2h16m (at 2026-05-21T21:26:25Z); retrying before then will not help", false},
		{"near", `{"type":"response.failed","response":{"error":{"code":"usage_limit_reached","resets_in_seconds":42}}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 42s", true},
		{"exactly 60 s is near", `{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_in_seconds":60}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 1m", true},
		{"61 s is far", `{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_in_seconds":61}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets in 1m1s; retrying before then will not help", false},
		{"only resets_at", `{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_at":1779398785}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); it resets at 2026-05-21T21:26:25Z; retrying before then will not help", false},
		{"not included", `{"type":"error","status":429,"error":{"type":"usage_not_included","plan_type":"free","resets_in_seconds":86400}}`,
			"The ChatGPT plan does not include this usage (usage_not_included, free plan); it resets in 24h0m; retrying before then will not help", false},
		{"quota", `{"type":"response.failed","response":{"error":{"code":"insufficient_quota"}}}`,
			"The account has no quota left (insufficient_quota); the backend did not say when it resets, so retrying soon will not help", false},
		{"implausible resets_at is ignored", `{"type":"error","status":429,"error":{"code":"usage_limit_reached","resets_at":12}}`,
			"The ChatGPT plan's usage limit was reached (usage_limit_reached); the backend did not say when it resets, so retrying soon will not help", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := ClassifyFrame([]byte(tt.frame), false)
			if e.Status != 429 || !e.UsageLimit {
				t.Fatalf("status %d, UsageLimit %v; want 429, true", e.Status, e.UsageLimit)
			}
			if e.Message != tt.want {
				t.Errorf("message\n got %q\nwant %q", e.Message, tt.want)
			}
			if e.Retryable() != tt.retryable {
				t.Errorf("Retryable() = %v, want %v", e.Retryable(), tt.retryable)
			}
			if e.RetryAfter != 0 {
				t.Errorf("RetryAfter = %v, want none: a usage limit's wait is its reset", e.RetryAfter)
			}
		})
	}
}

func TestFormatWait(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 500 * time.Millisecond: "1s", 42 * time.Second: "42s", time.Minute: "1m", 61 * time.Second: "1m1s",
		time.Hour: "1h0m", 8123 * time.Second: "2h16m", 47 * time.Hour: "47h0m", 49 * time.Hour: "2d1h",
	} {
		if got := FormatWait(d); got != want {
			t.Errorf("FormatWait(%v) = %q, want %q", d, got, want)
		}
	}
}
