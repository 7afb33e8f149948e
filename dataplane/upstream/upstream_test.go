package upstream

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"

	"github.com/clodex/clodex/internal/codexauth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testCred = codexauth.Credential{AccessToken: "tok-test", AccountID: "acct-test"}

// echoServer is a small Responses-like server: it records the upgrade
// headers, answers each text frame with the frames produced by reply, and
// reports the close it received.
type echoServer struct {
	t       *testing.T
	headers chan http.Header
	closed  chan websocket.StatusCode
	reasons chan string
	reply   func(in []byte) [][]byte
}

func newEchoServer(t *testing.T, reply func([]byte) [][]byte) (*echoServer, *httptest.Server) {
	t.Helper()
	es := &echoServer{t: t, headers: make(chan http.Header, 1), closed: make(chan websocket.StatusCode, 1), reasons: make(chan string, 1), reply: reply}
	ts := httptest.NewServer(http.HandlerFunc(es.serve))
	t.Cleanup(ts.Close)
	return es, ts
}

func (es *echoServer) serve(w http.ResponseWriter, r *http.Request) {
	select {
	case es.headers <- r.Header.Clone():
	default:
	}
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer func() { _ = c.CloseNow() }()
	c.SetReadLimit(64 << 20)
	for {
		_, data, err := c.Read(r.Context())
		if err != nil {
			es.closed <- websocket.CloseStatus(err)
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				es.reasons <- ce.Reason
			} else {
				es.reasons <- ""
			}
			return
		}
		for _, out := range es.reply(data) {
			typ := websocket.MessageText
			if bytes.HasPrefix(out, []byte("BINARY")) {
				typ = websocket.MessageBinary
			}
			if err := c.Write(r.Context(), typ, out); err != nil {
				return
			}
		}
	}
}

func wsURL(ts *httptest.Server) string {
	return "ws" + strings.TrimPrefix(ts.URL, "http") + "/backend-api/codex/responses"
}

func TestDialHeadersAndRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 2<<20) // far above coder/websocket's 32 KiB default read limit
	es, ts := newEchoServer(t, func(in []byte) [][]byte {
		return [][]byte{[]byte(`{"type":"response.created"}`), append([]byte(`{"type":"big","pad":"`), append(big, '"', '}')...), in}
	})
	tp := sdktrace.NewTracerProvider()
	defer func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			t.Errorf("shut down the tracer provider: %v", err)
		}
	}()
	ctx, span := tp.Tracer("test").Start(t.Context(), "turn")
	defer span.End()

	conn, err := Dial(ctx, DialOptions{
		URL:        wsURL(ts),
		Credential: testCred,
		Version:    "1.2.3",
		Header:     http.Header{"X-Extra": {"yes"}},
		Propagator: propagation.TraceContext{},
	})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	h := <-es.headers
	want := map[string]string{
		"Authorization":      "Bearer tok-test",
		"Chatgpt-Account-Id": "acct-test",
		"Originator":         "clodex",
		"User-Agent":         "clodex/1.2.3",
		"Openai-Beta":        "responses_websockets=2026-02-06",
		"X-Extra":            "yes",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("upgrade header %s = %q, want %q", k, got, v)
		}
	}
	tid := span.SpanContext().TraceID().String()
	if tp := h.Get("Traceparent"); !strings.Contains(tp, tid) {
		t.Errorf("traceparent = %q, want it to carry trace id %s", tp, tid)
	}
	if ext := h.Get("Sec-Websocket-Extensions"); ext != "" {
		t.Errorf("Sec-WebSocket-Extensions = %q, want none (compression disabled)", ext)
	}

	frame := []byte(`{"type":"response.create","model":"gpt-5.5"}`)
	if err := conn.Send(ctx, frame); err != nil {
		t.Fatalf("Send: %v", err)
	}
	for i, wantPrefix := range []string{`{"type":"response.created"}`, `{"type":"big"`, string(frame)} {
		got, err := conn.Next(ctx)
		if err != nil {
			t.Fatalf("Next #%d: %v", i, err)
		}
		if !bytes.HasPrefix(got, []byte(wantPrefix)) {
			t.Errorf("Next #%d = %.40q, want prefix %q", i, got, wantPrefix)
		}
	}
	if err := conn.Close(websocket.StatusNormalClosure, "turn complete"); err != nil {
		t.Errorf("Close: %v", err)
	}
	if code, reason := <-es.closed, <-es.reasons; code != websocket.StatusNormalClosure || reason != "turn complete" {
		t.Errorf("server saw close %v %q, want 1000 \"turn complete\"", code, reason)
	}
}

func TestDialOmitsAccountHeaderWhenUnknown(t *testing.T) {
	es, ts := newEchoServer(t, func([]byte) [][]byte { return nil })
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: codexauth.Credential{AccessToken: "tok"}})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	h := <-es.headers
	if _, ok := h["Chatgpt-Account-Id"]; ok {
		t.Errorf("chatgpt-account-id sent without an account id: %q", h.Get("Chatgpt-Account-Id"))
	}
	if got := h.Get("User-Agent"); got != "clodex/dev" {
		t.Errorf("User-Agent = %q, want clodex/dev", got)
	}
}

func TestDialUpgradeRefused(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		retryAfter string
	}{
		{"throttle 403 with retry-after", http.StatusForbidden, "7"},
		{"401 without retry-after", http.StatusUnauthorized, ""},
		{"503", http.StatusServiceUnavailable, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tt.retryAfter != "" {
					w.Header().Set("Retry-After", tt.retryAfter)
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte("BODY-SECRET-PROSE"))
			}))
			defer ts.Close()
			_, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
			var ue *UpgradeError
			if !errors.As(err, &ue) {
				t.Fatalf("Dial error = %v, want *UpgradeError", err)
			}
			if ue.Status != tt.status || ue.RetryAfter != tt.retryAfter {
				t.Errorf("UpgradeError = %+v, want status %d retry-after %q", ue, tt.status, tt.retryAfter)
			}
			if strings.Contains(err.Error(), "BODY-SECRET") || strings.Contains(err.Error(), "tok-test") {
				t.Errorf("error %q leaks the body or token", err)
			}
		})
	}
}

func TestDialBadOptions(t *testing.T) {
	tests := []struct {
		name string
		opts DialOptions
		want string
	}{
		{"scheme", DialOptions{URL: "ftp://x/y", Credential: testCred}, "scheme"},
		{"no host", DialOptions{URL: "ws:///path", Credential: testCred}, "no host"},
		{"no token", DialOptions{URL: "ws://127.0.0.1:1/"}, "no access token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Dial(t.Context(), tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Dial error = %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestDialDeadline(t *testing.T) {
	// A listener that accepts TCP but never answers the upgrade.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	_, err = Dial(t.Context(), DialOptions{URL: "ws://" + ln.Addr().String() + "/", Credential: testCred, DialTimeout: 50 * time.Millisecond})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial error = %v, want DeadlineExceeded", err)
	}
	ln.Close()
	<-done
}

func TestNextCancelClosesSocket(t *testing.T) {
	es, ts := newEchoServer(t, func([]byte) [][]byte { return nil }) // never answers
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	ctx, cancel := context.WithCancel(t.Context())
	if err := conn.Send(ctx, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := conn.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next after cancel = %v, want context.Canceled", err)
	}
	<-es.closed // the server's reader ends: the socket is gone
}

func TestNextBinaryFrame(t *testing.T) {
	_, ts := newEchoServer(t, func([]byte) [][]byte { return [][]byte{[]byte("BINARY")} })
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	if err := conn.Send(t.Context(), []byte(`{}`)); err != nil {
		t.Fatalf("Send: %v", err)
	}
	if _, err := conn.Next(t.Context()); !errors.Is(err, ErrBinaryFrame) {
		t.Errorf("Next = %v, want ErrBinaryFrame", err)
	}
}

func TestNextPeerClose(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		c.Close(websocket.StatusGoingAway, "socket lifetime reached")
	}))
	defer ts.Close()
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	_, err = conn.Next(t.Context())
	if got := CloseStatus(err); got != websocket.StatusGoingAway {
		t.Errorf("CloseStatus(Next error) = %v (err %v), want 1001", got, err)
	}
}

func TestPingNeedsAReaderAndTimesOutOnASilentPeer(t *testing.T) {
	_, ts := newEchoServer(t, func([]byte) [][]byte { return nil })
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	// The pong is read by a concurrent Next, as the pool's idle reader does.
	readCtx, stopRead := context.WithCancel(t.Context())
	readDone := make(chan error, 1)
	go func() {
		_, err := conn.Next(readCtx)
		readDone <- err
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		t.Errorf("Ping with a reader = %v, want nil", err)
	}
	stopRead()
	if err := <-readDone; !errors.Is(err, context.Canceled) {
		t.Errorf("Next after its ctx ended = %v, want context.Canceled", err)
	}

	// A peer that accepts but never reads never answers the ping.
	silent := make(chan struct{})
	ts2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer func() { _ = c.CloseNow() }()
		<-silent
	}))
	defer ts2.Close()
	defer close(silent)
	conn2, err := Dial(t.Context(), DialOptions{URL: wsURL(ts2), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn2.CloseNow() }()
	readCtx2, stopRead2 := context.WithCancel(t.Context())
	readDone2 := make(chan error, 1)
	go func() {
		_, err := conn2.Next(readCtx2)
		readDone2 <- err
	}()
	pctx, pcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer pcancel()
	if err := conn2.Ping(pctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ping upstream") {
		t.Errorf("Ping to a silent peer = %v, want a ping upstream error wrapping DeadlineExceeded", err)
	}
	stopRead2()
	if err := <-readDone2; !errors.Is(err, context.Canceled) {
		t.Errorf("Next after its ctx ended = %v, want context.Canceled", err)
	}
}
