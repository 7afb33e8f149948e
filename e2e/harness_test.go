package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node/nodetest"
	"github.com/clodex/clodex/internal/pacing"
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
	// baseURL is where Claude Code sends its requests,
	// http://127.0.0.1:PORT; Claude Code's ANTHROPIC_BASE_URL.
	baseURL string
	// simURL is the emulator's HTTP base (GET /sim/stats).
	simURL string
	// requests records what Claude Code sent to the data plane (nil when
	// not in-process).
	requests *requestRecorder
	// upstream reads what crossed the data plane's upstream sockets from
	// the emulator's own record of them (nil when not in-process).
	upstream *upstreamRecord
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

// startInProcess starts clodex-sim on an httptest server (recording every
// socket's frames) and the data plane in front of it exactly as
// clodex-dataplane runs it (package node: the pool, the admission client
// and the embedded control plane over its gRPC path, the gateway), with a
// Codex auth.json holding a token the emulator accepts. Claude Code talks
// to a recording reverse proxy on its own loopback listener, which hands
// every request on to the data plane unchanged. Everything is shut down at
// t's cleanup: the proxy, the data plane (in its shutdown order), then the
// emulator.
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
			t.Logf("emulator and proxy logs:\n%s", logs.String())
		}
	})

	sim := nodetest.StartSim(t, codexsim.Config{
		AcceptTokens: map[string]string{simToken: simAccount},
		Logger:       logger, // it adds component=codexsim itself
		RecordFrames: true,
	})
	cfg := sim.Config(nodetest.WriteAuth(t, simToken, simAccount, ""))
	cfg.Version = "e2e"
	cfg.LogLevel = "debug"
	cfg.Policy, cfg.Notices = pacing.PolicyFromEnv(func(k string) (string, bool) {
		switch k {
		case pacing.EnvIdleTimeout:
			return strconv.Itoa(int(turnIdleTimeout / time.Millisecond)), true
		case pacing.EnvTotalTimeout:
			return strconv.Itoa(int(turnTotalTimeout / time.Millisecond)), true
		}
		return "", false
	})
	dp := nodetest.Start(t, cfg)
	reqs, baseURL := startRecordingProxy(t, dp.URL, logger)
	return &stack{
		baseURL:  baseURL,
		simURL:   sim.URL,
		requests: reqs,
		upstream: &upstreamRecord{sim: sim.Server},
		client:   newClient(t),
	}
}

// startRecordingProxy serves, on its own loopback listener, a reverse
// proxy to the data plane at dataPlaneURL that records every request and
// its answer; it returns the recorder and the proxy's base URL (Claude
// Code's ANTHROPIC_BASE_URL). It is shut down at t's cleanup.
func startRecordingProxy(t *testing.T, dataPlaneURL string, logger *slog.Logger) (*requestRecorder, string) {
	t.Helper()
	target, err := url.Parse(dataPlaneURL)
	if err != nil {
		t.Fatalf("data plane URL %q: %v", dataPlaneURL, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for the recording proxy: %v", err)
	}
	proxyTransport := &http.Transport{}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(target) }, // Host becomes the data plane's loopback address
		Transport:     proxyTransport,
		FlushInterval: -1, // SSE events go out one by one
		ErrorLog:      slog.NewLogLogger(logger.With("component", "e2e/proxy").Handler(), slog.LevelWarn),
	}
	reqs := &requestRecorder{next: proxy}
	hs := &http.Server{Handler: reqs, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := hs.Shutdown(ctx); err != nil {
			t.Errorf("recording proxy http.Server.Shutdown: %v", err)
			hs.Close() // connections still open after the grace period
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("recording proxy Serve: %v", err)
		}
		proxyTransport.CloseIdleConnections()
	})
	return reqs, "http://" + ln.Addr().String()
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

// recordedRequest is one HTTP request Claude Code sent to the data plane
// and the status it was answered with.
type recordedRequest struct {
	Method   string
	Path     string
	RawQuery string
	Body     []byte
	Status   int
	// Header is the answer's header (retry-after, x-should-retry, …).
	Header http.Header
}

// requestRecorder is an http.Handler that records every request, then
// hands it, body intact, to next (the proxy to the data plane).
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
	rr.reqs = append(rr.reqs, recordedRequest{Method: r.Method, Path: r.URL.Path, RawQuery: r.URL.RawQuery, Body: body,
		Status: sw.status, Header: w.Header().Clone()})
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

// socketLog is what crossed one upstream socket, or one exchange on it.
type socketLog struct {
	// sent are the frames the data plane sent (response.create).
	sent [][]byte
	// events are the frames the emulator answered, in order.
	events [][]byte
	// socket is the index of the socket.
	socket int
}

// upstreamRecord reads what crossed the data plane's upstream sockets from
// the emulator's record of them (codexsim.Config.RecordFrames): what the
// backend's peer really sent and received. WebSocket frames are invisible
// to HTTP middleware; the emulator is where the tests see them.
type upstreamRecord struct{ sim *codexsim.Server }

// turns returns one log per response.create the data plane sent, in
// order: its frame (sent[0]), the events that answered it, and the index
// of the socket it went out on. With the connection pool, one socket
// carries many of them.
func (u *upstreamRecord) turns() []socketLog {
	type exchange struct {
		seq uint64
		log socketLog
	}
	var all []exchange
	for i, s := range u.sim.Sockets() {
		cur := -1 // the exchange of the socket's last client frame
		for _, f := range s.Frames {
			if f.FromClient {
				all = append(all, exchange{seq: f.Seq, log: socketLog{sent: [][]byte{f.Data}, socket: i}})
				cur = len(all) - 1
				continue
			}
			if cur >= 0 { // a socket runs one response at a time
				all[cur].log.events = append(all[cur].log.events, f.Data)
			}
		}
	}
	slices.SortFunc(all, func(a, b exchange) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]socketLog, len(all))
	for i, e := range all {
		out[i] = e.log
	}
	return out
}

// snapshot returns every socket's log, in the order the sockets were
// opened.
func (u *upstreamRecord) snapshot() []socketLog {
	socks := u.sim.Sockets()
	out := make([]socketLog, len(socks))
	for i, s := range socks {
		out[i] = socketLog{sent: s.Sent(), events: s.Events(), socket: i}
	}
	return out
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
