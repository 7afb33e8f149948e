package retry

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// UpstreamError is a classified upstream failure, ready to be sent to the
// Anthropic client. Message is always in our own words: upstream prose is
// never copied into it (it can echo request content).
type UpstreamError struct {
	Status          int           // HTTP status to send the client
	Type            string        // Anthropic error type
	Code            string        // upstream code if any (a bounded identifier)
	Message         string        // our own words
	RetryAfter      time.Duration // hint for the retry-after header (0 = none)
	ContextOverflow bool          // the prompt did not fit the model's window
	RequestID       string        // request_id for the overflow body; ErrorBody invents one when empty
	// UsageLimit marks a plan usage limit (usage_limit_reached,
	// usage_not_included, insufficient_quota): waiting for the reset is
	// the only fix, so it is never retried inside the data plane.
	UsageLimit bool
	// ResetsIn is how long until a usage limit resets (resets_in_seconds,
	// at most MaxResetsIn); 0 means unknown or not a usage limit.
	ResetsIn time.Duration
	// ResetsAt is when a usage limit resets (resets_at), zero when the
	// backend did not say; Answer fills it from ResetsIn and Facts.Now.
	ResetsAt time.Time
	// limit and plan are a frame's usage-limit code and plan_type, from
	// which Answer words the message again once it knows the reset time.
	limit, plan string
	// Permanent says a retry cannot fix it (a sign-in someone must
	// renew): x-should-retry: false.
	Permanent bool
	// Cause is the error behind it, for the log; never sent to the client.
	Cause error
}

func (e *UpstreamError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("upstream %s (HTTP %d): %s: %v", e.Type, e.Status, e.Message, e.Cause)
	}
	return fmt.Sprintf("upstream %s (HTTP %d): %s", e.Type, e.Status, e.Message)
}

// Unwrap returns the cause.
func (e *UpstreamError) Unwrap() error { return e.Cause }

// Retryable reports whether a client may retry the request: 408, 409, 429
// and 5xx, except a usage limit that resets more than MaxRetryAfter from
// now or at an unknown time.
func (e *UpstreamError) Retryable() bool {
	switch {
	case e.UsageLimit:
		return e.ResetsIn > 0 && e.ResetsIn <= MaxRetryAfter
	case e.Status == 408, e.Status == 409, e.Status == 429, e.Status >= 500:
		return true
	}
	return false
}

// Retry hints: a hint defaults to 5 s and is capped at 60 s, below the
// 120 s no-data deadline (docs/errors.md §4.2).
const (
	DefaultRetryAfter = 5 * time.Second
	MaxRetryAfter     = 60 * time.Second
)

// Upstream codes with special handling.
const (
	CodeConnectionLimit          = "websocket_connection_limit_reached"
	CodePreviousResponseNotFound = "previous_response_not_found"
	CodeUsageLimitReached        = "usage_limit_reached"
	CodeUsageNotIncluded         = "usage_not_included"
	CodeInsufficientQuota        = "insufficient_quota"
)

func clampRetry(secs float64, present bool) time.Duration {
	if !present || math.IsNaN(secs) || math.IsInf(secs, 0) || secs < 0 {
		return DefaultRetryAfter
	}
	d := time.Duration(math.Round(secs)) * time.Second
	return min(d, MaxRetryAfter)
}

// statusType maps an upstream HTTP-like status to the status and Anthropic
// error type the client receives: 503 (and 529) become 529
// overloaded_error; every other 5xx, and anything outside 400-599, 502
// api_error.
func statusType(s int) (int, string) {
	switch {
	case s == 400:
		return 400, "invalid_request_error"
	case s == 401:
		return 401, "authentication_error"
	case s == 403:
		return 403, "permission_error"
	case s == 404:
		return 404, "not_found_error"
	case s == 413:
		return 413, "request_too_large"
	case s == 429:
		return 429, "rate_limit_error"
	case s == 503, s == 529:
		return 529, "overloaded_error"
	case s >= 400 && s < 500:
		return s, "api_error"
	}
	return 502, "api_error"
}

// UnreadableEvent is the failure of a response whose event eventType (""
// when not even the type could be read) was not the JSON the protocol
// defines.
func UnreadableEvent(eventType string) *UpstreamError {
	if eventType == "" {
		return NewUpstreamError(502, "", "OpenAI sent an unreadable event")
	}
	if identifier(eventType) == "" {
		eventType = "upstream"
	}
	return NewUpstreamError(502, "", "OpenAI sent an unreadable "+eventType+" event")
}

// NewUpstreamError is a failure with the client status and Anthropic type
// the upstream status maps to (502 api_error outside 400-599, 529
// overloaded_error for 503 and 529), code and message.
func NewUpstreamError(status int, code, msg string) *UpstreamError {
	s, typ := statusType(status)
	return &UpstreamError{Status: s, Type: typ, Code: code, Message: msg}
}

// ClassifyUpgrade maps a failed WebSocket upgrade (docs/errors.md §2.2).
// retryAfterHeader is the response's retry-after header
// ("" if absent); only an integer number of seconds counts.
func ClassifyUpgrade(status int, retryAfterHeader string) *UpstreamError {
	secs, err := strconv.Atoi(strings.TrimSpace(retryAfterHeader))
	hinted := err == nil && secs >= 0
	switch {
	case status == 403:
		d := clampRetry(float64(secs), hinted)
		e := NewUpstreamError(429, "", fmt.Sprintf("OpenAI edge throttled the Responses WebSocket upgrade (HTTP 403); retry after %ds", int(d/time.Second)))
		e.RetryAfter = d
		return e
	case status < 100:
		return NewUpstreamError(502, "", "WebSocket upgrade failed (no HTTP status)")
	}
	e := NewUpstreamError(status, "", fmt.Sprintf("WebSocket upgrade failed (HTTP %d)", status))
	if e.Status == 429 && hinted {
		e.RetryAfter = clampRetry(float64(secs), true)
		e.Message += fmt.Sprintf("; retry after %ds", int(e.RetryAfter/time.Second))
	}
	e.Message += settledAdvice(e.Status)
	return e
}

// frameFields are the identifiers read from an error or failure frame.
type frameFields struct {
	frameType        string
	errType          string
	code             string
	incompleteReason string
	status           int // an integer 400-599 in status or error.status, else 0
	retry            float64
	retryPresent     bool
	resets           float64 // resets_in_seconds
	resetsPresent    bool
	resetsAt         float64 // resets_at, Unix seconds
	resetsAtPresent  bool
	plan             string // plan_type
	overflow         bool
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }

// identifier returns v as a bounded identifier (letters, digits, _ . : -,
// at most 64 bytes) or "".
func identifier(v any) string {
	var s string
	switch x := v.(type) {
	case string:
		s = x
	case json.Number:
		s = x.String()
	default:
		return ""
	}
	if s == "" || len(s) > 64 {
		return ""
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '-') {
			return ""
		}
	}
	return s
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil
	}
	return 0, false
}

func httpStatus(v any) int {
	n, ok := v.(json.Number)
	if !ok {
		return 0
	}
	i, err := strconv.Atoi(n.String())
	if err != nil || i < 400 || i > 599 {
		return 0
	}
	return i
}

func firstNonEmpty(ss ...string) string {
	for _, s := range ss {
		if s != "" {
			return s
		}
	}
	return ""
}

func readFrame(m map[string]any) frameFields {
	f := frameFields{frameType: identifier(m["type"])}
	errObj := asMap(m["error"])
	resp := asMap(m["response"])
	respErr := asMap(resp["error"])
	f.code = firstNonEmpty(identifier(m["code"]), identifier(errObj["code"]), identifier(respErr["code"]))
	f.errType = firstNonEmpty(identifier(errObj["type"]), identifier(respErr["type"]))
	f.incompleteReason = identifier(asMap(resp["incomplete_details"])["reason"])
	if f.frameType == "error" {
		f.status = httpStatus(m["status"])
		if f.status == 0 {
			f.status = httpStatus(errObj["status"])
		}
	}
	for _, obj := range []map[string]any{m, errObj, respErr} {
		for _, k := range []string{"retry_after_seconds", "retry_after"} {
			if v, ok := number(obj[k]); ok && !f.retryPresent {
				f.retry, f.retryPresent = v, true
			}
		}
	}
	for _, obj := range []map[string]any{errObj, respErr, m} {
		if v, ok := number(obj["resets_in_seconds"]); ok && !f.resetsPresent {
			f.resets, f.resetsPresent = v, true
		}
		if v, ok := number(obj["resets_at"]); ok && !f.resetsAtPresent {
			f.resetsAt, f.resetsAtPresent = v, true
		}
		if f.plan == "" {
			f.plan = identifier(obj["plan_type"])
		}
	}
	disc := strings.ToLower(f.code + " " + f.errType)
	f.overflow = strings.Contains(disc, "context_length") || strings.Contains(disc, "context_window")
	if !f.overflow {
		// The prose is scanned, never copied.
		for _, obj := range []map[string]any{m, errObj, respErr} {
			msg, _ := obj["message"].(string)
			msg = strings.ToLower(msg)
			if strings.Contains(msg, "context_length_exceeded") || strings.Contains(msg, "maximum context length") || strings.Contains(msg, "prompt is too long") {
				f.overflow = true
			}
		}
	}
	return f
}

// knownCodes are the error codes the backend is known to send in error
// frames and failed responses, with the status the client gets. A code
// decides before the error type: the backend pairs codes with types loosely
// (an overload code with invalid_request_error has been seen), and the code
// is the precise half.
var knownCodes = map[string]int{
	// Overload: the backend is busy; retrying in a moment helps.
	"server_is_overloaded":      529,
	"overloaded":                529,
	"overloaded_error":          529,
	"slow_down":                 529,
	"service_unavailable":       529,
	"service_unavailable_error": 529,
	// Other server failures: indeterminate, retryable.
	"server_error":          502,
	"internal_server_error": 502,
	"internal_error":        502,
	"api_error":             502,
	"bad_gateway":           502,
	"vector_store_timeout":  502,
	"timeout":               502,
	"upstream_timeout":      502,
	// Rate and plan limits.
	"rate_limit_exceeded":     429,
	"rate_limit_error":        429,
	"too_many_requests":       429,
	CodeUsageLimitReached:     429,
	CodeUsageNotIncluded:      429,
	CodeInsufficientQuota:     429,
	"response_in_progress":    409,
	"conflict":                409,
	"request_timeout":         408,
	"authentication_error":    401,
	"token_expired":           401,
	"token_invalidated":       401,
	"account_deactivated":     403,
	"permission_error":        403,
	"permission_denied":       403,
	"unsupported_country":     403,
	"not_found_error":         404,
	"model_not_found":         404,
	"request_too_large":       413,
	"string_above_max_length": 400,
	// The request itself is refused; retrying it unchanged will not help.
	"invalid_request_error":          400,
	"invalid_prompt":                 400,
	"invalid_value":                  400,
	"invalid_type":                   400,
	"invalid_json":                   400,
	"unsupported_parameter":          400,
	"unsupported_value":              400,
	"unknown_parameter":              400,
	"missing_required_parameter":     400,
	"invalid_api_key":                400, // a quirk kept on purpose: not an expired sign-in
	"context_length_exceeded":        400,
	"content_policy_violation":       400,
	"cyber_policy":                   400,
	"invalid_image":                  400,
	"invalid_image_format":           400,
	"invalid_base64_image":           400,
	"invalid_image_url":              400,
	"image_too_large":                400,
	"image_too_small":                400,
	"image_parse_error":              400,
	"image_content_policy_violation": 400,
	"invalid_image_mode":             400,
	"image_file_too_large":           400,
	"unsupported_image_media_type":   400,
	"empty_image_file":               400,
	"failed_to_download_image":       400,
	"image_file_not_found":           400,
	"invalid_file":                   400,
	"unsupported_file":               400,
}

// frameStatusCode is the classifier of docs/errors.md §4.2, code first: a
// code of three digits 400-599 is that status; then the code alone is
// looked up (knownCodes, then the substring rules), then the type alone,
// the same way. It returns 0 when nothing matched (the caller decides: 502
// or a settled 400).
func frameStatusCode(code, errType string) int {
	if len(code) == 3 {
		if n, err := strconv.Atoi(code); err == nil && n >= 400 && n <= 599 {
			return n
		}
	}
	// The code decides before the type, whole: an unknown code such as
	// "backend_unavailable" paired with invalid_request_error is read by
	// its own words (overload) before the type's table entry (400).
	for _, id := range []string{code, errType} {
		if id == "" {
			continue
		}
		id = strings.ToLower(id)
		if s, ok := knownCodes[id]; ok {
			return s
		}
		if s := discriminatorStatus(id); s != 0 {
			return s
		}
	}
	return 0
}

// discriminatorStatus applies the substring rules of docs/errors.md §4.2 to one
// identifier, with overload and throttling ahead of "invalid" so that an
// overload code never reads as a bad request; 0 when none matches.
func discriminatorStatus(d string) int {
	if d == "" {
		return 0
	}
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(d, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has("insufficient_quota", "rate_limit", "usage_limit", "usage_not_included"):
		return 429
	case has("overload", "slow_down", "unavailable"):
		return 529
	case has("authentication"):
		return 401
	case has("permission"):
		return 403
	case has("not_found"):
		return 404
	case has("invalid", "bad_request", "context_length"):
		return 400
	case has("timeout"):
		return 504
	}
	return 0
}

func (f frameFields) identifiers() string {
	var ids []string
	for _, s := range []string{f.errType, f.code, f.incompleteReason} {
		if s != "" && !slices.Contains(ids, s) {
			ids = append(ids, s)
		}
	}
	return strings.Join(ids, " / ")
}

// usageLimit returns the plan usage-limit code of the frame
// (usage_limit_reached, usage_not_included, insufficient_quota), or "".
func (f frameFields) usageLimit() string {
	for _, s := range []string{f.code, f.errType} {
		switch s {
		case CodeUsageLimitReached, CodeUsageNotIncluded, CodeInsufficientQuota:
			return s
		}
	}
	return ""
}

// ClassifyFrame classifies an error, response.failed or
// response.incomplete frame that arrived before any output
// (docs/errors.md §4). It returns nil for a frame that is not a
// failure. A frame with code previous_response_not_found yields Code set
// to CodePreviousResponseNotFound so the caller can retry on a fresh
// socket with the full input (docs/pool.md §7).
//
// afterOutput says the frame ended a response whose output the client has
// begun to receive; only the message differs ("after output had started").
func ClassifyFrame(event []byte, afterOutput bool) *UpstreamError {
	v, err := decodeFrame(event)
	m := asMap(v)
	if err != nil || m == nil {
		return NewUpstreamError(502, "", "OpenAI sent an unreadable event")
	}
	f := readFrame(m)
	switch f.frameType {
	case "error", "response.failed", "response.incomplete":
	default:
		return nil
	}
	switch {
	case f.code == CodeConnectionLimit:
		e := NewUpstreamError(429, f.code, "")
		e.RetryAfter = clampRetry(f.retry, f.retryPresent)
		e.Message = fmt.Sprintf("OpenAI reported the Responses WebSocket connection limit was reached; retry after %ds", int(e.RetryAfter/time.Second))
		return e
	case f.code == CodePreviousResponseNotFound:
		return NewUpstreamError(400, f.code, "OpenAI could not find the previous response to continue ("+f.code+")")
	case f.overflow:
		e := NewUpstreamError(400, f.code, "prompt is too long")
		e.ContextOverflow = true
		return e
	}
	ids := f.identifiers()
	var status int
	var msg string
	if f.status != 0 {
		status = f.status
		msg = fmt.Sprintf("OpenAI rejected the request (HTTP %d)", status)
		if ids != "" {
			msg = fmt.Sprintf("OpenAI rejected the request (HTTP %d: %s)", status, ids)
		}
	} else {
		status = frameStatusCode(f.code, f.errType)
		if status == 0 || status == 500 {
			status = 502
			if f.incompleteReason == "content_filter" || f.incompleteReason == "max_output_tokens" {
				status = 400
			}
		}
		what := "OpenAI ended the response with no output"
		if afterOutput {
			what = "OpenAI ended the response after output had started"
		}
		msg = fmt.Sprintf("%s (%s)", what, firstNonEmpty(ids, f.frameType))
	}
	e := NewUpstreamError(status, f.code, msg)
	if code := f.usageLimit(); e.Status == 429 && code != "" {
		e.UsageLimit, e.limit, e.plan = true, code, f.plan
		e.ResetsIn = resetsIn(f.resets, f.resetsPresent)
		e.ResetsAt = resetsAt(f.resetsAt, f.resetsAtPresent)
		e.Message = usageLimitMessage(code, f.plan, e.ResetsIn, e.ResetsAt)
		return e
	}
	if e.Status == 429 && f.retryPresent {
		e.RetryAfter = clampRetry(f.retry, true)
		e.Message += fmt.Sprintf("; retry after %ds", int(e.RetryAfter/time.Second))
	}
	e.Message += settledAdvice(e.Status)
	return e
}

// settledAdvice is the clause that tells the user a retry will not help,
// for a status no client should retry; "" for the retryable ones (the
// gateway adds when to retry).
func settledAdvice(status int) string {
	switch {
	case status == 408, status == 409, status == 429, status >= 500:
		return ""
	}
	return "; retrying the same request will not help"
}

// FormatWait renders a wait for a person, rounded up to the unit shown:
// "42s", "12m5s", "2h16m", "3d4h".
func FormatWait(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", max(s, 0))
	case s < 3600:
		if s%60 == 0 {
			return fmt.Sprintf("%dm", s/60)
		}
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	case s < 48*3600:
		m := (s + 59) / 60 // whole minutes, rounded up: never promise too early
		return fmt.Sprintf("%dh%dm", m/60, m%60)
	}
	h := (s + 3599) / 3600
	return fmt.Sprintf("%dd%dh", h/24, h%24)
}

// Overflow returns e with the context-overflow message Claude Code parses
// to trigger auto-compaction: "prompt is too long: N tokens > W maximum",
// N = max(estimate, W+1), W = window, the model's context window
// (docs/errors.md §4.3), estimate the request's estimated input tokens.
// Other errors are returned unchanged.
func Overflow(e *UpstreamError, window, estimate int) *UpstreamError {
	if e == nil || !e.ContextOverflow {
		return e
	}
	w := max(window, 1)
	n := max(estimate, w+1)
	c := *e
	c.Status, c.Type = 400, "invalid_request_error"
	c.Message = fmt.Sprintf("prompt is too long: %d tokens > %d maximum", n, w)
	return &c
}

// ErrorBody renders the Anthropic error body
// {"type":"error","error":{"type":…,"message":…}}, adding request_id for a
// context overflow. The same JSON is the data of an SSE error event.
func ErrorBody(e *UpstreamError) []byte {
	if e == nil {
		e = NewUpstreamError(502, "", "Upstream model request failed.")
	}
	body := errorBody{Type: "error"}
	body.Error.Type, body.Error.Message = e.Type, e.Message
	if body.Error.Type == "" {
		_, body.Error.Type = statusType(e.Status)
	}
	if e.ContextOverflow {
		body.RequestID = e.RequestID
		if body.RequestID == "" {
			body.RequestID = newUUID()
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(body) // strings only: it cannot fail
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// errorBody is the Anthropic error body.
type errorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

// decodeFrame decodes one JSON value with numbers kept as json.Number;
// trailing data is an error.
func decodeFrame(raw []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("trailing data after the event")
	}
	return v, nil
}

func newUUID() string {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails (crypto/rand documents it)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const h = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, h[c>>4], h[c&0xf])
	}
	return string(out)
}
