package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/dataplane/upstream/upstreamtest"
	"github.com/clodex/clodex/internal/codexauth"
)

// fakeClock is a manually advanced clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// The pool's tests dial real sockets: an upstreamtest server (loopback,
// or in-memory pipes inside a synctest bubble) through the env's dialer,
// the pool's HTTP transport, which sees every dial and every socket's
// connection.

// tconn is one socket the dialer opened. Its id is its dial order among
// the dials that opened a socket (1-based); body is the client's side of
// its connection, which the pool's close releases; peer the server's side.
type tconn struct {
	id      int
	attempt int // the dial attempt that opened it (dialHeader)
	d       *dialer
	body    *trackedBody

	mu     sync.Mutex // guards the following fields
	peer   *upstreamtest.Peer
	sent   int      // frames the test sent on it (env.send)
	frames [][]byte // the first of them, as the peer received them
}

// isClosed reports whether the client released the socket.
func (c *tconn) isClosed() bool { return c.body.closed.Load() }

// peerSide returns the server's side of c, waiting for the server to list
// it (it accepts before the client sees the upgrade's answer).
func (c *tconn) peerSide(t *testing.T) *upstreamtest.Peer {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peer != nil {
		return c.peer
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	want := strconv.Itoa(c.attempt)
	for c.peer == nil {
		for _, p := range c.d.srv.Peers() {
			if p.Header.Get(dialHeader) == want {
				c.peer = p
			}
		}
		if c.peer == nil {
			if _, err := c.d.srv.Accept(ctx); err != nil {
				t.Fatalf("conn %d: the server never accepted it: %v", c.id, err)
			}
		}
	}
	return c.peer
}

// dialHeader numbers each upgrade by its attempt, so a socket's two sides
// are paired.
const dialHeader = "X-Test-Dial"

// trackedBody is the client's side of a socket's connection (the upgrade
// response's body): it counts writes and records the close.
type trackedBody struct {
	io.ReadWriteCloser
	writes  atomic.Int64
	closed  atomic.Bool
	onClose func()
}

func (b *trackedBody) Write(p []byte) (int, error) {
	b.writes.Add(1)
	return b.ReadWriteCloser.Write(p)
}

func (b *trackedBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		b.onClose()
	}
	return b.ReadWriteCloser.Close()
}

// dialer is the pool's HTTP transport: it counts dial attempts, fails the
// attempts fail says (n is the 1-based attempt), and tracks each socket
// it opens.
type dialer struct {
	base http.RoundTripper
	srv  *upstreamtest.Server

	mu         sync.Mutex
	attempts   int
	conns      []*tconn
	closeOrder []int
	fail       func(n int) error
}

func (d *dialer) RoundTrip(r *http.Request) (*http.Response, error) {
	d.mu.Lock()
	d.attempts++
	n, fail := d.attempts, d.fail
	d.mu.Unlock()
	if fail != nil {
		if err := fail(n); err != nil {
			return nil, err
		}
	}
	c := &tconn{attempt: n, d: d}
	r = r.Clone(r.Context())
	r.Header.Set(dialHeader, strconv.Itoa(n))
	resp, err := d.base.RoundTrip(r)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		return resp, err
	}
	c.body = &trackedBody{ReadWriteCloser: resp.Body.(io.ReadWriteCloser), onClose: func() {
		d.mu.Lock()
		d.closeOrder = append(d.closeOrder, c.id)
		d.mu.Unlock()
	}}
	resp.Body = c.body
	d.mu.Lock()
	c.id = len(d.conns) + 1
	d.conns = append(d.conns, c)
	d.mu.Unlock()
	return resp, nil
}

func (d *dialer) dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

func (d *dialer) closed() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int(nil), d.closeOrder...)
}

// writes returns each socket's write count, by conn.
func (d *dialer) writes() map[*tconn]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := make(map[*tconn]int64, len(d.conns))
	for _, c := range d.conns {
		w[c] = c.body.writes.Load()
	}
	return w
}

// wrote returns the one socket written to since before.
func (d *dialer) wrote(t *testing.T, before map[*tconn]int64) *tconn {
	t.Helper()
	var got *tconn
	for c, n := range d.writes() {
		if n != before[c] {
			if got != nil {
				t.Fatalf("conns %d and %d both written to; want one", got.id, c.id)
			}
			got = c
		}
	}
	if got == nil {
		t.Fatal("no socket written to")
	}
	return got
}

// testCred is the credential every test socket is dialled with.
var testCred = codexauth.Credential{AccessToken: "tok-test", AccountID: "acct-1"}

func staticCredentials(cred codexauth.Credential) Credentials {
	return CredentialsFunc(func(context.Context, string) (codexauth.Credential, error) { return cred, nil })
}

// countingAdmitter counts admissions; hook, when set, runs inside Admit.
type countingAdmitter struct {
	mu    sync.Mutex
	n     int
	hook  func(n int) error
	accts []string
}

func (a *countingAdmitter) Admit(ctx context.Context, account string) error {
	a.mu.Lock()
	a.n++
	n := a.n
	a.accts = append(a.accts, account)
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		return hook(n)
	}
	return nil
}

func (a *countingAdmitter) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n
}

type env struct {
	t      *testing.T
	clock  *fakeClock
	srv    *upstreamtest.Server
	dialer *dialer
	admit  *countingAdmitter
	diag   *bytes.Buffer
	diagMu *sync.Mutex
	wrote  chan struct{} // signalled after every diagnostics write
	notes  *[]string
	pool   *Pool

	mu     sync.Mutex                // guards byConn
	byConn map[*upstream.Conn]*tconn // the sockets identified so far
}

type syncBuffer struct {
	mu    *sync.Mutex
	buf   *bytes.Buffer
	wrote chan struct{}
}

func (b syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	n, err := b.buf.Write(p)
	b.mu.Unlock()
	select {
	case b.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// newEnv is a pool over loopback sockets to an upstreamtest server.
func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	return newEnvOn(t, upstreamtest.NewServer(t), &http.Transport{DisableKeepAlives: true}, mutate)
}

// newPipeEnv is a pool over in-memory sockets, for a synctest bubble.
func newPipeEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	srv := upstreamtest.NewPipe(t)
	return newEnvOn(t, srv, srv.Transport(), mutate)
}

func newEnvOn(t *testing.T, srv *upstreamtest.Server, base http.RoundTripper, mutate func(*Config)) *env {
	t.Helper()
	e := &env{t: t, clock: newFakeClock(), srv: srv, dialer: &dialer{base: base, srv: srv}, admit: &countingAdmitter{},
		diag: &bytes.Buffer{}, diagMu: &sync.Mutex{}, wrote: make(chan struct{}, 1), notes: new([]string),
		byConn: map[*upstream.Conn]*tconn{}}
	var notesMu sync.Mutex
	cfg := Config{
		Upstream:    upstream.DialOptions{URL: srv.URL, HTTPClient: &http.Client{Transport: e.dialer}},
		Credentials: staticCredentials(testCred),
		Admitter:    e.admit,
		Clock:       e.clock.Now,
		Diagnostics: syncBuffer{mu: e.diagMu, buf: e.diag, wrote: e.wrote},
		Notify: func(msg string) {
			notesMu.Lock()
			*e.notes = append(*e.notes, msg)
			notesMu.Unlock()
		},
		ProbeDescriptor: func() error { return nil },
	}
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	e.pool = p
	return e
}

// conn returns the socket under c, identified the first time by the one
// socket a ping writes to.
func (e *env) conn(c *upstream.Conn) *tconn {
	e.t.Helper()
	e.mu.Lock()
	tc, ok := e.byConn[c]
	e.mu.Unlock()
	if ok {
		return tc
	}
	before := e.dialer.writes()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	if err := c.Ping(ctx); err != nil {
		e.t.Fatalf("identify a socket by a ping: %v", err)
	}
	tc = e.dialer.wrote(e.t, before)
	e.mu.Lock()
	e.byConn[c] = tc
	e.mu.Unlock()
	return tc
}

func (e *env) connID(c *upstream.Conn) int { return e.conn(c).id }

// records returns the diagnostics lines written so far, decoded.
func (e *env) records() []map[string]any {
	e.diagMu.Lock()
	defer e.diagMu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(e.diag.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			e.t.Fatalf("diagnostic line %q is not JSON: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func part(pck string) Partition {
	return Partition{Account: "acct-1", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: pck}
}

// Canonical item builders (sorted keys, compact), the shapes of
// docs/translation.md §4.
func user(text string) []byte {
	return mustJSON(map[string]any{"role": "user", "type": "message",
		"content": []any{map[string]any{"type": "input_text", "text": text}}})
}

func assistant(text string) []byte {
	return mustJSON(map[string]any{"role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text}}})
}

func call(id, args string) []byte {
	return mustJSON(map[string]any{"type": "function_call", "call_id": id, "name": "Bash", "arguments": args})
}

func callOutput(id, out string) []byte {
	return mustJSON(map[string]any{"type": "function_call_output", "call_id": id, "output": out})
}

func reasoning(blob string) []byte {
	return mustJSON(map[string]any{"type": "reasoning", "encrypted_content": blob})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func items(its ...[]byte) [][]byte { return its }

func cat(parts ...[][]byte) [][]byte {
	var out [][]byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// turn acquires, sends a frame the way the gateway would, and completes
// with output. It returns the lease.
func (e *env) turn(pt Partition, in [][]byte, respID string, out [][]byte) *Lease {
	e.t.Helper()
	l, err := e.pool.Acquire(e.t.Context(), pt, in)
	if err != nil {
		e.t.Fatalf("Acquire: %v", err)
	}
	e.send(l, in)
	l.Complete(respID, out, Usage{InputTokens: 100, CachedTokens: 90})
	return l
}

// send writes a response.create frame with previous_response_id and the
// delta, as the gateway will; the socket it went out on is identified by
// the write.
func (e *env) send(l *Lease, in [][]byte) {
	e.t.Helper()
	frame := map[string]any{"type": "response.create", "instructions": "sys", "input": rawItems(in[l.Delta:])}
	if l.PreviousResponseID != "" {
		frame["previous_response_id"] = l.PreviousResponseID
	}
	before := e.dialer.writes()
	if err := l.Conn.Send(e.t.Context(), mustJSON(frame)); err != nil {
		e.t.Fatalf("Send: %v", err)
	}
	tc := e.dialer.wrote(e.t, before)
	e.mu.Lock()
	if prev, ok := e.byConn[l.Conn]; ok && prev != tc {
		e.mu.Unlock()
		e.t.Fatalf("a frame for conn %d went out on conn %d", prev.id, tc.id)
	}
	e.byConn[l.Conn] = tc
	e.mu.Unlock()
	tc.mu.Lock()
	tc.sent++
	tc.mu.Unlock()
}

func rawItems(in [][]byte) []json.RawMessage {
	out := make([]json.RawMessage, len(in))
	for i, it := range in {
		out[i] = it
	}
	return out
}

// sentFrame decodes a recorded frame.
type sentFrame struct {
	PreviousResponseID string            `json:"previous_response_id"`
	Input              []json.RawMessage `json:"input"`
}

// waitRecords waits until n diagnostics records of event have been
// written and returns them. The wait is event-driven; its deadline only
// turns a hang into a failure.
func (e *env) waitRecords(event string, n int) []map[string]any {
	e.t.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		var got []map[string]any
		for _, r := range e.records() {
			if r["event"] == event {
				got = append(got, r)
			}
		}
		if len(got) >= n {
			return got
		}
		select {
		case <-e.wrote:
		case <-deadline.C:
			e.t.Fatalf("%d %s records after 30 s, want %d", len(got), event, n)
		}
	}
}

// lastFrame returns the last frame the test sent on c, as the peer
// received it.
func (e *env) lastFrame(c *upstream.Conn) sentFrame {
	e.t.Helper()
	tc := e.conn(c)
	peer := tc.peerSide(e.t)
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.sent == 0 {
		e.t.Fatalf("conn %d: no frame sent", tc.id)
	}
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	for len(tc.frames) < tc.sent {
		f, err := peer.Recv(ctx)
		if err != nil {
			e.t.Fatalf("conn %d: the peer received %d of %d frames: %v", tc.id, len(tc.frames), tc.sent, err)
		}
		tc.frames = append(tc.frames, f)
	}
	var f sentFrame
	if err := json.Unmarshal(tc.frames[tc.sent-1], &f); err != nil {
		e.t.Fatal(err)
	}
	return f
}

// What the peer of an idle socket does, for push.
type peerAct struct {
	frame  string               // send this text frame
	code   websocket.StatusCode // else close with this code and reason
	reason string
	drop   bool // else drop the connection without a close frame
}

func sendFrame(frame string) peerAct { return peerAct{frame: frame} }
func closeWith(code websocket.StatusCode, reason string) peerAct {
	return peerAct{code: code, reason: reason}
}
func dropConn() peerAct { return peerAct{drop: true} }

// push makes the peer of c do a.
func push(t *testing.T, c *tconn, a peerAct) {
	t.Helper()
	if err := <-pushAsync(t, c, a); err != nil {
		t.Fatal(err)
	}
}

// pushAsync is push on its own goroutine; the channel yields its outcome.
func pushAsync(t *testing.T, c *tconn, a peerAct) <-chan error {
	t.Helper()
	p := c.peerSide(t)
	errc := make(chan error, 1)
	go func() {
		switch {
		case a.frame != "":
			errc <- p.Send(context.Background(), []byte(a.frame))
		case a.drop:
			p.Drop()
			errc <- nil
		default:
			_ = p.Close(a.code, a.reason) // its error is the client's answer, or its absence
			errc <- nil
		}
	}()
	return errc
}

func respID(i int) string { return fmt.Sprintf("resp_%03d", i) }
