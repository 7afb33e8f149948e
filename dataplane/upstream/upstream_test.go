package upstream

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
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
			if strings.Contains(err.Error(), "BODY-SECRET") || strings.Contains(err.Error(), "tok-test") ||
				strings.Contains(fmt.Sprintf("%v %+v %#v", err, ue, ue), "tok-test") {
				t.Errorf("error %q leaks the body or token", err)
			}
			// A 401 carries the token it refused, for its one refresh.
			if want := codexauth.Secret(""); tt.status == http.StatusUnauthorized {
				want = testCred.AccessToken
				if ue.Token != want {
					t.Errorf("UpgradeError.Token = %q, want the refused token", ue.Token.Reveal())
				}
			} else if ue.Token != want {
				t.Errorf("UpgradeError.Token is set for HTTP %d; want it only on a 401", tt.status)
			}
			// Only a 5xx shows the backend unreachable.
			var unreach *UnreachableError
			if got := errors.As(err, &unreach); got != (tt.status >= 500) {
				t.Errorf("HTTP %d: UnreachableError %t, want %t", tt.status, got, tt.status >= 500)
			}
			if unreach != nil && (unreach.Upstream != Key(wsURL(ts)) || unreach.Cause != fmt.Sprintf("the WebSocket upgrade was answered with HTTP %d", tt.status)) {
				t.Errorf("UnreachableError %+v, want upstream %s and the upgrade's status as the cause", unreach, Key(wsURL(ts)))
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

func TestPingIsAnsweredThroughTheReaderAndTimesOutOnASilentPeer(t *testing.T) {
	_, ts := newEchoServer(t, func([]byte) [][]byte { return nil })
	conn, err := Dial(t.Context(), DialOptions{URL: wsURL(ts), Credential: testCred})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer func() { _ = conn.CloseNow() }()
	// The pong is read by the Conn's own reader: no Next is needed.
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := conn.Ping(ctx); err != nil {
		t.Errorf("Ping = %v, want nil", err)
	}
	readCtx, stopRead := context.WithCancel(t.Context())
	stopRead()
	if _, err := conn.Next(readCtx); !errors.Is(err, context.Canceled) {
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
	pctx, pcancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer pcancel()
	if err := conn2.Ping(pctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ping upstream") {
		t.Errorf("Ping to a silent peer = %v, want a ping upstream error wrapping DeadlineExceeded", err)
	}
}

// A dial that opens no socket is an UnreachableError naming the upstream
// and the cause, over real sockets: nothing listening, a certificate
// nobody trusts, a backend that never answers the handshake. A dial whose
// own context ended is not one.
func TestDialNamesWhyNoSocketOpened(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closed.Addr().String()
	closed.Close()

	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are the point
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	tlsAddr := strings.TrimPrefix(tlsSrv.URL, "https://")

	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel does), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	tests := []struct {
		name, url, cause string
		timeout          time.Duration // the dial's bound
	}{
		{"nothing listens", "ws://" + refusedAddr + "/r", "connection refused", time.Minute},
		{"untrusted certificate", "wss://" + tlsAddr + "/r", "TLS certificate not trusted", time.Minute},
		{"no answer", "ws://" + silent.Addr().String() + "/r", "timed out", 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Dial(t.Context(), DialOptions{URL: tt.url, DialTimeout: tt.timeout, Credential: testCred})
			var ue *UnreachableError
			if !errors.As(err, &ue) || ue.Cause != tt.cause || ue.Upstream != Key(tt.url) {
				t.Fatalf("Dial = %v, want an UnreachableError for %s: %s", err, Key(tt.url), tt.cause)
			}
		})
	}
	t.Run("cancelled by its caller", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := Dial(ctx, DialOptions{URL: "ws://" + silent.Addr().String() + "/r", Credential: testCred})
		var ue *UnreachableError
		if errors.As(err, &ue) || !errors.Is(err, context.Canceled) {
			t.Errorf("Dial with an ended context = %v, want context.Canceled, not an UnreachableError", err)
		}
	})
}

// dialCause names the usual ways a dial fails.
func TestDialCause(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("dial upstream wss://x: failed to WebSocket dial: %w", err) }
	tests := []struct {
		err  error
		want string
	}{
		{wrap(&net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "chatgpt.invalid", IsNotFound: true}}), "DNS lookup failed: no such host"},
		{wrap(&net.DNSError{Err: "i/o timeout", IsTimeout: true}), "DNS lookup timed out"},
		{wrap(&net.DNSError{Err: "server misbehaving"}), "DNS lookup failed"},
		{wrap(&net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}), "connection refused"},
		{wrap(&net.OpError{Op: "read", Err: syscall.ECONNRESET}), "connection reset"},
		{wrap(&net.OpError{Op: "dial", Err: syscall.EHOSTUNREACH}), "no route to host"},
		{wrap(x509.UnknownAuthorityError{}), "TLS certificate not trusted"},
		{wrap(x509.HostnameError{Host: "x"}), "TLS certificate not trusted"},
		{wrap(tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}), "TLS handshake failed"},
		{wrap(context.DeadlineExceeded), "timed out"},
		{wrap(io.ErrUnexpectedEOF), "connection closed during the handshake"},
		{&UpgradeError{Status: 503}, "the WebSocket upgrade was answered with HTTP 503"},
		{errors.New("something else"), "connection failed"},
	}
	for _, tt := range tests {
		if got := dialCause(tt.err); got != tt.want {
			t.Errorf("dialCause(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestKey(t *testing.T) {
	for in, want := range map[string]string{
		"wss://chatgpt.com/backend-api/codex/responses": "chatgpt.com",
		"ws://127.0.0.1:17800/x":                        "127.0.0.1:17800",
		"":                                              "chatgpt.com",
		"not a url":                                     "not a url",
	} {
		if got := Key(in); got != want {
			t.Errorf("Key(%q) = %q, want %q", in, got, want)
		}
	}
}
