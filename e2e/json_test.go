package e2e

import (
	"encoding/json"
	"testing"
)

// obj decodes one JSON object (a frame, an event, a body).
func obj(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode JSON object %.200q: %v", b, err)
	}
	return m
}

// objs decodes every frame.
func objs(t *testing.T, frames [][]byte) []map[string]any {
	t.Helper()
	out := make([]map[string]any, len(frames))
	for i, f := range frames {
		out[i] = obj(t, f)
	}
	return out
}

// ofType returns the objects whose "type" is typ.
func ofType(ms []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, m := range ms {
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

// field walks m along keys (object keys only) and returns what is there,
// nil when any step is missing.
func field(m map[string]any, keys ...string) any {
	var cur any = m
	for _, k := range keys {
		o, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = o[k]
	}
	return cur
}

// str is field as a string ("" when absent or not a string).
func str(m map[string]any, keys ...string) string {
	s, _ := field(m, keys...).(string)
	return s
}

// list is field as a list of objects (non-objects are skipped).
func list(m map[string]any, keys ...string) []map[string]any {
	raw, _ := field(m, keys...).([]any)
	var out []map[string]any
	for _, v := range raw {
		if o, ok := v.(map[string]any); ok {
			out = append(out, o)
		}
	}
	return out
}

// compact renders v as one line of JSON for failure messages.
func compact(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	if len(b) > 2000 {
		return string(b[:2000]) + "…"
	}
	return string(b)
}
