package translate

import (
	"strings"
	"testing"
)

func TestResolveDefaults(t *testing.T) {
	m := DefaultModels()
	tests := map[string]string{
		"claude-opus-5-5":            "gpt-5.5",
		"claude-opus-4-8[1m]":        "gpt-5.5",
		"claude-sonnet-4-5":          "gpt-5.5",
		"claude-haiku-4-5-20251001":  "gpt-5.4-mini",
		"claude-3-5-sonnet-20241022": "gpt-5.5",
		"gpt-5-codex":                "gpt-5-codex",
		"gpt-5.6-sol":                "gpt-5.6-sol",
		"o3":                         "o3",
		"models/gpt-5.5":             "gpt-5.5",
		"some-local-model":           "some-local-model",
	}
	for in, want := range tests {
		if got := m.Resolve(in); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", in, got, want)
		}
	}
	// DefaultModelAliases documents the same table.
	parsed, err := parseAliases(DefaultModelAliases)
	if err != nil {
		t.Fatal(err)
	}
	if len(parsed) != len(m.defaults) {
		t.Fatalf("DefaultModelAliases has %d entries, table %d", len(parsed), len(m.defaults))
	}
	for i := range parsed {
		if parsed[i] != m.defaults[i] {
			t.Errorf("entry %d: constant %+v, table %+v", i, parsed[i], m.defaults[i])
		}
	}
}

func TestParseModelAliases(t *testing.T) {
	m, err := ParseModelAliases(" claude-opus-*=gpt-5.6-sol , claude-opus-4-1=gpt-5-codex,my-alias=gpt-5.5")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]string{
		"claude-opus-5-5":  "gpt-5.6-sol",
		"claude-opus-4-1":  "gpt-5.6-sol", // first match wins, in the order written
		"my-alias":         "gpt-5.5",
		"claude-haiku-4-5": "gpt-5.4-mini", // defaults still apply
		"my-alias-2":       "my-alias-2",
	}
	for in, want := range tests {
		if got := m.Resolve(in); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", in, got, want)
		}
	}
	bad := []struct{ spec, want string }{
		{"claude-opus", `entry 1 "claude-opus": missing '='`},
		{"a=b,,c=d", "entry 2 is empty"},
		{"=gpt-5.5", "empty pattern"},
		{"*=gpt-5.5", "empty pattern"},
		{"cl*ude=gpt-5.5", "'*' is allowed only at the end"},
		{"claude-*=", "empty model"},
		{"a=b,a=c", `pattern "a" appears twice`},
		{"a=gpt 5", "must not contain spaces"},
	}
	for _, b := range bad {
		_, err := ParseModelAliases(b.spec)
		if err == nil || !strings.Contains(err.Error(), b.want) {
			t.Errorf("ParseModelAliases(%q) = %v, want error containing %q", b.spec, err, b.want)
		}
	}
	if m, err := ParseModelAliases(""); err != nil || m.Resolve("claude-opus-5") != "gpt-5.5" {
		t.Errorf("empty spec: %v", err)
	}
}

func TestContextWindowAndList(t *testing.T) {
	m := DefaultModels()
	for model, want := range map[string]int{"gpt-5.5": 258400, "gpt-5.6-sol": 258400, "gpt-5-codex": 258400, "o3": 200000, "other": 200000} {
		if got := m.ContextWindow(model); got != want {
			t.Errorf("ContextWindow(%q) = %d, want %d", model, got, want)
		}
	}
	m, _ = ParseModelAliases("sonnet=gpt-5.6-sol")
	var ids []string
	for _, info := range m.List() {
		ids = append(ids, info.ID)
		if info.ContextWindow == 0 || info.DisplayName == "" {
			t.Errorf("incomplete info %+v", info)
		}
	}
	if got := strings.Join(ids, ","); got != "gpt-5.4-mini,gpt-5.5,gpt-5.6-sol,sonnet" {
		t.Errorf("List ids = %s", got)
	}
}

func TestRouteIDsAndLite(t *testing.T) {
	m := DefaultModels()
	for in, want := range map[string]string{
		"clodex:openai-oauth:gpt-5.6-sol":     "gpt-5.6-sol",
		"clodex:openai-oauth:gpt-5.6-sol[1M]": "gpt-5.6-sol",
		"anthropic-openai-oauth__gpt-5.5":     "gpt-5.5",
		"clodex:":                             "clodex:",
	} {
		if got := m.Resolve(in); got != want {
			t.Errorf("Resolve(%q) = %q, want %q", in, got, want)
		}
	}
	if !m.Lite("gpt-5.6-luna") || m.Lite("gpt-5.6-sol") || m.Lite("gpt-5.6-lunar") {
		t.Error("Lite detection")
	}
}
