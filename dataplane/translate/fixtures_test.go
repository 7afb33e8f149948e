package translate

import (
	"encoding/json"
	"path"
	"testing"

	"github.com/clodex/clodex/internal/captures"
)

// fixtureDir is the folder of the captured Claude Code traffic in package
// captures.
const fixtureDir = "claude-code"

// fixtureBody extracts the request body from a capture file: either the
// top-level "body", or the body under the given path of keys. Tools whose
// input_schema was summarised in the capture ("input_schema.properties" and
// "input_schema.required") get an equivalent schema back, so the body is a
// valid Messages request again.
func fixtureBody(t testing.TB, name string, keys ...string) []byte {
	t.Helper()
	raw, err := captures.ReadFile(path.Join(fixtureDir, name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("parse fixture %s: %v", name, err)
	}
	if len(keys) == 0 {
		keys = []string{"body"}
	}
	var cur any = doc
	for _, k := range keys {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("fixture %s: %q is not under an object", name, k)
		}
		cur = m[k]
	}
	body, ok := cur.(map[string]any)
	if !ok {
		t.Fatalf("fixture %s: no body at %v", name, keys)
	}
	if tools, ok := body["tools"].([]any); ok {
		for _, tl := range tools {
			expandSummarisedSchema(tl.(map[string]any))
		}
	}
	out, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func expandSummarisedSchema(tool map[string]any) {
	props, ok := tool["input_schema.properties"]
	if !ok {
		return
	}
	p := map[string]any{}
	if list, ok := props.([]any); ok {
		for _, name := range list {
			p[name.(string)] = map[string]any{"type": "string"}
		}
	}
	schema := map[string]any{"type": "object", "properties": p}
	if req, ok := tool["input_schema.required"].([]any); ok {
		schema["required"] = req
	}
	delete(tool, "input_schema.properties")
	delete(tool, "input_schema.required")
	tool["input_schema"] = schema
}

// fixtureJSON reads a value from a capture file by key path.
func fixtureJSON(t testing.TB, name string, keys ...string) json.RawMessage {
	t.Helper()
	raw, err := captures.ReadFile(path.Join(fixtureDir, name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	var cur any
	if err := json.Unmarshal(raw, &cur); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		cur = cur.(map[string]any)[k]
	}
	out, err := json.Marshal(cur)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
