package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/node/nodetest"
)

// The tests of this package run the gateway as the data plane runs it,
// assembled by package node: the pool opening its own sockets, the
// admission client asking the embedded control plane over its gRPC
// path, the agent, in front of clodex-sim over loopback sockets. They
// assert what the client got and what the emulator saw (its counters and
// its record of each socket's frames). The gateway's own options that the
// data plane does not expose are tested in package gateway.

const (
	simToken   = "tok-test"
	simAccount = "acct-test"
)

var sessionHeader = map[string]string{"X-Claude-Code-Session-Id": "0f7e1c2a-1111-4222-8333-944455556666"}

// env is a data plane in front of a clodex-sim that records its sockets.
type env struct {
	sim    *nodetest.Sim
	dp     *nodetest.Node
	url    string // the data plane's base URL
	client *http.Client
	clock  *gateway.FakeClock // the retry clock
}

type envOptions struct {
	sim    codexsim.Config
	mutate func(*node.Config)
}

// newEnv starts the emulator (accepting simToken for simAccount unless
// o.sim says otherwise) and the data plane, with an auth.json holding
// simToken and a fake retry clock.
func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	simCfg := o.sim
	if simCfg.AcceptTokens == nil && simCfg.Auth == nil {
		simCfg.AcceptTokens = map[string]string{simToken: simAccount}
	}
	simCfg.RecordFrames = true
	e := &env{sim: nodetest.StartSim(t, simCfg), clock: gateway.NewFakeClock()}
	cfg := e.sim.Config(nodetest.WriteAuth(t, simToken, simAccount, ""))
	cfg.RetryClock = e.clock
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	e.dp = nodetest.Start(t, cfg)
	e.url = e.dp.URL
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	e.client = &http.Client{Transport: tr}
	return e
}

// post sends a JSON POST to the data plane with the given extra headers
// ("" deletes one).
func (e *env) post(t *testing.T, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	return gateway.Post(t, e.client, e.url+path, body, hdr)
}

// wsUpstream is a tiny Responses WebSocket for frames clodex-sim cannot
// send, reached by the data plane's own dialer (Config.UpstreamURL): it
// answers the n-th response.create (counted from 1 across sockets) with
// reply(n) and records the close status each socket ends with.
type wsUpstream struct {
	url   string
	reply func(n int) []string

	handlers sync.WaitGroup

	mu      sync.Mutex // guards the following fields
	creates int
	closes  []websocket.StatusCode
}

func newWSUpstream(t *testing.T, reply func(n int) []string) *wsUpstream {
	t.Helper()
	u := &wsUpstream{reply: reply}
	ts := httptest.NewServer(http.HandlerFunc(u.serve))
	u.url = "ws" + strings.TrimPrefix(ts.URL, "http")
	t.Cleanup(func() {
		ts.Close()
		u.handlers.Wait() // every socket was closed by the code under test
	})
	return u
}

func (u *wsUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.handlers.Add(1)
	defer u.handlers.Done()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = c.CloseNow() }()
	ctx := context.Background()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			u.mu.Lock()
			u.closes = append(u.closes, websocket.CloseStatus(err))
			u.mu.Unlock()
			return
		}
		if !strings.Contains(string(data), `"response.create"`) {
			continue
		}
		u.mu.Lock()
		u.creates++
		n := u.creates
		u.mu.Unlock()
		for _, f := range u.reply(n) {
			if err := c.Write(ctx, websocket.MessageText, []byte(f)); err != nil {
				return
			}
		}
	}
}

func (u *wsUpstream) stats() (creates int, closes []websocket.StatusCode) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.creates, slices.Clone(u.closes)
}

func usageLimitFrame(resetSecs int) string {
	return `{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_in_seconds":` +
		strconv.Itoa(resetSecs) + `}}`
}
