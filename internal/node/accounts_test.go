package node_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/node/nodetest"
)

// conversation is one client conversation: its messages so far.
type conversation struct {
	messages []map[string]any
}

// turn sends the conversation with one more user message and, on a 200,
// appends the assistant's answer. It returns the response.
func (c *conversation) turn(t *testing.T, baseURL, text string) (*http.Response, []byte) {
	t.Helper()
	msgs := append(append([]map[string]any(nil), c.messages...), map[string]any{"role": "user", "content": text})
	body, err := json.Marshal(map[string]any{"model": "gpt-5.5", "max_tokens": 256, "messages": msgs})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(baseURL+"/v1/messages", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /v1/messages: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		var out struct {
			Content []map[string]any `json:"content"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("response body %s: %v", b, err)
		}
		c.messages = append(msgs, map[string]any{"role": "assistant", "content": out.Content})
	}
	return resp, b
}

func mustOK(t *testing.T, what string, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s; want 200", what, resp.StatusCode, body)
	}
}

// A data plane given two auth.json files serves both accounts: new
// conversations alternate while their headroom is equal; an account at its
// usage limit takes no new conversation and a conversation on it moves to
// the other with one full resend; with both limited the client is told
// the first reset.
func TestSeveralAccounts(t *testing.T) {
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"}})
	cfg := sim.Config(nodetest.WriteAuth(t, "tok-a", "acct-a", ""))
	cfg.ExtraCodexAuth = []string{nodetest.WriteAuth(t, "tok-b", "acct-b", "")}
	cfg.AdminListen = "127.0.0.1:0"
	n := nodetest.Start(t, cfg)

	upgrades := func() (a, b int64) {
		st := sim.Stats()
		return st.UpgradesByAccount["acct-a"], st.UpgradesByAccount["acct-b"]
	}

	// Four new conversations: two on each account (equal headroom, round robin).
	convs := make([]*conversation, 4)
	for i := range convs {
		convs[i] = &conversation{}
		resp, body := convs[i].turn(t, n.URL, fmt.Sprintf("conversation %d, first question", i))
		mustOK(t, "new conversation", resp, body)
	}
	if a, b := upgrades(); a != 2 || b != 2 {
		t.Fatalf("upgrades by account after 4 new conversations = a:%d b:%d; want 2 each", a, b)
	}
	// A second turn continues on its conversation's account: no new socket.
	resp, body := convs[0].turn(t, n.URL, "conversation 0, second question")
	mustOK(t, "continuation", resp, body)
	if a, b := upgrades(); a != 2 || b != 2 {
		t.Fatalf("upgrades after a continuation = a:%d b:%d; want still 2 each", a, b)
	}
	continuedBefore := sim.Stats().ContinuedResponses

	// Conversation 2 (account a) hits a's usage limit.
	resp, body = convs[2].turn(t, n.URL, "#sim usage-limit 600")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("usage-limited turn: HTTP %d %s; want 429", resp.StatusCode, body)
	}
	// New conversations all go to b now.
	for i := range 2 {
		c := &conversation{}
		resp, body := c.turn(t, n.URL, fmt.Sprintf("new conversation %d while a is limited", i))
		mustOK(t, "new conversation while a is limited", resp, body)
	}
	if a, b := upgrades(); a != 2 || b != 4 {
		t.Fatalf("upgrades after 2 new conversations with a limited = a:%d b:%d; want a:2 b:4", a, b)
	}
	// Conversation 0 (account a) moves to b at its next turn: one new
	// socket on b, the whole conversation resent (nothing continued).
	resp, body = convs[0].turn(t, n.URL, "conversation 0, third question")
	mustOK(t, "moved conversation", resp, body)
	if a, b := upgrades(); a != 2 || b != 5 {
		t.Fatalf("upgrades after the move = a:%d b:%d; want a:2 b:5", a, b)
	}
	if got := sim.Stats().ContinuedResponses; got != continuedBefore {
		t.Fatalf("continued responses went from %d to %d; want the moved turn resent in full", continuedBefore, got)
	}
	if logs := n.Logs.String(); strings.Count(logs, "conversation moves to another account") != 1 ||
		!strings.Contains(logs, "from="+account.Key("acct-a")) || !strings.Contains(logs, "to="+account.Key("acct-b")) {
		t.Fatalf("log lacks one line about the move from a to b:\n%s", logs)
	}
	// Its next turn continues on b.
	resp, body = convs[0].turn(t, n.URL, "conversation 0, fourth question")
	mustOK(t, "turn after the move", resp, body)
	if a, b := upgrades(); a != 2 || b != 5 {
		t.Fatalf("upgrades after a turn on the moved conversation = a:%d b:%d; want a:2 b:5", a, b)
	}
	if m := scrape(t, "http://"+n.AdminAddr()+"/metrics"); !strings.Contains(m, "clodex_dataplane_account_moves_total 1\n") {
		t.Fatalf("metrics lack clodex_dataplane_account_moves_total 1:\n%s", grepLines(m, "account_moves"))
	}

	// b hits its limit too, resetting first: the client is told b's reset,
	// five minutes away: when, and not to wait for it (no retry-after).
	limitedAt := time.Now()
	resp, body = convs[1].turn(t, n.URL, "#sim usage-limit 300")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("usage-limited turn on b: HTTP %d %s; want 429", resp.StatusCode, body)
	}
	resp, body = (&conversation{}).turn(t, n.URL, "a new conversation with every account limited")
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("new conversation with both accounts limited: HTTP %d %s; want 429", resp.StatusCode, body)
	}
	refusedAt := time.Now()
	if ra, sr := resp.Header.Get("Retry-After"), resp.Header.Get("X-Should-Retry"); ra != "" || sr != "false" {
		t.Fatalf("retry-after %q, x-should-retry %q; want none and false: b resets in 300 s", ra, sr)
	}
	reset, err := time.Parse(time.RFC3339, resp.Header.Get("anthropic-ratelimit-requests-reset"))
	if err != nil || reset.Before(limitedAt.Add(298*time.Second)) || reset.After(refusedAt.Add(301*time.Second)) ||
		resp.Header.Get("anthropic-ratelimit-tokens-reset") != resp.Header.Get("anthropic-ratelimit-requests-reset") {
		t.Fatalf("reset headers %q, %q (%v); want b's reset, 300 s after its limit (between %s and %s)",
			resp.Header.Get("anthropic-ratelimit-requests-reset"), resp.Header.Get("anthropic-ratelimit-tokens-reset"), err,
			limitedAt.Add(298*time.Second).Format(time.RFC3339), refusedAt.Add(301*time.Second).Format(time.RFC3339))
	}
	if !strings.Contains(string(body), reset.UTC().Format(time.RFC3339)) {
		t.Fatalf("429 body %s; want it to say when b resets (%s)", body, reset.UTC().Format(time.RFC3339))
	}
	if !strings.Contains(string(body), account.Key("acct-b")) || !strings.Contains(string(body), "usage limit") {
		t.Fatalf("429 body %s; want it to name %s, whose reset comes first", body, account.Key("acct-b"))
	}
	if a, b := upgrades(); a != 2 || b != 5 {
		t.Fatalf("upgrades after the refused turn = a:%d b:%d; want no new socket", a, b)
	}
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Two --codex-auth files of the same account are refused at start, naming
// both files.
func TestSeveralAccountsSameAccountRefused(t *testing.T) {
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-a2": "acct-a"}})
	first := nodetest.WriteAuth(t, "tok-a", "acct-a", "")
	second := nodetest.WriteAuth(t, "tok-a2", "acct-a", "")
	cfg := sim.Config(first)
	cfg.ExtraCodexAuth = []string{second}
	_, err := node.Start(t.Context(), cfg, io.Discard, io.Discard)
	var ce *node.ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), first) || !strings.Contains(err.Error(), second) || !strings.Contains(err.Error(), "same account") {
		t.Fatalf("Start with two files of one account = %v; want a *ConfigError naming both files", err)
	}
}
