package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/admission"
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/pacing"
)

// conversation builds requests the way Claude Code does: the full history
// every turn, with the session header that keys the prompt cache.
type conversation struct {
	t        *testing.T
	e        *env
	messages []any
}

var sessionHeader = map[string]string{"X-Claude-Code-Session-Id": "0f7e1c2a-1111-4222-8333-944455556666"}

// turn sends user text and returns the assistant's text; the reply is
// appended to the history as Claude Code echoes it.
func (c *conversation) turn(text string) string {
	c.t.Helper()
	c.messages = append(c.messages, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": text}}})
	body, _ := json.Marshal(map[string]any{"model": "gpt-5.5", "max_tokens": 1024, "messages": c.messages})
	resp := c.e.post(c.t, "/v1/messages?beta=true", string(body), sessionHeader)
	b := readAll(c.t, resp)
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
		json.Unmarshal(blk, &tb)
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
	var once sync.Once
	e.rec.setSendHook(func(frame []byte) []byte {
		if !strings.Contains(string(frame), `"previous_response_id":"resp_`) {
			return frame
		}
		out := frame
		once.Do(func() {
			var m map[string]any
			json.Unmarshal(frame, &m)
			m["previous_response_id"] = "resp_forgotten"
			out, _ = json.Marshal(m)
		})
		return out
	})
	c := &conversation{t: t, e: e}
	if got := c.turn("#sim reply first"); got != "first" {
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
	if sleeps := e.clock.Sleeps(); len(sleeps) != 0 {
		t.Errorf("waits %v, want none: a replacement runs at once", sleeps)
	}
}

// A socket that drops before any output is retried on a new socket after
// the first backoff rung; the client sees only the answer.
func TestTransportDropBeforeOutputRecovers(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{CloseAfterEvents: 1}}})
	healthy := 0
	e.clock.onSleep = func(time.Duration) {
		if err := e.sim.SetConfig(codexsim.ConfigPatch{CloseAfterEvents: &healthy}); err != nil {
			t.Errorf("SetConfig: %v", err)
		}
	}
	resp := e.post(t, "/v1/messages", messagesBody(true, "#sim reply recovered"), nil)
	body := string(readAll(t, resp))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"text":"recovered"`) && !strings.Contains(body, "recovered") || !strings.Contains(body, "event: message_stop") || strings.Contains(body, "event: error") {
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
	resp := e.post(t, "/v1/messages", messagesBody(true, "#sim reply "+strings.Repeat("word ", 100)), nil)
	body := string(readAll(t, resp))
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

// refreshingSource hands out old until Rejected is called with it.
type refreshingSource struct {
	mu       sync.Mutex
	current  credentials.Credential
	next     credentials.Credential
	err      error // returned by Rejected when set
	rejected []credentials.Secret
}

func (s *refreshingSource) Credential(context.Context) (credentials.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current, nil
}

func (s *refreshingSource) Rejected(_ context.Context, tok credentials.Secret) (credentials.Credential, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejected = append(s.rejected, tok)
	if s.err != nil {
		return credentials.Credential{}, s.err
	}
	s.current = s.next
	return s.current, nil
}

func TestRejectedTokenIsRefreshedOnce(t *testing.T) {
	src := &refreshingSource{
		current: credentials.Credential{AccessToken: "tok-expired", AccountID: simAccount},
		next:    credentials.Credential{AccessToken: simToken, AccountID: simAccount},
	}
	e := newEnv(t, envOptions{mutate: func(c *Config) { c.Credentials = src }})
	resp := e.post(t, "/v1/messages", messagesBody(false, "#sim reply fresh"), nil)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "fresh") {
		t.Fatalf("status %d body %s, want 200 with the reply", resp.StatusCode, body)
	}
	if !slices.Equal(src.rejected, []credentials.Secret{"tok-expired"}) {
		t.Errorf("Rejected calls %v, want one with the expired token", src.rejected)
	}
	if st := e.sim.Stats(); st.Upgrade401s != 1 || st.Upgrades != 1 {
		t.Errorf("sim 401s=%d upgrades=%d, want 1 and 1", st.Upgrade401s, st.Upgrades)
	}
	if len(e.clock.Sleeps()) != 0 {
		t.Errorf("waits %v, want none before the refreshed retry", e.clock.Sleeps())
	}
}

func TestLoginRequiredIs401WithoutRetry(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"refresh token dead", fmt.Errorf("refresh: %w", credentials.ErrLoginRequired), "codex login"},
		{"refresh impossible", errors.New("token unchanged"), "could not be refreshed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := &refreshingSource{current: credentials.Credential{AccessToken: "tok-expired", AccountID: simAccount}, err: tt.err}
			e := newEnv(t, envOptions{mutate: func(c *Config) { c.Credentials = src }})
			resp := e.post(t, "/v1/messages", messagesBody(true, "#sim reply x"), nil)
			if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("X-Should-Retry") != "false" {
				t.Errorf("status %d x-should-retry %q, want 401 and false", resp.StatusCode, resp.Header.Get("X-Should-Retry"))
			}
			eb := readError(t, resp)
			if eb.Error.Type != "authentication_error" || !strings.Contains(eb.Error.Message, tt.want) {
				t.Errorf("error %+v, want authentication_error mentioning %q", eb.Error, tt.want)
			}
			if strings.Contains(eb.Error.Message, "tok-expired") {
				t.Errorf("error message %q leaks the token", eb.Error.Message)
			}
			if len(src.rejected) != 1 {
				t.Errorf("Rejected called %d times, want 1", len(src.rejected))
			}
			if st := e.sim.Stats(); st.Upgrade401s != 1 {
				t.Errorf("sim 401s = %d, want 1 (no retry after a failed refresh)", st.Upgrade401s)
			}
		})
	}
}

// A pacer refusal makes the next attempt wait exactly its hint.
func TestAdmissionRefusalWaitsExactlyTheHint(t *testing.T) {
	clk := newFakeClock()
	var mu sync.Mutex
	var asked []time.Duration
	admit := pool.AdmitterFunc(func(ctx context.Context, acct string) error {
		mu.Lock()
		defer mu.Unlock()
		if acct != simAccount {
			t.Errorf("Admit account %q, want %q", acct, simAccount)
		}
		asked = append(asked, clk.Now().Sub(epoch))
		if len(asked) <= 2 {
			return &admission.RefusedError{RetryAfter: 4 * time.Second, RequiredWait: 9 * time.Second}
		}
		return nil
	})
	var p *pool.Pool
	e := newEnv(t, envOptions{mutate: func(c *Config) {
		var err error
		p, err = pool.New(pool.Config{Dialer: PoolDialer(upstream.DialOptions{URL: c.Dialer.(*recordingDialer).url}, c.Credentials), Admitter: admit})
		if err != nil {
			t.Fatal(err)
		}
		c.Pool = p
		c.RetryClock = clk
		c.Budget = pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 5}
	}})
	t.Cleanup(func() { p.Close() })
	resp := e.post(t, "/v1/messages", messagesBody(false, "#sim reply admitted"), sessionHeader)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d body %s, want 200", resp.StatusCode, body)
	}
	if want := []time.Duration{0, 4 * time.Second, 8 * time.Second}; !slices.Equal(asked, want) {
		t.Errorf("admission asked at %v, want %v", asked, want)
	}
}

// Refusals until the retries run out: 429 rate_limit_error with a
// retry-after in [h, ceil(1.25 h)].
func TestAdmissionRefusalsExhausted(t *testing.T) {
	clk := newFakeClock()
	admit := pool.AdmitterFunc(func(context.Context, string) error {
		return &admission.RefusedError{RetryAfter: 4 * time.Second}
	})
	var p *pool.Pool
	e := newEnv(t, envOptions{mutate: func(c *Config) {
		p, _ = pool.New(pool.Config{Dialer: PoolDialer(upstream.DialOptions{URL: c.Dialer.(*recordingDialer).url}, c.Credentials), Admitter: admit})
		c.Pool = p
		c.RetryClock = clk
		c.Budget = pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 2}
	}})
	t.Cleanup(func() { p.Close() })
	resp := e.post(t, "/v1/messages", messagesBody(true, "#sim reply x"), sessionHeader)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	if ra := resp.Header.Get("Retry-After"); ra != "4" && ra != "5" {
		t.Errorf("retry-after %q, want 4 or 5", ra)
	}
	if eb := readError(t, resp); eb.Error.Type != "rate_limit_error" {
		t.Errorf("error %+v, want rate_limit_error", eb.Error)
	}
	if got, want := clk.Sleeps(), []time.Duration{4 * time.Second, 4 * time.Second}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v", got, want)
	}
	if st := e.sim.Stats(); st.Upgrades != 0 {
		t.Errorf("sim upgrades = %d, want 0", st.Upgrades)
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

// PoolDialer reads the credential at each dial (a refreshed token is used
// for new sockets) and its Close releases the socket at once.
func TestPoolDialerUsesCurrentCredentialAndHardCloses(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"}}})
	src := &refreshingSource{current: credentials.Credential{AccessToken: "tok-a", AccountID: "acct-a"},
		next: credentials.Credential{AccessToken: "tok-b", AccountID: "acct-b"}}
	d := PoolDialer(upstream.DialOptions{URL: e.simURL}, src)
	c1, err := d.Dial(t.Context(), pool.Partition{})
	if err != nil {
		t.Fatalf("first dial: %v", err)
	}
	if _, err := src.Rejected(t.Context(), "tok-a"); err != nil {
		t.Fatal(err)
	}
	c2, err := d.Dial(t.Context(), pool.Partition{})
	if err != nil {
		t.Fatalf("second dial: %v", err)
	}
	if st := e.sim.Stats(); st.UpgradesByAccount["acct-a"] != 1 || st.UpgradesByAccount["acct-b"] != 1 || st.OpenSockets != 2 {
		t.Errorf("sim upgrades by account %v open %d, want one each and 2 open", st.UpgradesByAccount, st.OpenSockets)
	}
	c1.Close("test")
	c2.Close("test")
	waitFor(t, "the sim to see both sockets closed", func() bool { return e.sim.Stats().OpenSockets == 0 })

	src.current = credentials.Credential{AccessToken: "tok-unknown", AccountID: "acct-a"}
	_, err = d.Dial(t.Context(), pool.Partition{})
	var rej *rejectedError
	if !errors.As(err, &rej) || rej.token != "tok-unknown" || strings.Contains(err.Error(), "tok-unknown") {
		t.Errorf("dial with a refused token: %v, want a 401 rejection carrying (but not printing) the token", err)
	}
}
