package translate

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"time"
)

// The backend's events as the data plane reads them: upEvent, upItem and
// upResponse are the fields of a Responses event that Stream.Handle
// uses; ParseRateLimits reads the codex.rate_limits side event the
// Stream ignores.

// upEvent is one upstream event (one WebSocket frame).
type upEvent struct {
	Type         string          `json:"type"`
	OutputIndex  optInt          `json:"output_index"`
	SummaryIndex int             `json:"summary_index"`
	Delta        string          `json:"delta"` // a non-string delta fails decoding (a malformed event)
	Item         json.RawMessage `json:"item"`
	Response     json.RawMessage `json:"response"`
}

// index is the event's output_index, -1 when absent or negative.
func (ev *upEvent) index() int {
	if !ev.OutputIndex.ok || ev.OutputIndex.v < 0 {
		return -1
	}
	return ev.OutputIndex.v
}

func (ev *upEvent) delta() (string, error) { return ev.Delta, nil }

// optInt is an integer that remembers whether it was present.
type optInt struct {
	v  int
	ok bool
}

func (o *optInt) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return nil
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return &json.UnmarshalTypeError{Value: "number " + bounded(string(b)), Type: reflect.TypeFor[int]()}
	}
	o.v, o.ok = n, true
	return nil
}

// upItem is an output item (output_item.added and .done, response.output).
type upItem struct {
	Type             string  `json:"type"`
	ID               string  `json:"id"`
	CallID           string  `json:"call_id"`
	Name             string  `json:"name"`
	Arguments        string  `json:"arguments"`
	EncryptedContent *string `json:"encrypted_content"`
	Summary          []struct {
		Text string `json:"text"`
	} `json:"summary"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

// upResponse is the response of a terminal event.
type upResponse struct {
	ID     string            `json:"id"`
	Output []json.RawMessage `json:"output"`
	Usage  *struct {
		InputTokens        int `json:"input_tokens"`
		InputTokensDetails struct {
			CachedTokens     int `json:"cached_tokens"`
			CacheWriteTokens int `json:"cache_write_tokens"`
		} `json:"input_tokens_details"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
}

// RateLimits is an account's plan usage as the backend reports it in a
// codex.rate_limits side event (docs: backend events): the plan and each
// usage window.
type RateLimits struct {
	// PlanType is the plan's name ("plus", "pro", ...), or "".
	PlanType string
	// LimitReached is true when the backend says the account is at a
	// usage limit (rate_limits.limit_reached, or allowed false).
	LimitReached bool
	// Windows are the reported windows, primary first; a null window is
	// left out.
	Windows []RateLimitWindow
}

// RateLimitWindow is one usage window.
type RateLimitWindow struct {
	// Name is "primary" (the 5-hour window) or "secondary" (the weekly
	// one).
	Name string
	// UsedPercent is the share of the window used, 0..100 (the backend
	// may report more at the limit; it is kept, clamped to 0..1000).
	UsedPercent float64
	// Window is the window's length (window_minutes).
	Window time.Duration
	// ResetsAt is when the window resets: reset_at (Unix seconds), else
	// now + reset_after_seconds; zero when neither is given.
	ResetsAt time.Time
}

// rateLimitsType is the side event's type and the prefix ParseRateLimits
// looks for before it decodes anything.
var rateLimitsType = []byte(`"codex.rate_limits"`)

// ParseRateLimits reads a codex.rate_limits event (the JSON text of one
// upstream frame) read at now. It reports false for any other frame, and
// for a rate-limits event without a readable rate_limits object; fields
// of the wrong type are left out rather than failing the event, which is
// informational.
func ParseRateLimits(frame []byte, now time.Time) (RateLimits, bool) {
	if !bytes.Contains(frame, rateLimitsType) {
		return RateLimits{}, false
	}
	var ev struct {
		Type       string          `json:"type"`
		PlanType   json.RawMessage `json:"plan_type"`
		RateLimits *struct {
			Allowed      *bool                      `json:"allowed"`
			LimitReached *bool                      `json:"limit_reached"`
			Primary      map[string]json.RawMessage `json:"primary"`
			Secondary    map[string]json.RawMessage `json:"secondary"`
		} `json:"rate_limits"`
	}
	if json.Unmarshal(frame, &ev) != nil || ev.Type != "codex.rate_limits" || ev.RateLimits == nil {
		return RateLimits{}, false
	}
	var rl RateLimits
	_ = json.Unmarshal(ev.PlanType, &rl.PlanType)
	r := ev.RateLimits
	rl.LimitReached = r.LimitReached != nil && *r.LimitReached || r.Allowed != nil && !*r.Allowed
	for _, w := range []struct {
		name string
		obj  map[string]json.RawMessage
	}{{"primary", r.Primary}, {"secondary", r.Secondary}} {
		if w.obj == nil {
			continue
		}
		win := RateLimitWindow{Name: w.name}
		if v, ok := jsonNumber(w.obj["used_percent"]); ok {
			win.UsedPercent = min(max(v, 0), 1000)
		}
		if v, ok := jsonNumber(w.obj["window_minutes"]); ok && v > 0 && v <= 366*24*60 {
			win.Window = time.Duration(v * float64(time.Minute))
		}
		if v, ok := jsonNumber(w.obj["reset_at"]); ok && v > 0 && v < 1e11 {
			win.ResetsAt = time.Unix(int64(v), 0)
		} else if v, ok := jsonNumber(w.obj["reset_after_seconds"]); ok && v >= 0 && v <= MaxResetsIn.Seconds() {
			win.ResetsAt = now.Add(time.Duration(v * float64(time.Second))).Truncate(time.Second)
		}
		rl.Windows = append(rl.Windows, win)
	}
	return rl, true
}

// jsonNumber reads a finite JSON number.
func jsonNumber(raw json.RawMessage) (float64, bool) {
	var v float64
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, false
	}
	return v, true
}

// Headroom is the share of the account's tightest window still free,
// 0..100: 100 minus the highest used percent among the windows not yet
// reset at now (a window past its reset counts as unused). An account at
// a usage limit has none; one without windows has 100.
func (rl RateLimits) Headroom(now time.Time) float64 {
	if rl.LimitReached {
		return 0
	}
	used := 0.0
	for _, w := range rl.Windows {
		if !w.ResetsAt.IsZero() && !now.Before(w.ResetsAt) {
			continue
		}
		used = max(used, w.UsedPercent)
	}
	return max(100-used, 0)
}
