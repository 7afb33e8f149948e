package accounts

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func FuzzUpdateAuthJSON(f *testing.F) {
	f.Add([]byte(`{"auth_mode":"chatgpt","OPENAI_API_KEY":null,"tokens":{"id_token":"i","access_token":"a","refresh_token":"r","account_id":"x"},"last_refresh":"2026-11-01T00:00:00Z"}`))
	f.Add([]byte(`{"tokens":null,"z":[1,{"b":2}],"a":1e400}`))
	f.Add([]byte(`{"tokens":{"tokens":{}},"tokens":{"x":1}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"a":`))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, err := updateAuthJSON(data, rotatedTokens{access: "A\u2028<&>", refresh: "R", id: "I"}, rfStart)
		if err != nil {
			return // refused input is fine; it must not panic
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("output is not a JSON object: %v\n%s", err, out)
		}
		var toks map[string]json.RawMessage
		if err := json.Unmarshal(got["tokens"], &toks); err != nil {
			t.Fatalf("tokens is not an object: %v", err)
		}
		for k, want := range map[string]string{"access_token": "A\u2028<&>", "refresh_token": "R", "id_token": "I"} {
			var s string
			if err := json.Unmarshal(toks[k], &s); err != nil || s != want {
				t.Errorf("tokens.%s = %s, want %q", k, toks[k], want)
			}
		}
		// Every other top-level member keeps its value.
		var in map[string]json.RawMessage
		if json.Unmarshal(data, &in) == nil {
			for k, v := range in {
				if k == "tokens" || k == "last_refresh" {
					continue
				}
				var a, b bytes.Buffer
				if json.Compact(&a, v) != nil || json.Compact(&b, got[k]) != nil || a.String() != b.String() {
					t.Errorf("member %q changed from %s to %s", k, v, got[k])
				}
			}
		}
	})
}

func BenchmarkCredential(b *testing.B) {
	path := filepath.Join(b.TempDir(), "auth.json")
	doc := `{"auth_mode":"chatgpt","tokens":{"access_token":"opaque","refresh_token":"r"}}`
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := NewFileSource(FileConfig{Path: path, Clock: func() time.Time { return rfStart }})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Credential(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}
