package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	simToken   = "tok-test"
	simAccount = "acct-test"
)

// env is a data plane (httptest server) in front of a clodex-sim.
type env struct {
	sim    *codexsim.Server
	simURL string // ws URL of the Responses endpoint
	gw     *Server
	url    string // data plane base URL
	client *http.Client
	rec    *recordingDialer
	clock  *fakeClock // the retry clock unless the test set its own
}

type envOptions struct {
	sim    codexsim.Config
	mutate func(*Config)
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	simCfg := o.sim
	if simCfg.AcceptTokens == nil {
		simCfg.AcceptTokens = map[string]string{simToken: simAccount}
	}
	sim, err := codexsim.New(simCfg)
	if err != nil {
		t.Fatalf("codexsim.New: %v", err)
	}
	simTS := httptest.NewServer(sim.Handler())
	e := &env{sim: sim, simURL: "ws" + strings.TrimPrefix(simTS.URL, "http") + codexsim.ChatGPTPath}
	e.rec = &recordingDialer{inner: UpstreamDialer(upstream.DialOptions{URL: e.simURL, Version: "test"}), url: e.simURL}
	cfg := Config{
		Credentials: NoRefresh(credentials.Static{AccessToken: simToken, AccountID: simAccount}),
		Dialer:      e.rec,
		ListenAddr:  "127.0.0.1:0",
	}
	e.clock = newFakeClock()
	cfg.RetryClock = e.clock
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	gw, err := New(cfg)
	if err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	e.gw = gw
	gwTS := httptest.NewServer(gw.Handler())
	e.url = gwTS.URL
	tr := &http.Transport{}
	e.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		gwTS.Close()
		gw.Close()
		sim.Close()
		simTS.Close()
	})
	return e
}

// recordingDialer wraps the real dialer and records every upstream frame
// and close, so tests can compare what the client saw with what the sim
// sent.
type recordingDialer struct {
	inner Dialer
	url   string // the sim's Responses URL

	mu     sync.Mutex // guards the following fields
	frames [][]byte
	closes []closeRecord
	onNext func([]byte)
	onSend func([]byte) []byte // may rewrite an outgoing frame
}

type closeRecord struct {
	code   websocket.StatusCode
	reason string
}

func (d *recordingDialer) Dial(ctx context.Context, cred credentials.Credential, turn *translate.Turn) (Conn, error) {
	c, err := d.inner.Dial(ctx, cred, turn)
	if err != nil {
		return nil, err
	}
	return &recordingConn{Conn: c, d: d}, nil
}

func (d *recordingDialer) setOnNext(f func([]byte)) {
	d.mu.Lock()
	d.onNext = f
	d.mu.Unlock()
}

func (d *recordingDialer) setSendHook(f func([]byte) []byte) {
	d.mu.Lock()
	d.onSend = f
	d.mu.Unlock()
}

func (c *recordingConn) Send(ctx context.Context, frame []byte) error {
	c.d.mu.Lock()
	f := c.d.onSend
	c.d.mu.Unlock()
	if f != nil {
		frame = f(frame)
	}
	return c.Conn.Send(ctx, frame)
}

func (d *recordingDialer) recorded() ([][]byte, []closeRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([][]byte(nil), d.frames...), append([]closeRecord(nil), d.closes...)
}

type recordingConn struct {
	Conn
	d *recordingDialer
}

func (c *recordingConn) Next(ctx context.Context) ([]byte, error) {
	b, err := c.Conn.Next(ctx)
	if err == nil {
		c.d.mu.Lock()
		c.d.frames = append(c.d.frames, b)
		f := c.d.onNext
		c.d.mu.Unlock()
		if f != nil {
			f(b)
		}
	}
	return b, err
}

func (c *recordingConn) Close(code websocket.StatusCode, reason string) error {
	c.d.mu.Lock()
	c.d.closes = append(c.d.closes, closeRecord{code, reason})
	c.d.mu.Unlock()
	return c.Conn.Close(code, reason)
}

// post sends a JSON POST to the data plane with the given extra headers.
func (e *env) post(t *testing.T, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// errorBody is Anthropic's error shape.
type errorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

func readError(t *testing.T, resp *http.Response) errorBody {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb errorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Type != "error" {
		t.Fatalf("body %q is not an Anthropic error body (%v)", b, err)
	}
	return eb
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return b
}

// completedUsage returns the usage of the response.completed frame the sim
// sent, from the recorded upstream frames.
func completedUsage(t *testing.T, frames [][]byte) (input, cached, output int64) {
	t.Helper()
	for _, f := range frames {
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				Usage struct {
					InputTokens        int64 `json:"input_tokens"`
					InputTokensDetails struct {
						CachedTokens int64 `json:"cached_tokens"`
					} `json:"input_tokens_details"`
					OutputTokens int64 `json:"output_tokens"`
				} `json:"usage"`
			} `json:"response"`
		}
		if json.Unmarshal(f, &ev) == nil && ev.Type == "response.completed" {
			u := ev.Response.Usage
			return u.InputTokens, u.InputTokensDetails.CachedTokens, u.OutputTokens
		}
	}
	t.Fatalf("no response.completed among %d upstream frames", len(frames))
	return
}

// messagesBody is a minimal Messages request with one user text.
func messagesBody(stream bool, text string) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "gpt-5.5",
		"max_tokens": 1024,
		"stream":     stream,
		"messages":   []any{map[string]any{"role": "user", "content": text}},
	})
	return string(b)
}

// waitFor polls cond until it holds or the test's deadline passes. It is
// for conditions another goroutine establishes (the sim noticing a closed
// socket); it asserts nothing about time.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline, ok := t.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	for !cond() {
		if time.Now().After(deadline.Add(-time.Second)) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
