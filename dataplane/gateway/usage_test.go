package gateway

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// usageLog is a UsageReporter that keeps what it is given.
type usageLog struct {
	mu   sync.Mutex
	rows []*controlplanev1.UsageRow
}

func (u *usageLog) ReportUsage(r *controlplanev1.UsageRow) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.rows = append(u.rows, r)
}

func (u *usageLog) all() []*controlplanev1.UsageRow {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*controlplanev1.UsageRow(nil), u.rows...)
}

// Every turn's usage is reported once the turn ends: a completed turn
// with the backend's exact token figures (as clodex-sim counted them) and
// the socket it opened; a follow-up on the same socket opens none; a turn
// admission refuses to the end is a refusal with no tokens.
func TestTurnUsageReported(t *testing.T) {
	var refuse sync.Mutex
	refusing := false
	admit := pool.AdmitterFunc(func(context.Context, string) error {
		refuse.Lock()
		defer refuse.Unlock()
		if refusing {
			return &control.RefusedError{RetryAfter: 4 * time.Second}
		}
		return nil
	})
	log := &usageLog{}
	e := newUnitEnv(t, unitOptions{admitter: admit, budget: pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 1},
		mutate: func(c *Config) { c.Usage = log }})
	body := `{"model":"claude-sonnet-4-5-20250929","max_tokens":64,"messages":[{"role":"user","content":"#sim reply hello there"}]}`
	resp := e.post(t, "/v1/messages", body, sessionHeader)
	ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first turn: status %d", resp.StatusCode)
	}
	WaitFor(t, "the first turn's usage", func() bool { return len(log.all()) == 1 })
	first := e.sim.Stats()
	follow := `{"model":"claude-sonnet-4-5-20250929","max_tokens":64,"messages":[{"role":"user","content":"#sim reply hello there"},` +
		`{"role":"assistant","content":"hello there"},{"role":"user","content":"#sim reply again"}]}`
	resp = e.post(t, "/v1/messages", follow, sessionHeader)
	ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("follow-up: status %d", resp.StatusCode)
	}
	WaitFor(t, "the second turn's usage", func() bool { return len(log.all()) == 2 })
	second := e.sim.Stats()
	refuse.Lock()
	refusing = true
	refuse.Unlock()
	resp = e.post(t, "/v1/messages", MessagesBody(false, "#sim reply refused"), map[string]string{"X-Claude-Code-Session-Id": "another-session"})
	ReadAll(t, resp)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("refused turn: status %d, want 429", resp.StatusCode)
	}

	WaitFor(t, "the third turn's usage", func() bool { return len(log.all()) == 3 })
	rows := log.all()
	if len(rows) != 3 {
		t.Fatalf("usage reported %d times, want 3 (one a turn): %v", len(rows), rows)
	}
	key := account.Key(simAccount)
	want := []*controlplanev1.UsageRow{
		{Account: key, Model: "claude-sonnet-4-5", Turns: 1, NewSockets: 1,
			InputTokens: first.InputTokens, CachedTokens: first.CachedTokens, OutputTokens: first.OutputTokens},
		{Account: key, Model: "claude-sonnet-4-5", Turns: 1, NewSockets: 0,
			InputTokens: second.InputTokens - first.InputTokens, CachedTokens: second.CachedTokens - first.CachedTokens, OutputTokens: second.OutputTokens - first.OutputTokens},
		{Account: key, Model: "gpt-5.5", Turns: 1, Refusals: 1},
	}
	for i, w := range want {
		g := rows[i]
		if g.GetMember() != "" || g.GetAccount() != w.GetAccount() || g.GetModel() != w.GetModel() || g.GetTurns() != 1 ||
			g.GetNewSockets() != w.GetNewSockets() || g.GetRefusals() != w.GetRefusals() || g.GetInputTokens() != w.GetInputTokens() ||
			g.GetCachedTokens() != w.GetCachedTokens() || g.GetOutputTokens() != w.GetOutputTokens() {
			t.Errorf("turn %d usage = %v\nwant %v", i, g, w)
		}
	}
	if first.InputTokens == 0 || second.CachedTokens == first.CachedTokens {
		t.Errorf("the emulator counted %+v then %+v; want input tokens, and cached tokens on the follow-up", first, second)
	}
}

// The model a turn's usage is recorded under: the requested name, lower
// case, without a date suffix, bounded.
func TestUsageModel(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5"},
		{"Claude-Opus-4-1-20250805", "claude-opus-4-1"},
		{"gpt-5.5", "gpt-5.5"},
		{"claude-haiku-4-5", "claude-haiku-4-5"},
		{"claude-sonnet-4-5[1m]", "claude-sonnet-4-5_1m_"},
		{"model-2025092", "model-2025092"},
		{"  ", "unknown"},
		{"x\u00e9y", "x__y"},
		{string(make([]byte, 100)), "________________________________________________________________"},
	} {
		if got := usageModel(tt.in); got != tt.want {
			t.Errorf("usageModel(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
