package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/dataplane/upstream/upstreamtest"
	"github.com/clodex/clodex/internal/pacing"
)

// fakeUpstream is the backend of a synctest turn: an in-memory
// upstreamtest server made inside the bubble (so deadlines and pings run
// on the bubble's clock) that the pool dials like any upstream. The test
// plays the backend's side of the turn's first socket.
type fakeUpstream struct {
	t    *testing.T
	srv  *upstreamtest.Server
	pool *pool.Pool // set by fakeTurn

	mu   sync.Mutex // guards peer
	peer *upstreamtest.Peer
}

func newFakeUpstream(t *testing.T) *fakeUpstream {
	return &fakeUpstream{t: t, srv: upstreamtest.NewPipe(t)}
}

// socket is the backend's side of the first socket the pool dialled.
func (u *fakeUpstream) socket() *upstreamtest.Peer {
	u.t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.peer == nil {
		p, err := u.srv.Accept(u.t.Context())
		if err != nil {
			u.t.Fatalf("no socket dialled: %v", err)
		}
		u.peer = p
	}
	return u.peer
}

// send makes the backend send frame on the socket.
func (u *fakeUpstream) send(frame string) {
	u.t.Helper()
	if err := u.socket().Send(u.t.Context(), []byte(frame)); err != nil {
		u.t.Fatalf("backend send: %v", err)
	}
}

// wantDiscarded checks that the turn discarded the socket for reason: the
// backend saw it close, with no close frame, and the pool counted the
// reason.
func (u *fakeUpstream) wantDiscarded(reason string) {
	u.t.Helper()
	p := u.socket()
	select {
	case <-p.Gone():
		if code := websocket.CloseStatus(p.Err()); code != -1 {
			u.t.Errorf("socket closed with close frame %v, want a hard close", code)
		}
	default:
		u.t.Errorf("socket open, want it closed (%q)", reason)
	}
	if d := u.pool.Stats().Discards; d[reason] != 1 {
		u.t.Errorf("socket discarded for %v, want once for %q", d, reason)
	}
}

// syncWriter is a ResponseWriter safe to read while the handler writes.
type syncWriter struct {
	mu     sync.Mutex
	header http.Header
	status int
	body   strings.Builder
}

func (w *syncWriter) Header() http.Header { return w.header }
func (w *syncWriter) WriteHeader(code int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = code
	}
}
func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.status == 0 {
		w.status = 200
	}
	return w.body.Write(b)
}
func (w *syncWriter) Flush() {}
func (w *syncWriter) snapshot() (int, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status, w.body.String()
}

// fakeTurn starts one /v1/messages request against a Server whose pool
// dials up. It returns the writer and a channel closed when the handler
// returns. The server and its pool are closed at t's cleanup (in the
// data plane's order: turns first, then the pool).
func fakeTurn(t *testing.T, up *fakeUpstream, budget pacing.Budget, stream bool) (*Server, *syncWriter, chan struct{}, context.CancelFunc) {
	t.Helper()
	router := newRouter(t, "tok", "acct")
	p, err := pool.New(pool.Config{
		Upstream:    upstream.DialOptions{URL: up.srv.URL, HTTPClient: up.srv.Client()},
		Credentials: router,
	})
	if err != nil {
		t.Fatal(err)
	}
	up.pool = p
	srv, err := New(Config{
		Router:  router,
		Pool:    p,
		Budgets: retry.NewBudgets(budget),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		p.Close()
	})
	ctx, cancel := context.WithCancel(t.Context())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:17645/v1/messages?beta=true",
		strings.NewReader(MessagesBody(stream, "hello")))
	req.Header.Set("Content-Type", "application/json")
	w := &syncWriter{header: http.Header{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Handler().ServeHTTP(w, req)
	}()
	return srv, w, done, cancel
}

// budgetWith is the default budget with the given deadlines (0 keeps the
// default's).
func budgetWith(idle, total time.Duration) pacing.Budget {
	b := pacing.DefaultBudget()
	if idle != 0 {
		b.IdleTimeout = idle
	}
	if total != 0 {
		b.TotalTimeout = total
	}
	return b
}

const (
	evCreated    = `{"type":"response.created","response":{"id":"resp_1","model":"gpt-5.5","status":"in_progress","output":[]}}`
	evInProgress = `{"type":"response.in_progress","response":{"id":"resp_1","model":"gpt-5.5","status":"in_progress","output":[]}}`
	evCallAdded  = `{"type":"response.output_item.added","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"Bash","arguments":"","status":"in_progress"}}`
	evArgDelta   = `{"type":"response.function_call_arguments.delta","output_index":0,"item_id":"fc_1","delta":"{\"a\":1"}`
	evCallDone   = `{"type":"response.output_item.done","output_index":0,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"Bash","arguments":"{\"command\":\"ls\"}","status":"completed"}}`
	evCompleted  = `{"type":"response.completed","response":{"id":"resp_1","model":"gpt-5.5","status":"completed","output":[{"type":"function_call","id":"fc_1","call_id":"call_1","name":"Bash","arguments":"{\"command\":\"ls\"}","status":"completed"}],"usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":0},"output_tokens":8,"total_tokens":58}}}`
	evFailed     = `{"type":"response.failed","response":{"id":"resp_1","status":"failed","error":{"code":"server_error","message":"boom"}}}`
)

func TestPingWhileUpstreamWorks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, pacing.Budget{}, true)
		defer cancel()
		up.send(evCreated)
		up.send(evCallAdded) // commits the stream: content_block_start
		// The backend streams tool arguments (buffered, nothing goes
		// downstream) every 10 s for a minute: 5, 15, ..., 55 s.
		time.Sleep(5 * time.Second)
		for i := 0; i < 6; i++ {
			up.send(evArgDelta)
			time.Sleep(10 * time.Second)
		}
		// t = 65 s. Ticks at 20, 40, 60 s each found no downstream write
		// since the previous tick and an upstream event within 20 s.
		_, body := w.snapshot()
		if n := strings.Count(body, "event: ping\ndata: {\"type\":\"ping\"}\n\n"); n != 3 {
			t.Errorf("pings after 65 s of buffered tool arguments = %d, want 3; body:\n%s", n, body)
		}
		up.send(evCallDone)
		up.send(evCompleted)
		<-done
		status, body := w.snapshot()
		if status != 200 || !strings.HasSuffix(body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("status %d, body does not end with message_stop:\n%s", status, body)
		}
	})
}

func TestNoPingWhileUpstreamSilentOrUncommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, pacing.Budget{}, true)
		defer cancel()
		up.send(evCreated)
		// Upstream keeps working but nothing is committed downstream yet:
		// no ping, so a later failure can still get a real status.
		for i := 0; i < 6; i++ {
			time.Sleep(10 * time.Second)
			up.send(evInProgress)
		}
		if status, body := w.snapshot(); status != 0 || body != "" {
			t.Fatalf("wrote %d %q before any output, want nothing", status, body)
		}
		up.send(evCallAdded)          // commit at t = 60 s
		time.Sleep(100 * time.Second) // upstream silent: no pings
		_, body := w.snapshot()
		if strings.Contains(body, "event: ping") {
			t.Errorf("pinged while upstream was silent:\n%s", body)
		}
		up.send(evCallDone)
		up.send(evCompleted)
		<-done
	})
}

func TestIdleTimeoutBeforeOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, budgetWith(30*time.Second, 0), true)
		defer cancel()
		start := time.Now()
		up.send(evCreated)
		time.Sleep(20 * time.Second)
		up.send(evInProgress) // resets the idle deadline
		<-done
		if got := time.Since(start); got != 50*time.Second {
			t.Errorf("turn ended after %v, want 50s (20 s + a 30 s idle deadline)", got)
		}
		status, body := w.snapshot()
		if status != http.StatusBadGateway || !strings.Contains(body, `"type":"api_error"`) || !strings.Contains(body, "no data received from provider for 30s") {
			t.Errorf("got %d %s, want 502 api_error naming the idle deadline", status, body)
		}
		synctest.Wait()
		up.wantDiscarded("idle timeout")
	})
}

func TestIdleTimeoutAfterOutputIsSSEError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, budgetWith(30*time.Second, 0), true)
		defer cancel()
		up.send(evCreated)
		up.send(evCallAdded)
		<-done
		status, body := w.snapshot()
		if status != 200 || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") || strings.Contains(body, "message_stop") {
			t.Errorf("got %d, want an SSE api_error event and no message_stop:\n%s", status, body)
		}
	})
}

func TestTotalTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, budgetWith(0, 45*time.Second), false)
		defer cancel()
		start := time.Now()
		up.send(evCreated)
		feeder := make(chan struct{})
		go func() { // a backend that keeps the socket busy forever
			defer close(feeder)
			peer := up.socket()
			for {
				if err := peer.Send(context.Background(), []byte(evInProgress)); err != nil {
					return // the socket closed
				}
				time.Sleep(10 * time.Second)
			}
		}()
		<-done
		if got := time.Since(start); got != 45*time.Second {
			t.Errorf("turn ended after %v, want the 45 s total deadline", got)
		}
		status, body := w.snapshot()
		if status != http.StatusBadGateway || !strings.Contains(body, "exceeded 45s") {
			t.Errorf("got %d %s, want 502 naming the total deadline", status, body)
		}
		<-feeder
	})
}

// Server.Close ends a turn in flight: the client is told the data plane is
// shutting down and the pool closes the socket.
func TestShutdownEndsTurnInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		srv, w, done, cancel := fakeTurn(t, up, pacing.Budget{}, true)
		defer cancel()
		up.send(evCreated)
		srv.Close() // returns once the socket is released
		<-done
		synctest.Wait() // the backend's side sees the hard close
		up.wantDiscarded("server shutting down")
		status, body := w.snapshot()
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
			t.Errorf("got %d %s, want 503 naming the shutdown", status, body)
		}
	})
}

// A response that fails before output on a healthy socket keeps the
// socket: the retry 2 s later resends the turn on it, and when that fails
// too the client gets the 502 and the socket stays for the next turn.
func TestUpstreamFailedBeforeOutputNonStreaming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		up := newFakeUpstream(t)
		_, w, done, cancel := fakeTurn(t, up, pacing.Budget{}, false)
		defer cancel()
		peer := up.socket()
		for attempt := range 2 {
			f, err := peer.Recv(t.Context())
			if err != nil || !strings.Contains(string(f), `"response.create"`) || strings.Contains(string(f), `"previous_response_id"`) {
				t.Fatalf("attempt %d: the socket got %.200s (%v); want response.create without previous_response_id", attempt, f, err)
			}
			up.send(evCreated)
			up.send(evFailed)
		}
		<-done
		status, body := w.snapshot()
		if status != http.StatusBadGateway || strings.Contains(body, "boom") {
			t.Errorf("got %d %s, want 502 without upstream prose", status, body)
		}
		synctest.Wait()
		select {
		case <-peer.Gone():
			t.Errorf("the socket closed (%v); want it kept", peer.Err())
		default:
		}
		if s := up.pool.Stats(); s.KeptSockets != 2 || s.KeptSocketReuses != 1 || s.NewSockets != 1 || len(s.Discards) != 0 {
			t.Errorf("pool kept %d, reused kept %d, new sockets %d, discards %v; want 2, 1, 1 and none", s.KeptSockets, s.KeptSocketReuses, s.NewSockets, s.Discards)
		}
	})
}
