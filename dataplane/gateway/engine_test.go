package gateway_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/node/nodetest"
	"github.com/clodex/clodex/internal/pacing"
)

// conversation builds requests the way Claude Code does: the full history
// every turn, with the session header that keys the prompt cache.
type conversation struct {
	t        *testing.T
	e        *env
	messages []any
}

// turn sends user text and returns the assistant's text; the reply is
// appended to the history as Claude Code echoes it.
func (c *conversation) turn(text string) string {
	c.t.Helper()
	c.messages = append(c.messages, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": text}}})
	body, _ := json.Marshal(map[string]any{"model": "gpt-5.5", "max_tokens": 1024, "messages": c.messages})
	resp := c.e.post(c.t, "/v1/messages?beta=true", string(body), sessionHeader)
	b := gateway.ReadAll(c.t, resp)
	if resp.StatusCode != http.StatusOK {
		c.t.Fatalf("turn %q: status %d: %s", text, resp.StatusCode, b)
	}
	var msg struct {
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(b, &msg); err != nil {
		c.t.Fatalf("turn %q: body %s: %v", text, b, err)
	}
	c.messages = append(c.messages, map[string]any{"role": "assistant", "content": msg.Content})
	var texts []string
	for _, blk := range msg.Content {
		var tb struct{ Type, Text string }
		if err := json.Unmarshal(blk, &tb); err != nil {
			c.t.Fatalf("turn %q: content block %s: %v", text, blk, err)
		}
		if tb.Type == "text" {
			texts = append(texts, tb.Text)
		}
	}
	return strings.Join(texts, "")
}

func TestConversationRunsOnOneSocket(t *testing.T) {
	e := newEnv(t, envOptions{})
	c := &conversation{t: t, e: e}
	for i := range 30 {
		want := fmt.Sprintf("answer number %d", i)
		if got := c.turn("#sim reply " + want); got != want {
			t.Fatalf("turn %d: reply %q, want %q", i, got, want)
		}
	}
	st := e.sim.Stats()
	if st.Upgrades != 1 || st.ContinuedResponses != 29 || st.CompletedResponses != 30 {
		t.Errorf("sim upgrades=%d continued=%d completed=%d, want 1, 29 and 30", st.Upgrades, st.ContinuedResponses, st.CompletedResponses)
	}
	if st.OpenSockets != 1 {
		t.Errorf("sim open sockets = %d, want 1 (the head is kept)", st.OpenSockets)
	}
}

// A continuation whose previous response the backend lost is replayed with
// the full context on a new socket; the client never notices.
func TestPreviousResponseNotFoundIsInvisible(t *testing.T) {
	e := newEnv(t, envOptions{})
	c := &conversation{t: t, e: e}
	if got := c.turn("#sim reply first\n#sim forget"); got != "first" { // the backend will not find it
		t.Fatalf("turn 1 reply %q", got)
	}
	if got := c.turn("#sim reply second"); got != "second" {
		t.Fatalf("turn 2 reply %q, want second", got)
	}
	if got := c.turn("#sim reply third"); got != "third" {
		t.Fatalf("turn 3 reply %q, want third", got)
	}
	st := e.sim.Stats()
	if st.PreviousResponseNotFound != 1 || st.Upgrades != 2 || st.ContinuedResponses != 1 {
		t.Errorf("sim not_found=%d upgrades=%d continued=%d, want 1, 2 (the replacement) and 1 (turn 3 on the replacement)",
			st.PreviousResponseNotFound, st.Upgrades, st.ContinuedResponses)
	}
	// The replacement carried the whole conversation, without
	// previous_response_id.
	socks := e.sim.Sockets()
	if len(socks) != 2 {
		t.Fatalf("sim saw %d sockets, want 2", len(socks))
	}
	sent := socks[1].Sent()
	if len(sent) != 2 || strings.Contains(string(sent[0]), `"previous_response_id"`) ||
		!strings.Contains(string(sent[0]), "#sim reply first") || !strings.Contains(string(sent[0]), "#sim reply second") {
		t.Errorf("the replacement socket's first frame %.400s, want the full context without previous_response_id", sent[0])
	}
	if sleeps := e.clock.Sleeps(); len(sleeps) != 0 {
		t.Errorf("waits %v, want none: a replacement runs at once", sleeps)
	}
}

// A socket that drops before any output is retried on a new socket after
// the first backoff rung; the client sees only the answer.
func TestTransportDropBeforeOutputRecovers(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 1}}})
	healthy := 0
	e.clock.OnSleep(func(time.Duration) {
		if err := e.sim.SetConfig(codexsim.ConfigPatch{CloseAfterEvents: &healthy}); err != nil {
			t.Errorf("SetConfig: %v", err)
		}
	})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply recovered"), nil)
	body := string(gateway.ReadAll(t, resp))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "recovered") || !strings.Contains(body, "event: message_stop") || strings.Contains(body, "event: error") {
		t.Fatalf("status %d body %s, want a complete stream with the reply and no error", resp.StatusCode, body)
	}
	if got, want := e.clock.Sleeps(), []time.Duration{2 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v (the first rung)", got, want)
	}
	if st := e.sim.Stats(); st.Upgrades != 2 {
		t.Errorf("sim upgrades = %d, want 2", st.Upgrades)
	}
}

// A drop after output ends the stream with an SSE error event and is not
// retried.
func TestTransportDropAfterOutputIsSSEError(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 8}}})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply "+strings.Repeat("word ", 100)), nil)
	body := string(gateway.ReadAll(t, resp))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "event: content_block_delta") ||
		!strings.Contains(body, "event: error") || strings.Contains(body, "event: message_stop") {
		t.Fatalf("status %d body %s, want output then an SSE error event and no message_stop", resp.StatusCode, body)
	}
	if !strings.Contains(body, `"type":"api_error"`) {
		t.Errorf("error event %s, want api_error", body[strings.Index(body, "event: error"):])
	}
	if st := e.sim.Stats(); st.Upgrades != 1 {
		t.Errorf("sim upgrades = %d, want 1 (no retry after output)", st.Upgrades)
	}
}

// startAuthSim starts an emulator with its OAuth authority: it accepts
// the access tokens it issues and refreshes them at /oauth/token.
func startAuthSim(t *testing.T) (codexsim.Config, *simauth.Authority) {
	t.Helper()
	auth, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return codexsim.Config{Auth: auth}, auth
}

// An upgrade refused with 401 makes the data plane refresh the sign-in
// once, at the token endpoint, and retry at once with the new token.
func TestRejectedTokenIsRefreshedOnce(t *testing.T) {
	simCfg, auth := startAuthSim(t)
	issued, err := auth.Issue(simAccount)
	if err != nil {
		t.Fatal(err)
	}
	authFile := nodetest.WriteAuth(t, "tok-expired", simAccount, issued.RefreshToken)
	e := newEnv(t, envOptions{sim: simCfg, mutate: func(c *node.Config) { c.CodexAuth = authFile }})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply fresh"), nil)
	body := gateway.ReadAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "fresh") {
		t.Fatalf("status %d body %s, want 200 with the reply", resp.StatusCode, body)
	}
	if st := e.sim.Stats(); st.Upgrade401s != 1 || st.Upgrades != 1 || st.TokenRefreshes != 1 {
		t.Errorf("sim 401s=%d upgrades=%d refreshes=%d, want 1, 1 and 1", st.Upgrade401s, st.Upgrades, st.TokenRefreshes)
	}
	if len(e.clock.Sleeps()) != 0 {
		t.Errorf("waits %v, want none before the refreshed retry", e.clock.Sleeps())
	}
	if b, err := os.ReadFile(authFile); err != nil || strings.Contains(string(b), "tok-expired") {
		t.Errorf("auth.json after the refresh: %v, still holds the rejected token: %t", err, strings.Contains(string(b), "tok-expired"))
	}
}

// A rejected token that cannot be refreshed is a 401 the client must not
// retry, and the upgrade is not tried again.
func TestLoginRequiredIs401WithoutRetry(t *testing.T) {
	for _, tt := range []struct {
		name    string
		refresh string // --refresh
		want    string
	}{
		{"refresh token dead", node.RefreshAuto, "codex login"},
		{"refresh impossible", node.RefreshNever, "could not be refreshed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			simCfg, _ := startAuthSim(t)
			authFile := nodetest.WriteAuth(t, "tok-expired", simAccount, "rt-unknown-to-the-sim")
			e := newEnv(t, envOptions{sim: simCfg, mutate: func(c *node.Config) {
				c.CodexAuth = authFile
				c.Refresh = tt.refresh
			}})
			resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "#sim reply x"), nil)
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("status %d x-should-retry %q, want 401 and false", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
			}
			eb := gateway.ReadError(t, resp)
			if eb.Error.Type != "authentication_error" || !strings.Contains(eb.Error.Message, tt.want) {
				t.Errorf("error %+v, want authentication_error mentioning %q", eb.Error, tt.want)
			}
			if strings.Contains(eb.Error.Message, "tok-expired") || strings.Contains(e.dp.Logs.String(), "tok-expired") {
				t.Errorf("the token reached the error %q or the log", eb.Error.Message)
			}
			if st := e.sim.Stats(); st.Upgrade401s != 1 || st.Upgrades != 0 {
				t.Errorf("sim 401s = %d upgrades = %d, want 1 and 0 (no retry after a failed refresh)", st.Upgrade401s, st.Upgrades)
			}
		})
	}
}

// jwt returns an unsigned JWT whose payload is claims (the data plane
// reads claims, never signatures).
func jwt(claims map[string]any) string {
	b, _ := json.Marshal(claims)
	enc := base64.RawURLEncoding
	return enc.EncodeToString([]byte(`{"alg":"none"}`)) + "." + enc.EncodeToString(b) + ".sig"
}

// A credential that cannot be had at all (expired, and the token endpoint
// unreachable) is a 401 that names no token.
func TestCredentialUnavailableIs401(t *testing.T) {
	expired := jwt(map[string]any{"exp": time.Now().Add(-time.Hour).Unix(), "chatgpt_account_id": simAccount})
	authFile := nodetest.WriteAuth(t, expired, simAccount, "rt-SECRET")
	e := newEnv(t, envOptions{mutate: func(c *node.Config) {
		c.CodexAuth = authFile
		c.TokenEndpoint = "http://127.0.0.1:1/oauth/token"
	}})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(true, "hi"), nil)
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", resp.StatusCode)
	}
	eb := gateway.ReadError(t, resp)
	if eb.Error.Type != "authentication_error" || strings.Contains(eb.Error.Message, "SECRET") || strings.Contains(eb.Error.Message, expired) {
		t.Errorf("error = %+v, want authentication_error without a token", eb.Error)
	}
	if st := e.sim.Stats(); st.Upgrades+st.Upgrade401s != 0 {
		t.Errorf("sim saw %d upgrades and %d 401s, want none without a credential", st.Upgrades, st.Upgrade401s)
	}
}

// A head the backend retired (websocket_connection_limit_reached) is
// replaced at once with the full context; the client never notices.
func TestConnectionLimitReplacesSocket(t *testing.T) {
	var mu sync.Mutex
	simNow := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	e := newEnv(t, envOptions{sim: codexsim.Config{SocketLifetime: time.Hour, Clock: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return simNow
	}}})
	c := &conversation{t: t, e: e}
	if got := c.turn("#sim reply before"); got != "before" {
		t.Fatalf("turn 1 reply %q", got)
	}
	mu.Lock()
	simNow = simNow.Add(61 * time.Minute)
	mu.Unlock()
	if got := c.turn("#sim reply after"); got != "after" {
		t.Fatalf("turn 2 reply %q, want after", got)
	}
	st := e.sim.Stats()
	if st.Errors["websocket_connection_limit_reached"] != 1 || st.Upgrades != 2 || st.CompletedResponses != 2 {
		t.Errorf("sim connection-limit errors=%d upgrades=%d completed=%d, want 1, 2 and 2",
			st.Errors["websocket_connection_limit_reached"], st.Upgrades, st.CompletedResponses)
	}
	if sleeps := e.clock.Sleeps(); len(sleeps) != 0 {
		t.Errorf("waits %v, want none: a replacement runs at once", sleeps)
	}
}

// The control plane's pacing reaches the client: with one token a minute
// of burst spent, a turn that needs a new socket is refused by the
// embedded control plane on every attempt, waits each refusal's hint, and
// is answered 429 rate_limit_error with a retry-after; it never dials.
func TestPacingRefusalIs429(t *testing.T) {
	e := newEnv(t, envOptions{mutate: func(c *node.Config) {
		c.Policy = pacing.Policy{RatePerMinute: 3, Burst: 1, Budget: pacing.DefaultBudget()}
		c.AdminListen = "127.0.0.1:0"
	}})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply admitted"), nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("first turn: status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	gateway.ReadAll(t, resp)
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply refused"), nil) // a new socket: no session
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second turn: status %d retry-after %q, want 429 with a retry-after", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if eb := gateway.ReadError(t, resp); eb.Error.Type != "rate_limit_error" || !strings.Contains(eb.Error.Message, "pacing") {
		t.Errorf("error %+v, want rate_limit_error naming the pacing", eb.Error)
	}
	// One token every 20 s: each refusal's hint is at most that, and the
	// turn waited it before each of its 5 retries.
	sleeps := e.clock.Sleeps()
	if len(sleeps) != pacing.DefaultMaxRetries {
		t.Errorf("waits %v, want %d (one per retry)", sleeps, pacing.DefaultMaxRetries)
	}
	for _, d := range sleeps {
		if d <= 0 || d > 20*time.Second {
			t.Errorf("wait %v, want a refusal hint in (0, 20s]", d)
		}
	}
	if st := e.sim.Stats(); st.Upgrades != 1 {
		t.Errorf("sim upgrades = %d, want 1 (the refused turn never dialed)", st.Upgrades)
	}
	// Operators see the refusals: every refused attempt, and the failed turn.
	mresp, err := e.client.Get("http://" + e.dp.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	m := string(gateway.ReadAll(t, mresp))
	for _, want := range []string{
		"clodex_dataplane_pacer_refusals_total " + strconv.Itoa(pacing.DefaultMaxRetries+1),
		`clodex_dataplane_failed_turns_total{status="429"} 1`,
	} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, m)
		}
	}
}

// On shutdown the pool tells the backend: every idle socket gets a close
// frame with 1001 "pool closed".
func TestShutdownClosesIdleSocketsWithGoingAway(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply hello"), sessionHeader)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	gateway.ReadAll(t, resp)
	if socks := e.sim.Sockets(); len(socks) != 1 || socks[0].Closed {
		t.Fatalf("sim sockets %+v before shutdown, want one open head", socks)
	}
	e.dp.Stop(t)
	gateway.WaitFor(t, "the sim to see the socket closed", func() bool { return e.sim.Sockets()[0].Closed })
	if s := e.sim.Sockets()[0]; s.CloseStatus != websocket.StatusGoingAway || s.CloseReason != "pool closed" {
		t.Errorf("the sim saw the head closed with %v %q, want 1001 \"pool closed\"", s.CloseStatus, s.CloseReason)
	}
}
