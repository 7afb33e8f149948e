package translate

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// DefaultModelAliases spells out the table DefaultModels returns (a test
// keeps the two in step).
// Entries are tried in order after any configured ones; the first whose
// pattern matches wins. A pattern ending in * matches by prefix.
const DefaultModelAliases = "claude-opus-*=gpt-5.5,claude-sonnet-*=gpt-5.5,claude-haiku-*=gpt-5.4-mini,claude-*=gpt-5.5"

type alias struct {
	pattern string // without the trailing *
	prefix  bool
	model   string
}

// ModelTable maps the model names clients request (Claude names, saved
// aliases) to upstream Codex models, and knows their context windows. It
// accepts a name an alias matches, a known upstream model or an alias
// target (Accepts, Check); any other name is refused, unless the table was
// built WithPassthrough, which sends it to the backend unchanged. A
// ModelTable is immutable once built and safe for concurrent use.
type ModelTable struct {
	configured  []alias // checked first, in order
	defaults    []alias
	passthrough bool // accept names no alias matches and no known model has
}

// claudeModels are the Claude model ids Claude Code knows (2.1.332); the
// list shows the ones an alias maps. Any other name an alias pattern
// matches is accepted as well.
var claudeModels = []string{
	"claude-opus-5-5", "claude-opus-5", "claude-opus-4-8", "claude-opus-4-7", "claude-opus-4-6",
	"claude-opus-4-5", "claude-opus-4-5-20251101", "claude-opus-4-1", "claude-opus-4-1-20250805",
	"claude-opus-4-0", "claude-opus-4-20250514",
	"claude-sonnet-5-5", "claude-sonnet-5", "claude-sonnet-4-6", "claude-sonnet-4-5",
	"claude-sonnet-4-5-20250929", "claude-sonnet-4-0", "claude-sonnet-4-20250514",
	"claude-haiku-5-5", "claude-haiku-4-5", "claude-haiku-4-5-20251001",
}

// upstreamModels are the Codex models a ChatGPT account is known to serve
// (the backend's static model catalog, and gpt-5-codex); their names are
// accepted as they are, as are the targets of the aliases.
var upstreamModels = []string{
	"gpt-5.6-sol", "gpt-5.6-terra", "gpt-5.6-luna", "gpt-5.5", "gpt-5.4", "gpt-5.4-mini",
	"gpt-5", "gpt-5-codex", "o4-mini", "o3", "o3-mini", "o1", "o1-mini",
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

// WithPassthrough returns a copy of m that accepts any model name (Check
// never fails): names no alias matches go to the backend unchanged.
func (m *ModelTable) WithPassthrough() *ModelTable {
	if m == nil {
		m = DefaultModels()
	}
	c := *m
	c.passthrough = true
	return &c
}

// refusal is Check's error for a name the table does not accept: it lists
// the alias patterns with their targets and the upstream models.
func (m *ModelTable) refusal(requested string) error {
	var pats []string
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			p := a.pattern
			if a.prefix {
				p += "*"
			}
			pats = append(pats, p+" (→ "+a.model+")")
		}
	}
	targets := slices.Clone(upstreamModels)
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			if !slices.Contains(targets, a.model) {
				targets = append(targets, a.model)
			}
		}
	}
	return reqErr("model", "model %q is not served here; accepted: %s, and the upstream models %s; "+
		"GET /v1/models lists them (start clodex-dataplane with --model-passthrough to send any name to the backend unchanged)",
		bounded(requested), strings.Join(pats, ", "), strings.Join(targets, ", "))
}

// ModelInfo describes one model for GET /v1/models.
type ModelInfo struct {
	ID, DisplayName string
	Upstream        string // the upstream model the id maps to
	ContextWindow   int
}

// Info describes any name the table accepts, listed or not; false for a
// name it does not accept.
func (m *ModelTable) Info(id string) (ModelInfo, bool) {
	if m == nil {
		m = DefaultModels()
	}
	if !m.Accepts(id) {
		return ModelInfo{}, false
	}
	up := m.Resolve(id)
	return ModelInfo{ID: id, DisplayName: displayName(id, up), Upstream: up, ContextWindow: m.ContextWindow(up)}, true
}

// displayName names a model for people: "Claude Opus 4.5 (gpt-5.5)" for a
// Claude id, "alias (model)" for another alias, the id for an upstream
// model.
func displayName(id, upstream string) string {
	if id == upstream {
		return id
	}
	if rest, ok := strings.CutPrefix(id, "claude-"); ok {
		parts := strings.Split(rest, "-")
		var words, version []string
		for _, p := range parts {
			switch {
			case len(p) == 8 && strings.Trim(p, "0123456789") == "":
				continue // a date suffix
			case strings.Trim(p, "0123456789") == "":
				version = append(version, p)
			default:
				words = append(words, strings.ToUpper(p[:1])+p[1:])
			}
		}
		name := "Claude " + strings.Join(words, " ")
		if len(version) > 0 {
			name += " " + strings.Join(version, ".")
		}
		return name + " (" + upstream + ")"
	}
	return id + " (" + upstream + ")"
}

// List returns what GET /v1/models shows, sorted by id: the Claude ids
// Claude Code knows that an alias maps, the concrete (non-wildcard) alias
// names, and the distinct upstream models the aliases map to, each with its
// upstream model.
func (m *ModelTable) List() []ModelInfo {
	if m == nil {
		m = DefaultModels()
	}
	seen := map[string]bool{}
	var out []ModelInfo
	add := func(id string) {
		if seen[id] {
			return
		}
		if info, ok := m.Info(id); ok {
			seen[id] = true
			out = append(out, info)
		}
	}
	for _, id := range claudeModels {
		if _, ok := lookup(m.configured, id); ok {
			add(id)
		} else if _, ok := lookup(m.defaults, id); ok {
			add(id)
		}
	}
	for _, list := range [][]alias{m.configured, m.defaults} {
		for _, a := range list {
			if !a.prefix {
				add(a.pattern)
			}
			add(a.model)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
