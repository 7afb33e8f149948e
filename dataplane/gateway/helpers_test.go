package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/pacing"
)

// TestMain checks for leaked goroutines after the tests of both packages,
// gateway and gateway_test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	simToken   = "tok-test"
	simAccount = "acct-test"
)

// unitEnv is the gateway alone over a pool of sockets to a clodex-sim: for tests of the gateway's own options (BudgetFor,
// MaxBodyBytes, a non-loopback ListenAddr, a pool's Admitter) that the
// assembly does not expose. Tests of the data plane as it runs build it
// with package node, in gateway_test.
type unitEnv struct {
	sim    *codexsim.Server
	simURL string // the sim's Responses WebSocket
	gw     *Server
	url    string // the gateway's base URL
	client *http.Client
	clock  *FakeClock // the retry clock
}

type unitOptions struct {
	sim      codexsim.Config
	admitter pool.Admitter // the pool's (Optional; nil admits every dial)
	budget   pacing.Budget // every account's (Optional; zero: the default)
	mutate   func(*Config)
}

func newUnitEnv(t *testing.T, o unitOptions) *unitEnv {
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
	simURL := "ws" + strings.TrimPrefix(simTS.URL, "http") + codexsim.ChatGPTPath
	router := newRouter(t, simToken, simAccount)
	p, err := pool.New(pool.Config{Upstream: upstream.DialOptions{URL: simURL}, Credentials: router, Admitter: o.admitter})
	if err != nil {
		t.Fatalf("pool.New: %v", err)
	}
	e := &unitEnv{sim: sim, simURL: simURL, clock: NewFakeClock()}
	cfg := Config{Router: router, Pool: p, Budgets: retry.NewBudgets(o.budget), ListenAddr: "127.0.0.1:0", RetryClock: e.clock}
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
		p.Close()
		sim.Close()
		simTS.Close()
	})
	return e
}

// newRouter is the accounts router of one auth.json holding accessToken
// for accountID.
func newRouter(t testing.TB, accessToken, accountID string) *accounts.Router {
	t.Helper()
	b, err := json.Marshal(map[string]any{"auth_mode": "chatgpt", "tokens": map[string]string{"access_token": accessToken, "account_id": accountID}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	files, err := accounts.OpenFiles(context.Background(), []accounts.FileConfig{{Path: path}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := accounts.NewRouter(accounts.Config{Source: files})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// noUpstream is a pool's credential source for a gateway that must never
// reach an upstream: every dial fails with msg.
func noUpstream(msg string) pool.Credentials {
	return pool.CredentialsFunc(func(context.Context, string) (codexauth.Credential, error) {
		return codexauth.Credential{}, errors.New(msg)
	})
}

// post sends a JSON POST to the gateway with the given extra headers ("" deletes one).
func (e *unitEnv) post(t *testing.T, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	return Post(t, e.client, e.url+path, body, hdr)
}

// The helpers below are shared with package gateway_test.

// Post sends a JSON POST to url with the given extra headers ("" deletes
// one).
func Post(t *testing.T, client *http.Client, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
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
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	return resp
}

// ErrorBody is Anthropic's error shape.
type ErrorBody struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}

// ReadError reads and closes resp's body, failing t unless it is an
// Anthropic error body.
func ReadError(t *testing.T, resp *http.Response) ErrorBody {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Type != "error" {
		t.Fatalf("body %q is not an Anthropic error body (%v)", b, err)
	}
	return eb
}

// ReadAll reads and closes resp's body.
func ReadAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return b
}

// MessagesBody is a minimal Messages request with one user text.
func MessagesBody(stream bool, text string) string {
	b, _ := json.Marshal(map[string]any{
		"model":      "gpt-5.5",
		"max_tokens": 1024,
		"stream":     stream,
		"messages":   []any{map[string]any{"role": "user", "content": text}},
	})
	return string(b)
}

// WaitFor polls cond until it holds or the test's deadline passes. It is
// for conditions another goroutine establishes (the sim noticing a closed
// socket); it asserts nothing about time.
func WaitFor(t *testing.T, what string, cond func() bool) {
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
