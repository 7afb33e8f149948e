package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/internal/pacing"
)

// fakeConn is an in-memory upstream socket driven by the test inside a
// synctest bubble, so deadlines and pings run on the bubble's clock. The
// pool dials it through pool.Config.Dialer, the seam the data plane's own
// dialer (PoolDialer) plugs into.
type fakeConn struct {
	frames chan []byte
	closed chan struct{}

	mu     sync.Mutex // guards the following fields
	sent   [][]byte
	reason string // the reason the pool closed it with
	done   bool
}

func newFakeConn() *fakeConn {
	return &fakeConn{frames: make(chan []byte), closed: make(chan struct{})}
}

func (c *fakeConn) Send(ctx context.Context, frame []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, frame)
	return nil
}

func (c *fakeConn) Next(ctx context.Context) ([]byte, error) {
	select {
	case f := <-c.frames:
		return f, nil
	case <-c.closed:
		return nil, errors.New("socket closed")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *fakeConn) Close(reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done {
		c.done, c.reason = true, reason
		close(c.closed)
	}
	return nil
}

// closeReason is the reason the socket was closed with ("" while open).
func (c *fakeConn) closeReason() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
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
// dials conn. It returns the writer and a channel closed when the handler
// returns. The server and its pool are closed at t's cleanup (in the
// data plane's order: turns first, then the pool).
func fakeTurn(t *testing.T, conn *fakeConn, budget pacing.Budget, stream bool) (*Server, *syncWriter, chan struct{}, context.CancelFunc) {
	t.Helper()
	p, err := pool.New(pool.Config{Dialer: pool.DialerFunc(func(context.Context, pool.Partition) (pool.Conn, error) {
		return conn, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{
		Credentials: NoRefresh(credentials.Static{AccessToken: "tok", AccountID: "acct"}),
		Pool:        p,
		Budget:      budget,
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
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, pacing.Budget{}, true)
		defer cancel()
		conn.frames <- []byte(evCreated)
		conn.frames <- []byte(evCallAdded) // commits the stream: content_block_start
		// The backend streams tool arguments (buffered, nothing goes
		// downstream) every 10 s for a minute: 5, 15, ..., 55 s.
		time.Sleep(5 * time.Second)
		for i := 0; i < 6; i++ {
			conn.frames <- []byte(evArgDelta)
			time.Sleep(10 * time.Second)
		}
		// t = 65 s. Ticks at 20, 40, 60 s each found no downstream write
		// since the previous tick and an upstream event within 20 s.
		_, body := w.snapshot()
		if n := strings.Count(body, "event: ping\ndata: {\"type\":\"ping\"}\n\n"); n != 3 {
			t.Errorf("pings after 65 s of buffered tool arguments = %d, want 3; body:\n%s", n, body)
		}
		conn.frames <- []byte(evCallDone)
		conn.frames <- []byte(evCompleted)
		<-done
		status, body := w.snapshot()
		if status != 200 || !strings.HasSuffix(body, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n") {
			t.Errorf("status %d, body does not end with message_stop:\n%s", status, body)
		}
	})
}

func TestNoPingWhileUpstreamSilentOrUncommitted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, pacing.Budget{}, true)
		defer cancel()
		conn.frames <- []byte(evCreated)
		// Upstream keeps working but nothing is committed downstream yet:
		// no ping, so a later failure can still get a real status.
		for i := 0; i < 6; i++ {
			time.Sleep(10 * time.Second)
			conn.frames <- []byte(evInProgress)
		}
		if status, body := w.snapshot(); status != 0 || body != "" {
			t.Fatalf("wrote %d %q before any output, want nothing", status, body)
		}
		conn.frames <- []byte(evCallAdded) // commit at t = 60 s
		time.Sleep(100 * time.Second)      // upstream silent: no pings
		_, body := w.snapshot()
		if strings.Contains(body, "event: ping") {
			t.Errorf("pinged while upstream was silent:\n%s", body)
		}
		conn.frames <- []byte(evCallDone)
		conn.frames <- []byte(evCompleted)
		<-done
	})
}

func TestIdleTimeoutBeforeOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, budgetWith(30*time.Second, 0), true)
		defer cancel()
		start := time.Now()
		conn.frames <- []byte(evCreated)
		time.Sleep(20 * time.Second)
		conn.frames <- []byte(evInProgress) // resets the idle deadline
		<-done
		if got := time.Since(start); got != 50*time.Second {
			t.Errorf("turn ended after %v, want 50s (20 s + a 30 s idle deadline)", got)
		}
		status, body := w.snapshot()
		if status != http.StatusBadGateway || !strings.Contains(body, `"type":"api_error"`) || !strings.Contains(body, "no data received from provider for 30s") {
			t.Errorf("got %d %s, want 502 api_error naming the idle deadline", status, body)
		}
		synctest.Wait()
		if reason := conn.closeReason(); reason != "idle timeout" {
			t.Errorf("socket closed with reason %q, want \"idle timeout\"", reason)
		}
	})
}

func TestIdleTimeoutAfterOutputIsSSEError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, budgetWith(30*time.Second, 0), true)
		defer cancel()
		conn.frames <- []byte(evCreated)
		conn.frames <- []byte(evCallAdded)
		<-done
		status, body := w.snapshot()
		if status != 200 || !strings.Contains(body, "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\"") || strings.Contains(body, "message_stop") {
			t.Errorf("got %d, want an SSE api_error event and no message_stop:\n%s", status, body)
		}
	})
}

func TestTotalTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, budgetWith(0, 45*time.Second), false)
		defer cancel()
		start := time.Now()
		conn.frames <- []byte(evCreated)
		feeder := make(chan struct{})
		go func() { // a backend that keeps the socket busy forever
			defer close(feeder)
			for {
				select {
				case conn.frames <- []byte(evInProgress):
				case <-conn.closed:
					return
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
		conn := newFakeConn()
		srv, w, done, cancel := fakeTurn(t, conn, pacing.Budget{}, true)
		defer cancel()
		conn.frames <- []byte(evCreated)
		srv.Close() // returns once the socket is released
		<-done
		if reason := conn.closeReason(); reason != "server shutting down" {
			t.Errorf("socket closed with reason %q, want \"server shutting down\"", reason)
		}
		status, body := w.snapshot()
		if status != http.StatusServiceUnavailable || !strings.Contains(body, "shutting down") {
			t.Errorf("got %d %s, want 503 naming the shutdown", status, body)
		}
	})
}

func TestUpstreamFailedBeforeOutputNonStreaming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := newFakeConn()
		_, w, done, cancel := fakeTurn(t, conn, pacing.Budget{}, false)
		defer cancel()
		conn.frames <- []byte(evCreated)
		conn.frames <- []byte(evFailed)
		<-done
		status, body := w.snapshot()
		if status != http.StatusBadGateway || strings.Contains(body, "boom") {
			t.Errorf("got %d %s, want 502 without upstream prose", status, body)
		}
		synctest.Wait()
		if reason := conn.closeReason(); reason != "turn failed" {
			t.Errorf("socket closed with reason %q, want \"turn failed\"", reason)
		}
	})
}
