package translate

import (
	"fmt"
	"sort"
	"strings"
)

// DefaultModelAliases spells out the table DefaultModels returns (a test
// keeps the two in step).
// Entries are tried in order after any configured ones; the first whose
// pattern matches wins. A pattern ending in * matches by prefix.
const DefaultModelAliases = "claude-opus-*=gpt-5.5,claude-sonnet-*=gpt-5.5,claude-haiku-*=gpt-5.4-mini,claude-*=gpt-5.5"

// defaultContextWindow is reported for models with no better knowledge
// (docs/translation.md §2.2).
const defaultContextWindow = 200_000

// oauthRawWindow is the raw context window of the gpt-5 family on the
// ChatGPT backend; clients are told 95 % of it (docs/translation.md §2.2).
const oauthRawWindow = 272_000

type alias struct {
	pattern string // without the trailing *
	prefix  bool
	model   string
}

// ModelTable maps the model names clients request (Claude names, saved
// aliases) to upstream Codex models, and knows their context windows.
// Names that match no alias pass through unchanged, so gpt-* and o* ids
// reach the backend as requested. A ModelTable is immutable once built and
// safe for concurrent use.
type ModelTable struct {
	configured []alias // checked first, in order
	defaults   []alias
}

// DefaultModels returns the table built from DefaultModelAliases:
// claude-opus-* and claude-sonnet-* → gpt-5.5, claude-haiku-* →
// gpt-5.4-mini, any other claude-* → gpt-5.5.
func DefaultModels() *ModelTable {
	return &ModelTable{defaults: []alias{
		{pattern: "claude-opus-", prefix: true, model: "gpt-5.5"},
		{pattern: "claude-sonnet-", prefix: true, model: "gpt-5.5"},
		{pattern: "claude-haiku-", prefix: true, model: "gpt-5.4-mini"},
		{pattern: "claude-", prefix: true, model: "gpt-5.5"},
	}}
}

// ParseModelAliases builds a table from "pattern=model,pattern=model". A
// pattern may end in * to match by prefix. The configured entries are tried
// first, in the order written; the defaults (DefaultModelAliases) still
// apply to names no configured entry matches. An empty spec yields the
// default table. Errors name the bad entry.
func ParseModelAliases(spec string) (*ModelTable, error) {
	m := DefaultModels()
	c, err := parseAliases(spec)
	if err != nil {
		return nil, fmt.Errorf("parse model aliases: %w", err)
	}
	m.configured = c
	return m, nil
}

func parseAliases(spec string) ([]alias, error) {
	var out []alias
	seen := map[string]bool{}
	if strings.TrimSpace(spec) == "" {
		return nil, nil
	}
	for i, entry := range strings.Split(spec, ",") {
		e := strings.TrimSpace(entry)
		pat, model, ok := strings.Cut(e, "=")
		pat, model = strings.TrimSpace(pat), strings.TrimSpace(model)
		switch {
		case e == "":
			return nil, fmt.Errorf("entry %d is empty; want pattern=model", i+1)
		case !ok:
			return nil, fmt.Errorf("entry %d %q: missing '='; want pattern=model", i+1, bounded(e))
		case pat == "" || pat == "*":
			return nil, fmt.Errorf("entry %d %q: empty pattern; want a model name, optionally ending in *", i+1, bounded(e))
		case strings.Contains(strings.TrimSuffix(pat, "*"), "*"):
			return nil, fmt.Errorf("entry %d %q: '*' is allowed only at the end of the pattern", i+1, bounded(e))
		case model == "":
			return nil, fmt.Errorf("entry %d %q: empty model", i+1, bounded(e))
		case strings.ContainsAny(model, "*= \t") || strings.ContainsAny(pat, " \t"):
			return nil, fmt.Errorf("entry %d %q: names must not contain spaces, '*' (model) or '='", i+1, bounded(e))
		case seen[pat]:
			return nil, fmt.Errorf("entry %d %q: pattern %q appears twice", i+1, bounded(e), pat)
		}
		seen[pat] = true
		a := alias{pattern: strings.TrimSuffix(pat, "*"), prefix: strings.HasSuffix(pat, "*"), model: model}
		out = append(out, a)
	}
	return out, nil
}

// normalizeModel strips a trailing "[1m]" (any case) and a leading
// "models/", and reduces the route ids of docs/translation.md §2.1 to their model:
// "clodex:<provider>:<model>" and "anthropic-<provider>__<model>".
func normalizeModel(name string) string {
	name = strings.TrimSpace(name)
	if n := len(name); n >= 4 && strings.EqualFold(name[n-4:], "[1m]") {
		name = name[:n-4]
	}
	name = strings.TrimPrefix(name, "models/")
	if rest, ok := strings.CutPrefix(name, "clodex:"); ok {
		if _, model, ok := strings.Cut(rest, ":"); ok && model != "" {
			return model
		}
	}
	if rest, ok := strings.CutPrefix(name, "anthropic-"); ok {
		if _, model, ok := strings.Cut(rest, "__"); ok && model != "" {
			return model
		}
	}
	return name
}

// liteModels are the upstream models served by Responses-Lite
// (docs/translation.md §2.3).
var liteModels = []string{"gpt-5.6-luna"}

// Lite reports whether an upstream model is a Responses-Lite model: its
// frames carry parallel_tool_calls:false and reasoning.context "all_turns"
// (docs/translation.md §2.3). The backend also expects the version and
// x-openai-internal-codex-responses-lite headers on its upgrade, which
// dataplane/upstream does not send.
func (m *ModelTable) Lite(upstream string) bool {
	name := normalizeModel(upstream)
	for _, l := range liteModels {
		if name == l || strings.HasPrefix(name, l+"-") {
			return true
		}
	}
	return false
}

func lookup(list []alias, name string) (string, bool) {
	for _, a := range list {
		if a.prefix && strings.HasPrefix(name, a.pattern) || !a.prefix && name == a.pattern {
			return a.model, true
		}
	}
	return "", false
}

// Resolve returns the upstream model for a requested name.
func (m *ModelTable) Resolve(requested string) string {
	name := normalizeModel(requested)
	if m == nil {
		m = DefaultModels()
	}
	if model, ok := lookup(m.configured, name); ok {
		return model
	}
	if model, ok := lookup(m.defaults, name); ok {
		return model
	}
	return name
}

// ContextWindow is the context window reported to clients for an upstream
// model: 95 % of 272,000 (258,400) for the gpt-5 family served by the
// ChatGPT backend, 200,000 otherwise (docs/translation.md §2.2).
func (m *ModelTable) ContextWindow(upstream string) int {
	if strings.HasPrefix(normalizeModel(upstream), "gpt-5") {
		return oauthRawWindow * 95 / 100
	}
	return defaultContextWindow
}

// ModelInfo describes one model for GET /v1/models.
type ModelInfo struct {
	ID, DisplayName string
	ContextWindow   int
}

// List returns the concrete (non-wildcard) alias names and the distinct
// upstream models of the table, sorted by id.
func (m *ModelTable) List() []ModelInfo {
	if m == nil {
		m = DefaultModels()
	}
	seen := map[string]bool{}
	var out []ModelInfo
	add := func(id, display, upstream string) {
		if seen[id] {
			return
		}
		seen[id] = true
		out = append(out, ModelInfo{ID: id, DisplayName: display, ContextWindow: m.ContextWindow(upstream)})
	}
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			if !a.prefix {
				add(a.pattern, a.pattern+" ("+a.model+")", a.model)
			}
		}
	}
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			add(a.model, a.model, a.model)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
