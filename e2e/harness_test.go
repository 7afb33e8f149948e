package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexsim"
)

// The credential the emulator accepts and the data plane presents.
const (
	simToken   = "tok-e2e"
	simAccount = "acct-e2e"
)

// Bounds of one stack. A case that hangs fails within these instead of the
// 300 s Claude Code would otherwise wait on a stalled stream.
const (
	turnIdleTimeout  = 30 * time.Second
	turnTotalTimeout = 60 * time.Second
	shutdownTimeout  = 10 * time.Second
)

// stack is the data plane in front of the emulator, as one test sees it.
// A stack made of the real binaries fills baseURL, simURL and client and
// leaves the in-process recorders nil.
type stack struct {
	// baseURL is the data plane's Anthropic API, http://127.0.0.1:PORT;
	// Claude Code's ANTHROPIC_BASE_URL.
	baseURL string
	// simURL is the emulator's HTTP base (GET /sim/stats).
	simURL string
	// requests records what reached the data plane (nil when not
	// in-process).
	requests *requestRecorder
	// upstream records the data plane's upstream sockets (nil when not
	// in-process).
	upstream *recordingDialer
	// client is the test's own HTTP client for both servers; its idle
	// connections are closed at cleanup.
	client *http.Client
}

// newStack starts the stack the cases run against: today always the
// in-process one. When the variant that execs the real binaries lands,
// choose it here (or run every case against both); the cases only need the
// stack's fields.
func newStack(t *testing.T) *stack {
	t.Helper()
	return startInProcess(t)
}

// startInProcess starts clodex-sim on an httptest server and the data plane
// (gateway.Server) on a loopback listener owned by the stack, wired with a
// static credential the emulator accepts. Everything is shut down at t's
// cleanup: the HTTP server first, then the gateway's turns and sockets, then
// the emulator.
//
// A variant that execs cmd/clodex-sim and cmd/clodex-dataplane only has to
// return a stack with baseURL, simURL and client set (clodex-sim
// --accept-token tok-e2e=acct-e2e; clodex-dataplane --upstream-url
// ws://…/backend-api/codex/responses with a Codex auth.json holding that
// token); the cases check the recorders only when they are present.
func startInProcess(t *testing.T) *stack {
	t.Helper()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("data plane and emulator logs:\n%s", logs.String())
		}
	})

	sim, err := codexsim.New(codexsim.Config{
		AcceptTokens: map[string]string{simToken: simAccount},
		Logger:       logger, // it adds component=codexsim itself
	})
	if err != nil {
		t.Fatalf("codexsim.New: %v", err)
	}
	simTS := httptest.NewServer(sim.Handler())
	wsURL := "ws" + strings.TrimPrefix(simTS.URL, "http") + codexsim.ChatGPTPath

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		sim.Close()
		simTS.Close()
		t.Fatalf("listen for the data plane: %v", err)
	}
	dialer := &recordingDialer{inner: gateway.UpstreamDialer(upstream.DialOptions{
		URL:     wsURL,
		Version: "e2e",
		Logger:  logger.With("component", "dataplane/upstream"),
	})}
	gw, err := gateway.New(gateway.Config{
		Credentials:  gateway.NoRefresh(credentials.Static{AccessToken: simToken, AccountID: simAccount}),
		Dialer:       dialer,
		ListenAddr:   ln.Addr().String(),
		IdleTimeout:  turnIdleTimeout,
		TotalTimeout: turnTotalTimeout,
		Logger:       logger.With("component", "dataplane/gateway"),
	})
	if err != nil {
		ln.Close()
		sim.Close()
		simTS.Close()
		t.Fatalf("gateway.New: %v", err)
	}
	reqs := &requestRecorder{next: gw.Handler()}
	hs := &http.Server{Handler: reqs, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()

	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			t.Errorf("data plane http.Server.Shutdown: %v", err)
			hs.Close() // connections still open after the grace period
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("data plane Serve: %v", err)
		}
		if err := gw.Close(); err != nil {
			t.Errorf("gateway Close: %v", err)
		}
		if err := sim.Close(); err != nil {
			t.Errorf("codexsim Close: %v", err)
		}
		simTS.Close()
	})
	return &stack{
		baseURL:  "http://" + ln.Addr().String(),
		simURL:   simTS.URL,
		requests: reqs,
		upstream: dialer,
		client:   newClient(t),
	}
}

// newClient returns an HTTP client whose idle connections are closed at t's
// cleanup, so no keep-alive goroutine outlives the test.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

// simStats reads the emulator's counters over HTTP, as an operator would.
func (s *stack) simStats(t *testing.T) codexsim.Stats {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.simURL+"/sim/stats", nil)
	if err != nil {
		t.Fatalf("GET /sim/stats: %v", err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		t.Fatalf("GET /sim/stats: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /sim/stats: status %d, err %v: %s", resp.StatusCode, err, body)
	}
	var st codexsim.Stats
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /sim/stats: decode %s: %v", body, err)
	}
	return st
}

// recordedRequest is one HTTP request that reached the data plane and
// the status it was answered with.
type recordedRequest struct {
	Method   string
	Path     string
	RawQuery string
	Body     []byte
	Status   int
}

// requestRecorder is an http.Handler that records every request, then
// hands it, body intact, to next.
type requestRecorder struct {
	next http.Handler

	mu   sync.Mutex // guards reqs
	reqs []recordedRequest
}

func (rr *requestRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, "e2e recorder: read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	sw := &statusWriter{ResponseWriter: w}
	rr.next.ServeHTTP(sw, r)
	if sw.status == 0 {
		sw.status = http.StatusOK
	}
	rr.mu.Lock()
	rr.reqs = append(rr.reqs, recordedRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Body: body, Status: sw.status})
	rr.mu.Unlock()
}

// statusWriter remembers the status of a response. Unwrap lets
// http.ResponseController reach the real writer's Flush, so SSE events
// still go out one by one.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// messages returns the recorded POST /v1/messages requests, in the order
// they were answered, and their bodies decoded.
func (rr *requestRecorder) messages(t *testing.T) ([]recordedRequest, []map[string]any) {
	t.Helper()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	var reqs []recordedRequest
	var bodies []map[string]any
	for _, r := range rr.reqs {
		if r.Method != http.MethodPost || r.Path != "/v1/messages" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(r.Body, &m); err != nil {
			t.Fatalf("recorded POST /v1/messages body is not JSON: %v", err)
		}
		reqs = append(reqs, r)
		bodies = append(bodies, m)
	}
	return reqs, bodies
}

// all returns every recorded request.
func (rr *requestRecorder) all() []recordedRequest {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	return append([]recordedRequest(nil), rr.reqs...)
}

// socketLog is what crossed one upstream socket.
type socketLog struct {
	// sent are the frames the data plane sent (response.create).
	sent [][]byte
	// events are the frames the emulator answered, in order.
	events [][]byte
	// socket is the index of the socket (turns only).
	socket int
}

// recordingDialer wraps the data plane's upstream dialer and records every
// frame on every socket it opens. WebSocket frames are invisible to HTTP
// middleware; this seam is how the tests see them.
type recordingDialer struct {
	inner gateway.Dialer

	mu        sync.Mutex // guards sockets, exchanges and the logs they point to
	sockets   []*socketLog
	exchanges []*socketLog // one per response.create, in send order
}

func (d *recordingDialer) Dial(ctx context.Context, cred credentials.Credential, turn *translate.Turn) (gateway.Conn, error) {
	c, err := d.inner.Dial(ctx, cred, turn)
	if err != nil {
		return nil, err
	}
	log := &socketLog{}
	d.mu.Lock()
	d.sockets = append(d.sockets, log)
	d.mu.Unlock()
	return &recordingConn{Conn: c, d: d, log: log, socket: len(d.sockets) - 1}, nil
}

// turns returns one log per response.create the data plane sent, in
// order: its frame (sent[0]), the events that answered it, and the index
// of the socket it went out on. With the connection pool, one socket
// carries many of them.
func (d *recordingDialer) turns() []socketLog {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]socketLog, len(d.exchanges))
	for i, s := range d.exchanges {
		out[i] = socketLog{sent: append([][]byte(nil), s.sent...), events: append([][]byte(nil), s.events...), socket: s.socket}
	}
	return out
}

// snapshot returns a copy of every socket's log.
func (d *recordingDialer) snapshot() []socketLog {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]socketLog, len(d.sockets))
	for i, s := range d.sockets {
		out[i] = socketLog{sent: append([][]byte(nil), s.sent...), events: append([][]byte(nil), s.events...)}
	}
	return out
}

type recordingConn struct {
	gateway.Conn
	d      *recordingDialer
	log    *socketLog
	socket int
	cur    *socketLog // the exchange of the last frame sent; guarded by d.mu
}

func (c *recordingConn) Send(ctx context.Context, frame []byte) error {
	c.d.mu.Lock()
	c.log.sent = append(c.log.sent, bytes.Clone(frame))
	c.cur = &socketLog{sent: [][]byte{bytes.Clone(frame)}, socket: c.socket}
	c.d.exchanges = append(c.d.exchanges, c.cur)
	c.d.mu.Unlock()
	return c.Conn.Send(ctx, frame)
}

func (c *recordingConn) Next(ctx context.Context) ([]byte, error) {
	data, err := c.Conn.Next(ctx)
	if err == nil {
		c.d.mu.Lock()
		c.log.events = append(c.log.events, bytes.Clone(data))
		if c.cur != nil {
			c.cur.events = append(c.cur.events, bytes.Clone(data))
		}
		c.d.mu.Unlock()
	}
	return data, err
}

// syncBuffer is a bytes.Buffer safe for concurrent writers (log handlers
// on server goroutines).
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
