package pool

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
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

// fakeConn records the frames sent on it and how it was closed. Its peer
// is silent unless the test pushes a frame or an error into in; Next
// returns those, or an error once the conn is closed.
type fakeConn struct {
	id   int
	d    *fakeDialer
	in   chan readResult
	done chan struct{} // closed by Close

	mu          sync.Mutex
	frames      [][]byte
	closed      bool
	closeReason string
}

func (c *fakeConn) Send(ctx context.Context, frame []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("send on closed fake conn")
	}
	c.frames = append(c.frames, bytes.Clone(frame))
	return nil
}

var errFakeClosed = errors.New("fake conn closed")

func (c *fakeConn) Next(ctx context.Context) ([]byte, error) {
	select {
	case r := <-c.in:
		return r.data, r.err
	case <-c.done:
		return nil, errFakeClosed
	case <-ctx.Done():
		_ = c.Close("read context ended")
		return nil, ctx.Err()
	}
}

func (c *fakeConn) Close(reason string) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.closeReason = reason
	close(c.done)
	c.mu.Unlock()
	c.d.mu.Lock()
	c.d.closeOrder = append(c.d.closeOrder, c.id)
	c.d.mu.Unlock()
	return nil
}

func (c *fakeConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// pingingConn is a fakeConn that is also a Pinger.
type pingingConn struct {
	*fakeConn
	ping func(ctx context.Context) error
}

func (c pingingConn) Ping(ctx context.Context) error { return c.ping(ctx) }

// fakeDialer hands out fakeConns; fail, when set, can fail a dial (n is
// the 1-based dial attempt); ping, when set, makes them Pingers.
type fakeDialer struct {
	mu         sync.Mutex
	attempts   int
	conns      []*fakeConn
	closeOrder []int
	fail       func(n int) error
	ping       func(ctx context.Context) error
}

func (d *fakeDialer) Dial(ctx context.Context, p Partition) (Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.attempts++
	if d.fail != nil {
		if err := d.fail(d.attempts); err != nil {
			return nil, err
		}
	}
	c := &fakeConn{id: len(d.conns) + 1, d: d, in: make(chan readResult), done: make(chan struct{})}
	d.conns = append(d.conns, c)
	if d.ping != nil {
		return pingingConn{c, d.ping}, nil
	}
	return c, nil
}

func (d *fakeDialer) dials() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.conns)
}

func (d *fakeDialer) closed() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]int(nil), d.closeOrder...)
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
	dialer *fakeDialer
	admit  *countingAdmitter
	diag   *bytes.Buffer
	diagMu *sync.Mutex
	wrote  chan struct{} // signalled after every diagnostics write
	notes  *[]string
	pool   *Pool
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

func newEnv(t *testing.T, mutate func(*Config)) *env {
	t.Helper()
	e := &env{t: t, clock: newFakeClock(), dialer: &fakeDialer{}, admit: &countingAdmitter{},
		diag: &bytes.Buffer{}, diagMu: &sync.Mutex{}, wrote: make(chan struct{}, 1), notes: new([]string)}
	var notesMu sync.Mutex
	cfg := Config{
		Dialer:      e.dialer,
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
	send(e.t, l, in)
	l.Complete(respID, out, Usage{InputTokens: 100, CachedTokens: 90})
	return l
}

// send writes a response.create frame with previous_response_id and the
// delta, as the gateway will.
func send(t *testing.T, l *Lease, in [][]byte) {
	t.Helper()
	frame := map[string]any{"type": "response.create", "instructions": "sys", "input": rawItems(in[l.Delta:])}
	if l.PreviousResponseID != "" {
		frame["previous_response_id"] = l.PreviousResponseID
	}
	if err := l.Conn.Send(t.Context(), mustJSON(frame)); err != nil {
		t.Fatalf("Send: %v", err)
	}
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

// fake returns the fakeConn under a lease's Conn.
func fake(c Conn) *fakeConn {
	if s, ok := c.(*sock); ok {
		c = s.Conn
	}
	if pc, ok := c.(pingingConn); ok {
		return pc.fakeConn
	}
	return c.(*fakeConn)
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

func lastFrame(t *testing.T, c Conn) sentFrame {
	t.Helper()
	fc := fake(c)
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if len(fc.frames) == 0 {
		t.Fatalf("conn %d: no frame sent", fc.id)
	}
	var f sentFrame
	if err := json.Unmarshal(fc.frames[len(fc.frames)-1], &f); err != nil {
		t.Fatal(err)
	}
	return f
}

func connID(c Conn) int { return fake(c).id }

func respID(i int) string { return fmt.Sprintf("resp_%03d", i) }
