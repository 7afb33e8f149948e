package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
)

// These tests run the pool against clodex-sim over real coder/websocket
// sockets: previous_response_id is connection-local there, so a wrong
// continuation fails visibly, and the emulator's own counters are checked.

const simToken, simAccount = "sk-pool-test", "acct-pool"

type simEnv struct {
	t     *testing.T
	clock *fakeClock
	sim   *codexsim.Server
	pool  *Pool
	addr  string // the emulator's host:port
}

func newSimEnv(t *testing.T, simCfg codexsim.Config, mutate func(*Config)) *simEnv {
	t.Helper()
	clock := newFakeClock()
	simCfg.AcceptTokens = map[string]string{simToken: simAccount}
	simCfg.Clock = clock.Now
	sim, err := codexsim.New(simCfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		_ = sim.Close()
		ts.Close()
	})
	addr := strings.TrimPrefix(ts.URL, "http://")
	cfg := Config{Upstream: simUpstream(addr), Credentials: staticCredentials(simCred), Clock: clock.Now}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &simEnv{t: t, clock: clock, sim: sim, pool: p, addr: addr}
}

// simCred is the credential the emulator accepts.
var simCred = codexauth.Credential{AccessToken: simToken, AccountID: simAccount}

// simUpstream dials the emulator's ChatGPT endpoint at host:port addr.
func simUpstream(addr string) upstream.DialOptions {
	return upstream.DialOptions{URL: "ws://" + addr + codexsim.ChatGPTPath, DialTimeout: 10 * time.Second}
}

// simResult is one turn as the client saw it.
type simResult struct {
	lease    *Lease // the lease that completed (after any replacement)
	first    *Lease // the lease Acquire returned
	output   [][]byte
	replaced string
}

// turn runs one request the way the gateway will: acquire, send
// previous_response_id + items[Delta:], read to the terminal event,
// replace once on previous_response_not_found, a connection limit or a
// transport failure before output, complete with the echo-shape output.
func (e *simEnv) turn(ctx context.Context, pt Partition, in [][]byte) (simResult, error) {
	l, err := e.pool.Acquire(ctx, pt, in)
	if err != nil {
		return simResult{}, err
	}
	res := simResult{first: l}
	for {
		out, id, failure, err := simExchange(ctx, l, pt, in)
		reason := ""
		switch {
		case err != nil:
			reason = ReplaceTransport
		case failure == "previous_response_not_found":
			reason = ReplacePreviousResponseNotFound
		case failure == "websocket_connection_limit_reached":
			reason = ReplaceConnectionLimit
		case failure != "":
			l.Discard("response failed")
			return res, fmt.Errorf("response failed: %s", failure)
		default:
			l.Complete(id, out, Usage{})
			res.lease, res.output = l, out
			return res, nil
		}
		if res.replaced != "" {
			l.Discard("second failure")
			return res, fmt.Errorf("after %s, %s: %v", res.replaced, reason, err)
		}
		res.replaced = reason
		if l, err = l.Replace(ctx, reason); err != nil {
			return res, err
		}
	}
}

// simExchange sends one response.create and reads the response. It
// returns the output items in the echo shape of docs/pool.md §4 (canonical: keys
// sorted by encoding/json), the response id, or the failure code.
func simExchange(ctx context.Context, l *Lease, pt Partition, in [][]byte) (out [][]byte, id, failure string, err error) {
	frame := map[string]any{"type": "response.create", "model": pt.Model, "instructions": "You are a test.",
		"input": rawItems(in[l.Delta:]), "store": false, "stream": true, "prompt_cache_key": pt.PromptCacheKey,
		"tools": []any{}, "tool_choice": "auto", "include": []string{"reasoning.encrypted_content"}}
	if l.PreviousResponseID != "" {
		frame["previous_response_id"] = l.PreviousResponseID
	}
	if err := l.Conn.Send(ctx, mustJSON(frame)); err != nil {
		return nil, "", "", err
	}
	for {
		b, err := l.Conn.Next(ctx)
		if err != nil {
			return nil, "", "", err
		}
		var ev struct {
			Type     string         `json:"type"`
			Item     map[string]any `json:"item"`
			Response struct {
				ID    string `json:"id"`
				Error struct {
					Code string `json:"code"`
				} `json:"error"`
			} `json:"response"`
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &ev); err != nil {
			return nil, "", "", err
		}
		switch ev.Type {
		case "response.output_item.done":
			out = append(out, echoShape(ev.Item))
		case "response.completed":
			return out, ev.Response.ID, "", nil
		case "response.failed", "response.incomplete":
			return nil, "", cmpOr(ev.Response.Error.Code, ev.Type), nil
		case "error":
			return nil, "", cmpOr(ev.Error.Code, "error"), nil
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// echoShape is a test-only stand-in for translate's output snapshot.
func echoShape(item map[string]any) []byte {
	if item["type"] == "message" {
		var text strings.Builder
		parts, _ := item["content"].([]any)
		for _, p := range parts {
			if m, ok := p.(map[string]any); ok && m["type"] == "output_text" {
				fmt.Fprint(&text, m["text"])
			}
		}
		return assistant(text.String())
	}
	for _, k := range []string{"id", "status", "phase", "role"} {
		delete(item, k)
	}
	for k, v := range item {
		if v == nil {
			delete(item, k)
		}
	}
	if item["type"] == "reasoning" {
		if s, _ := item["encrypted_content"].(string); s != "" {
			delete(item, "summary")
		}
		if c, ok := item["content"].([]any); ok && len(c) == 0 {
			delete(item, "content")
		}
	}
	return mustJSON(item)
}

func simPart(pck string) Partition {
	return Partition{Account: simAccount, Model: "gpt-5-codex", Effort: "high", PromptCacheKey: pck}
}

func withoutReasoning(items [][]byte) [][]byte {
	var out [][]byte
	for _, it := range items {
		if !isReasoning(it) {
			out = append(out, it)
		}
	}
	return out
}

func TestSimThirtyTurnsOnOneSocket(t *testing.T) {
	e := newSimEnv(t, codexsim.Config{}, nil)
	pt := simPart("sim-thirty")
	hist := items(user("#sim reasoning planning\n#sim call Bash {\"command\":\"ls\"}"))
	omitted := 0
	for i := 1; i <= 30; i++ {
		e.clock.Advance(time.Minute)
		r, err := e.turn(t.Context(), pt, hist)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		if i > 1 && (r.first.Decision != DecisionContinuation || r.replaced != "") {
			t.Fatalf("turn %d: %s (replaced %q), want a continuation", i, r.first.Decision, r.replaced)
		}
		if r.first.MatchMode == modeOmittedReasoning {
			omitted++
		}
		out := r.output
		if i%3 == 0 {
			out = withoutReasoning(out) // Claude Code sometimes drops the reasoning block
		}
		hist = append(hist, out...)
		next := "#sim reasoning step\n#sim call Bash {\"command\":\"make\"}"
		if i%2 == 0 {
			next = fmt.Sprintf("#sim reply done with step %d", i)
		}
		var callID string
		for _, it := range r.output {
			var c struct {
				Type   string `json:"type"`
				CallID string `json:"call_id"`
			}
			_ = json.Unmarshal(it, &c)
			if c.Type == "function_call" {
				callID = c.CallID
			}
		}
		if callID != "" {
			hist = append(hist, callOutput(callID, "output\n"+next))
		} else {
			hist = append(hist, user(next))
		}
	}
	st := e.sim.Stats()
	if st.Upgrades != 1 || st.ContinuedResponses != 29 || st.CompletedResponses != 30 || st.PreviousResponseNotFound != 0 {
		t.Errorf("emulator upgrades=%d continued=%d completed=%d not_found=%d, want 1, 29, 30, 0",
			st.Upgrades, st.ContinuedResponses, st.CompletedResponses, st.PreviousResponseNotFound)
	}
	if s := e.pool.Stats(); s.Continuations != 29 {
		t.Errorf("pool continuations = %d, want 29", s.Continuations)
	}
	if omitted == 0 {
		t.Error("no turn matched with its reasoning omitted; the test lost its point")
	}
}

func TestSimPreviousResponseNotFoundRecovers(t *testing.T) {
	e := newSimEnv(t, codexsim.Config{}, nil)
	pt := simPart("sim-pnf")
	in := items(user("#sim reply one"))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	out, _, _, err := simExchange(t.Context(), l, pt, in)
	if err != nil {
		t.Fatal(err)
	}
	l.Complete("resp_unknown_to_this_socket", out, Usage{}) // the head now names a response the socket never had
	in = cat(in, out, items(user("#sim reply two")))
	r, err := e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	if r.first.Decision != DecisionContinuation || r.replaced != ReplacePreviousResponseNotFound || r.lease.Delta != 0 {
		t.Fatalf("first %s replaced %q delta %d, want a continuation replaced after previous_response_not_found with full context", r.first.Decision, r.replaced, r.lease.Delta)
	}
	in = cat(in, r.output, items(user("#sim reply three")))
	r, err = e.turn(t.Context(), pt, in)
	if err != nil || r.first.Decision != DecisionContinuation || r.replaced != "" {
		t.Fatalf("after recovery: %v %+v, want a plain continuation", err, r)
	}
	st := e.sim.Stats()
	if st.Upgrades != 2 || st.PreviousResponseNotFound != 1 || st.ContinuedResponses != 1 {
		t.Errorf("emulator upgrades=%d not_found=%d continued=%d, want 2, 1, 1", st.Upgrades, st.PreviousResponseNotFound, st.ContinuedResponses)
	}
}

func TestSimTransportFailureRecovers(t *testing.T) {
	e := newSimEnv(t, codexsim.Config{}, nil)
	pt := simPart("sim-transport")
	in := items(user("#sim reply one"))
	r, err := e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	// The next response's socket drops after its first event (before output).
	one := 1
	if err := e.sim.SetConfig(codexsim.ConfigPatch{CloseAfterEvents: &one}); err != nil {
		t.Fatal(err)
	}
	in = cat(in, r.output, items(user("#sim reply two")))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := simExchange(t.Context(), l, pt, in); err == nil {
		t.Fatal("exchange on a dropping socket succeeded")
	}
	zero := 0
	if err := e.sim.SetConfig(codexsim.ConfigPatch{CloseAfterEvents: &zero}); err != nil {
		t.Fatal(err)
	}
	nl, err := l.Replace(t.Context(), ReplaceTransport)
	if err != nil {
		t.Fatal(err)
	}
	out, id, failure, err := simExchange(t.Context(), nl, pt, in)
	if err != nil || failure != "" {
		t.Fatalf("replacement: %v %q", err, failure)
	}
	nl.Complete(id, out, Usage{})
	r, err = e.turn(t.Context(), pt, cat(in, out, items(user("#sim reply three"))))
	if err != nil || r.first.Decision != DecisionContinuation {
		t.Fatalf("after recovery: %v %+v", err, r)
	}
	if st := e.sim.Stats(); st.Upgrades != 2 || st.CompletedResponses != 3 {
		t.Errorf("emulator upgrades=%d completed=%d, want 2 and 3", st.Upgrades, st.CompletedResponses)
	}
}

func TestSimRotationBeatsTheSixtyMinuteLimit(t *testing.T) {
	e := newSimEnv(t, codexsim.Config{}, nil)
	pt := simPart("sim-rotate")
	hist := items(user("#sim reply zero"))
	rotated := 0
	for i := 1; i <= 11; i++ { // turns at 0, 1, 8, 15, ... 50 (rotation), 57, 64 minutes
		r, err := e.turn(t.Context(), pt, hist)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		if r.replaced != "" {
			t.Fatalf("turn %d was replaced (%s); rotation should keep sockets under the limit", i, r.replaced)
		}
		if r.first.Decision == DecisionRotation {
			rotated++
		}
		hist = cat(hist, r.output, items(user(fmt.Sprintf("#sim reply turn %d", i))))
		if i == 1 {
			e.clock.Advance(time.Minute)
		} else {
			e.clock.Advance(7 * time.Minute)
		}
	}
	if rotated != 1 {
		t.Errorf("rotations = %d, want 1", rotated)
	}
	if st := e.sim.Stats(); st.Upgrades != 2 || st.Errors["websocket_connection_limit_reached"] != 0 {
		t.Errorf("emulator upgrades=%d errors=%v, want 2 and no connection limit", st.Upgrades, st.Errors)
	}
}

func TestSimConnectionLimitRecovers(t *testing.T) {
	// The emulator's limit is shorter than the pool's rotation age here, so
	// the backend refuses a continuation and the pool replaces the socket.
	e := newSimEnv(t, codexsim.Config{SocketLifetime: 20 * time.Minute}, nil)
	pt := simPart("sim-limit")
	in := items(user("#sim reply one"))
	r, err := e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	in = cat(in, r.output, items(user("#sim reply two")))
	if r, err = e.turn(t.Context(), pt, in); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(20 * time.Minute)
	in = cat(in, r.output, items(user("#sim reply three")))
	r, err = e.turn(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	if r.replaced != ReplaceConnectionLimit || r.lease.Delta != 0 {
		t.Errorf("replaced %q delta %d, want a full-context replacement after the connection limit", r.replaced, r.lease.Delta)
	}
	if st := e.sim.Stats(); st.Upgrades != 2 || st.Errors["websocket_connection_limit_reached"] != 1 {
		t.Errorf("emulator upgrades=%d errors=%v, want 2 and one connection limit", st.Upgrades, st.Errors)
	}
}

func TestSimParallelFanOut(t *testing.T) {
	e := newSimEnv(t, codexsim.Config{}, nil)
	pt := simPart("sim-parent")
	const agents, rounds = 20, 3
	hist := make([][][]byte, agents)
	for a := range agents {
		hist[a] = items(user(fmt.Sprintf("#sim reply agent %d", a)))
	}
	for r := 1; r <= rounds; r++ {
		var wg sync.WaitGroup
		errs := make([]error, agents)
		for a := range agents {
			wg.Go(func() {
				res, err := e.turn(t.Context(), pt, hist[a])
				if err != nil {
					errs[a] = err
					return
				}
				hist[a] = cat(hist[a], res.output, items(user(fmt.Sprintf("#sim reply agent %d round %d", a, r))))
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
	}
	st := e.sim.Stats()
	s := e.pool.Stats()
	// Round 1 opens one socket per agent (parallel or mismatch heads,
	// depending on timing); every later turn continues its own head.
	if st.PreviousResponseNotFound != 0 || st.CompletedResponses != agents*rounds {
		t.Errorf("emulator not_found=%d completed=%d, want 0 and %d", st.PreviousResponseNotFound, st.CompletedResponses, agents*rounds)
	}
	if st.Upgrades != agents || st.ContinuedResponses != agents*(rounds-1) || s.Continuations != agents*(rounds-1) {
		t.Errorf("emulator upgrades=%d continued=%d, pool continuations=%d; want %d, %d, %d",
			st.Upgrades, st.ContinuedResponses, s.Continuations, agents, agents*(rounds-1), agents*(rounds-1))
	}
}
