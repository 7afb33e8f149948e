package translate

import (
	"errors"
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
	m, _ = ParseModelAliases("sonnet=gpt-5.6-sol,claude-opus-4-8=gpt-5.6-terra")
	got := map[string]ModelInfo{}
	var ids []string
	for _, info := range m.List() {
		ids = append(ids, info.ID)
		got[info.ID] = info
	}
	want := "claude-haiku-4-5,claude-haiku-4-5-20251001,claude-haiku-5-5," +
		"claude-opus-4-0,claude-opus-4-1,claude-opus-4-1-20250805,claude-opus-4-20250514,claude-opus-4-5,claude-opus-4-5-20251101," +
		"claude-opus-4-6,claude-opus-4-7,claude-opus-4-8,claude-opus-5,claude-opus-5-5," +
		"claude-sonnet-4-0,claude-sonnet-4-20250514,claude-sonnet-4-5,claude-sonnet-4-5-20250929,claude-sonnet-4-6,claude-sonnet-5,claude-sonnet-5-5," +
		"gpt-5.4-mini,gpt-5.5,gpt-5.6-sol,gpt-5.6-terra,sonnet"
	if got := strings.Join(ids, ","); got != want {
		t.Errorf("List ids\n got %s\nwant %s", got, want)
	}
	for id, w := range map[string]ModelInfo{
		"claude-sonnet-4-5":         {ID: "claude-sonnet-4-5", DisplayName: "Claude Sonnet 4.5 (gpt-5.5)", Upstream: "gpt-5.5", ContextWindow: 258400},
		"claude-haiku-4-5-20251001": {ID: "claude-haiku-4-5-20251001", DisplayName: "Claude Haiku 4.5 (gpt-5.4-mini)", Upstream: "gpt-5.4-mini", ContextWindow: 258400},
		"claude-opus-4-8":           {ID: "claude-opus-4-8", DisplayName: "Claude Opus 4.8 (gpt-5.6-terra)", Upstream: "gpt-5.6-terra", ContextWindow: 258400},
		"sonnet":                    {ID: "sonnet", DisplayName: "sonnet (gpt-5.6-sol)", Upstream: "gpt-5.6-sol", ContextWindow: 258400},
		"gpt-5.5":                   {ID: "gpt-5.5", DisplayName: "gpt-5.5", Upstream: "gpt-5.5", ContextWindow: 258400},
	} {
		if got[id] != w {
			t.Errorf("List entry %s = %+v, want %+v", id, got[id], w)
		}
	}
}

func TestAcceptsAndCheck(t *testing.T) {
	m, err := ParseModelAliases("my-alias=gpt-5.6-sol,house-*=gpt-5.6-terra")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"claude-opus-5-5", "claude-sonnet-4-5", "claude-3-5-sonnet-20241022", "claude-haiku-4-5[1m]",
		"gpt-5.5", "gpt-5.4-mini", "gpt-5-codex", "o3", "models/gpt-5.5", "clodex:openai-oauth:gpt-5.6-sol",
		"anthropic-openai-oauth__gpt-5.5", "my-alias", "house-special", "gpt-5.6-terra"} {
		if err := m.Check(name); err != nil {
			t.Errorf("Check(%q) = %v, want accepted", name, err)
		}
	}
	for _, name := range []string{"gpt-4o", "some-local-model", "gpt-5.5-turbo", "my-alias-2", "claude", "house"} {
		err := m.Check(name)
		var re *RequestError
		if !errors.As(err, &re) || re.Field != "model" {
			t.Errorf("Check(%q) = %v, want a *RequestError for model", name, err)
			continue
		}
		for _, want := range []string{`"` + name + `"`, "claude-opus-* (→ gpt-5.5)", "my-alias (→ gpt-5.6-sol)", "house-* (→ gpt-5.6-terra)", "gpt-5.4-mini", "--model-passthrough"} {
			if !strings.Contains(re.Message, want) {
				t.Errorf("Check(%q) message %q does not contain %q", name, re.Message, want)
			}
		}
		if _, ok := m.Info(name); ok {
			t.Errorf("Info(%q) answered for an unaccepted name", name)
		}
	}
	p := m.WithPassthrough()
	if err := p.Check("gpt-4o"); err != nil || p.Resolve("gpt-4o") != "gpt-4o" {
		t.Errorf("passthrough: Check = %v, Resolve = %q; want accepted, unchanged", err, p.Resolve("gpt-4o"))
	}
	if m.Accepts("gpt-4o") {
		t.Error("WithPassthrough changed the table it was called on")
	}
	if info, ok := m.Info("claude-sonnet-9-9"); !ok || info.Upstream != "gpt-5.5" || info.DisplayName != "Claude Sonnet 9.9 (gpt-5.5)" {
		t.Errorf("Info of an unlisted Claude name = %+v, %v; want it answered, mapped to gpt-5.5", info, ok)
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
