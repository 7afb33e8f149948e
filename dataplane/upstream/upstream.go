package upstream

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
)

const (
	// DefaultURL is the Codex backend's Responses WebSocket.
	DefaultURL = "wss://chatgpt.com/backend-api/codex/responses"
	// DefaultReadLimit fits the largest frame the backend sends.
	DefaultReadLimit = 32 << 20
	// DefaultDialTimeout bounds the TCP connect, TLS and upgrade handshake.
	DefaultDialTimeout = 15 * time.Second
	// BetaHeader is the OpenAI-Beta value that enables Responses over
	// WebSocket.
	BetaHeader = "responses_websockets=2026-02-06"
	// Originator is sent as the originator header.
	Originator = "clodex"
)

// DialOptions configures [Dial]. The zero value of every optional field
// selects its default; Dial copies the options and never modifies them.
type DialOptions struct {
	// URL is the WebSocket URL (Optional; default DefaultURL). ws, wss,
	// http and https schemes are accepted.
	URL string
	// Credential authenticates the upgrade (Required: an access token).
	Credential codexauth.Credential
	// Version is the clodex version for user-agent "clodex/<version>"
	// (Optional; default "dev").
	Version string
	// Header holds extra upgrade headers (Optional). It is copied.
	Header http.Header
	// HTTPClient performs the handshake (Optional; default
	// http.DefaultClient). It is copied; its Transport must return
	// writable bodies for WebSocket upgrades, as http.Transport does.
	HTTPClient *http.Client
	// DialTimeout bounds the handshake (Optional; default
	// DefaultDialTimeout).
	DialTimeout time.Duration
	// ReadLimit is the largest frame accepted from the backend (Optional;
	// default DefaultReadLimit).
	ReadLimit int64
	// Propagator injects the trace context into the upgrade headers
	// (Optional; default otel.GetTextMapPropagator()).
	Propagator propagation.TextMapPropagator
	// Logger receives debug lines (Optional; default discards).
	Logger *slog.Logger

	// OnFrame is called with every text frame the Conn's reader reads,
	// before the frame is handed on (Optional). It runs synchronously on
	// the reader's goroutine, so it must not block, and must not call the
	// Conn's Close or CloseNow; frame is the slice the consumer receives
	// and must not be modified.
	OnFrame func(frame []byte)
}

// UpgradeError reports a WebSocket upgrade the backend refused with an
// HTTP status. The response body is never read into it.
type UpgradeError struct {
	// Status is the HTTP status of the refused upgrade.
	Status int
	// RetryAfter is the raw Retry-After header ("" if absent).
	RetryAfter string
	// Token is the access token the backend refused, for a 401 only
	// (the caller asks its credential source for a refresh of exactly
	// that token). A Secret never prints.
	Token codexauth.Secret
}

func (e *UpgradeError) Error() string {
	return fmt.Sprintf("websocket upgrade refused with HTTP %d", e.Status)
}

// UnreachableError is a dial that opened no socket without the backend
// refusing it: the connection was refused, the DNS lookup or the TLS
// handshake failed, the handshake timed out or the connection closed
// during it, or the upgrade was answered with a 5xx (Err then wraps the
// *UpgradeError). A dial its own context ended is not one.
type UnreachableError struct {
	Upstream string // Key of the URL
	Cause    string // "connection refused", "DNS lookup failed: no such host", …
	Err      error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("upstream %s cannot be reached: %s: %v", e.Upstream, e.Cause, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

func unreachable(key string, err error) *UnreachableError {
	return &UnreachableError{Upstream: key, Cause: dialCause(err), Err: err}
}

// Key is how the data plane names an upstream in messages, logs and its
// failure memory: the host (and port, when the URL has one) of its URL
// ("" means DefaultURL), or the URL itself when it has no host.
func Key(rawURL string) string {
	if rawURL == "" {
		rawURL = DefaultURL
	}
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return rawURL
}

// Dial opens a Responses WebSocket and starts its reader. A refused
// upgrade is an *UpgradeError (a 5xx one wrapped in an *UnreachableError);
// a dial that opened no socket otherwise is an *UnreachableError, unless
// ctx ended first. Invalid options (the URL, no access token) are plain
// errors, returned before any dial.
func Dial(ctx context.Context, opts DialOptions) (*Conn, error) {
	u, err := dialURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Credential.AccessToken == "" {
		return nil, errors.New("dial upstream: no access token")
	}
	key := Key(u)
	timeout := opts.DialTimeout
	if timeout <= 0 {
		timeout = DefaultDialTimeout
	}
	readLimit := opts.ReadLimit
	if readLimit <= 0 {
		readLimit = DefaultReadLimit
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := make(http.Header, len(opts.Header)+8)
	for k, v := range opts.Header {
		h[k] = append([]string(nil), v...)
	}
	// The one place the access token goes on the wire: a conversion, as
	// Secret.Reveal does.
	h.Set("Authorization", "Bearer "+string(opts.Credential.AccessToken))
	if opts.Credential.AccountID != "" {
		h.Set("Chatgpt-Account-Id", opts.Credential.AccountID)
	}
	h.Set("Originator", Originator)
	h.Set("User-Agent", "clodex/"+cmp.Or(opts.Version, "dev"))
	h.Set("Openai-Beta", BetaHeader)
	prop := opts.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	prop.Inject(ctx, propagation.HeaderCarrier(h))

	// The handshake's connection is kept (tap) so that a close handshake
	// the peer never answers can be cut short: coder/websocket's own
	// close waits up to 5 s for the answer and cannot be interrupted.
	client := http.DefaultClient
	if opts.HTTPClient != nil {
		client = opts.HTTPClient
	}
	hc := *client
	tap := &tapTransport{rt: cmp.Or[http.RoundTripper](client.Transport, http.DefaultTransport)}
	hc.Transport = tap

	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{
		HTTPClient:      &hc,
		HTTPHeader:      h,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != 0 {
			if resp.Body != nil {
				resp.Body.Close()
			}
			ue := &UpgradeError{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
			if ue.Status == http.StatusUnauthorized {
				ue.Token = opts.Credential.AccessToken
			}
			if ue.Status >= 500 {
				return nil, unreachable(key, ue)
			}
			return nil, ue
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("dial upstream %s: %w", redactURL(u), ctxErr)
		}
		if dctx.Err() != nil {
			return nil, unreachable(key, fmt.Errorf("dial upstream %s: handshake exceeded %v: %w", redactURL(u), timeout, context.DeadlineExceeded))
		}
		return nil, unreachable(key, fmt.Errorf("dial upstream %s: %w", redactURL(u), err))
	}
	ws.SetReadLimit(readLimit)
	// The account by its key, as every log and span names it: the raw
	// ChatGPT account id stays out of logs.
	acct := "-"
	if opts.Credential.AccountID != "" {
		acct = account.Key(opts.Credential.AccountID)
	}
	logger.DebugContext(ctx, "upstream socket open", "upstream", redactURL(u), "account", acct)
	return newConn(ws, tap.raw, opts.OnFrame), nil
}

// tapTransport keeps the connection of the upgrade it carries.
type tapTransport struct {
	rt  http.RoundTripper
	raw io.Closer // the 101 response's body: the connection itself
}

func (t *tapTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		t.raw = resp.Body
	}
	return resp, err
}

func dialURL(raw string) (string, error) {
	if raw == "" {
		return DefaultURL, nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("upstream URL %q is not a URL; want ws://, wss://, http:// or https://", raw)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return "", fmt.Errorf("upstream URL %q has scheme %q; want ws, wss, http or https", raw, u.Scheme)
	}
	if u.Host == "" {
		return "", fmt.Errorf("upstream URL %q has no host", raw)
	}
	return raw, nil
}

// redactURL drops userinfo and query from a URL before it goes into an
// error or a log line.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(invalid URL)"
	}
	u.User = nil
	u.RawQuery = ""
	u.Fragment = ""
	return u.String()
}

// dialCause says in a few words why a dial opened no socket.
func dialCause(err error) string {
	var ue *UpgradeError
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var hostErr x509.HostnameError
	var authErr x509.UnknownAuthorityError
	var recErr tls.RecordHeaderError
	var alertErr tls.AlertError
	var netErr net.Error
	switch {
	case errors.As(err, &ue):
		return fmt.Sprintf("the WebSocket upgrade was answered with HTTP %d", ue.Status)
	case errors.As(err, &dnsErr):
		switch {
		case dnsErr.IsNotFound:
			return "DNS lookup failed: no such host"
		case dnsErr.IsTimeout:
			return "DNS lookup timed out"
		}
		return "DNS lookup failed"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "connection reset"
	case errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return "no route to host"
	case errors.As(err, &certErr), errors.As(err, &hostErr), errors.As(err, &authErr):
		return "TLS certificate not trusted"
	case errors.As(err, &recErr), errors.As(err, &alertErr):
		return "TLS handshake failed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return "timed out"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection closed during the handshake"
	}
	return "connection failed"
}

// CloseTimeout bounds [Conn.Close]: how long it waits for the peer's
// answer to its close frame before it closes the socket hard.
const CloseTimeout = time.Second

// ErrBinaryFrame ends a Conn whose backend sent a binary frame; the
// protocol only uses text frames.
var ErrBinaryFrame = errors.New("upstream sent a binary frame")

// UnexpectedFrameError is what a watch ([Conn.Watch]) is told when the
// socket sent a data frame while it was watched.
type UnexpectedFrameError struct {
	Frame []byte // the frame, as read
}

func (e *UnexpectedFrameError) Error() string {
	return "upstream sent a frame while no request was in flight"
}

// Conn is one upstream WebSocket and its reader: a goroutine, started by
// Dial and stopped by Close or CloseNow, that reads every frame, so pings
// are answered and a close from the peer is seen at all times (the socket
// is read while a frame waits for its consumer only after that frame is
// taken). What it reads goes to the consumer ([Conn.Frames], [Conn.Next])
// or, while the Conn is watched, to the watch ([Conn.Watch]). Send and
// Ping may be called concurrently with everything else; frames have one
// consumer at a time.
type Conn struct {
	ws      *websocket.Conn
	raw     io.Closer     // the connection under ws; closing it cuts a close handshake short
	onFrame func([]byte)  // DialOptions.OnFrame
	frames  chan []byte   // unbuffered: each frame goes to one receiver; closed when the reader stops reading
	wake    chan struct{} // size 1: a watch or a close changed what the reader does with what it holds
	exited  chan struct{} // closed when the reader goroutine returns

	mu          sync.Mutex // guards the following fields
	lost        func(error)
	closing     bool  // Close or CloseNow started: what the reader reads is discarded
	handshaking bool  // Close is waiting for the peer's answer
	ended       bool  // the reader stopped reading; err says why
	inLost      bool  // the reader is running the watch's lost
	err         error // why the reader stopped
}

func newConn(ws *websocket.Conn, raw io.Closer, onFrame func([]byte)) *Conn {
	if raw == nil {
		raw = nopCloser{}
	}
	c := &Conn{ws: ws, raw: raw, onFrame: onFrame, frames: make(chan []byte),
		wake: make(chan struct{}, 1), exited: make(chan struct{})}
	go c.readLoop()
	return c
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }

// readLoop is the reader goroutine (owned by the Conn: Close and CloseNow
// wait for it).
func (c *Conn) readLoop() {
	defer close(c.exited)
	for {
		data, err := c.read()
		if !c.hand(data, err) {
			return
		}
	}
}

// read reads one text frame and offers it to OnFrame.
func (c *Conn) read() ([]byte, error) {
	typ, data, err := c.ws.Read(context.Background()) // the socket's own read: only a close ends it
	switch {
	case err != nil:
		return nil, fmt.Errorf("read upstream frame: %w", err)
	case typ != websocket.MessageText:
		return nil, ErrBinaryFrame
	}
	if c.onFrame != nil {
		c.onFrame(data)
	}
	return data, nil
}

// hand gives what the reader read, a frame or the error that ended the
// socket, to whom it belongs, and reports whether the reader reads on. The
// choice is made under mu, and made again whenever a watch or a close
// wakes the reader while it still holds what it read: a closing Conn
// discards it; a watched one gives it to the watch and stops reading; a
// claimed one gives a frame to the next receiver of frames, or an error
// by closing frames (the reader then waits: a later watch is still told).
func (c *Conn) hand(data []byte, err error) bool {
	for {
		c.mu.Lock()
		if c.closing {
			if err != nil {
				c.endLocked(err)
			}
			c.mu.Unlock()
			return err == nil
		}
		if lost := c.lost; lost != nil {
			if err == nil {
				err = &UnexpectedFrameError{Frame: data}
			}
			c.lost = nil
			c.endLocked(err)
			c.inLost = true
			c.mu.Unlock()
			lost(err)
			c.mu.Lock()
			c.inLost = false
			c.mu.Unlock()
			return false
		}
		if err != nil {
			c.endLocked(err)
			c.mu.Unlock()
			<-c.wake
			continue
		}
		c.mu.Unlock()
		select {
		case c.frames <- data:
			return true
		case <-c.wake:
		}
	}
}

// endLocked records that the reader stopped reading, and why.
func (c *Conn) endLocked(err error) {
	if c.ended {
		return
	}
	c.ended, c.err = true, err
	close(c.frames)
}

// signal wakes the reader if it waits with what it read.
func (c *Conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Frames returns the channel the reader hands the socket's text frames
// on, in order, one receiver per frame. It is closed when the reader
// stopped, and Err then says why. Receiving from it is Next without a
// context: a caller waits for a frame together with other events (a
// ticker, its context) in one select. Nothing is delivered while the Conn
// is watched.
func (c *Conn) Frames() <-chan []byte { return c.frames }

// Err returns why the reader stopped once Frames is closed, and nil
// before: the peer's close (CloseStatus returns its code), a read error,
// ErrBinaryFrame, the socket's own close, or what a watch was told.
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Next returns the next frame, or Err once the reader stopped. If ctx
// ends first (or has ended) the socket is closed hard and cannot be used
// again: that is how a client that went away cancels the upstream
// response (coder/websocket's read semantics).
func (c *Conn) Next(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		_ = c.CloseNow() // the socket is abandoned either way; ctx's error is the one to report
		return nil, fmt.Errorf("read upstream frame: %w", err)
	}
	select {
	case data, ok := <-c.frames:
		if !ok {
			return nil, c.Err()
		}
		return data, nil
	case <-ctx.Done():
		_ = c.CloseNow()
		return nil, fmt.Errorf("read upstream frame: %w", ctx.Err())
	}
}

// Watch hands the socket to lost while no request holds it: the first
// thing the reader reads from now on, a data frame (an
// *UnexpectedFrameError) or the error that ended the socket (a peer close,
// for which CloseStatus returns its code, or a lost connection), goes to
// lost instead of the consumer, and so does a frame or an end the reader
// read before Watch and nobody took. lost is called at most once, on the
// reader's goroutine after the reader stopped reading, so it may close the
// Conn; it must not block for long. Claim ends the watch. Nobody may
// receive from Frames while the Conn is watched.
func (c *Conn) Watch(lost func(error)) {
	c.mu.Lock()
	c.lost = lost
	c.mu.Unlock()
	c.signal()
}

// Claim ends a watch and reports whether the socket is still live: false
// when the watch's lost was given something (or is about to be: the
// choice is made once, under the Conn's lock, so a frame is never both
// given to lost and delivered), when the reader stopped, or when the Conn
// is closing. After a true Claim, what the reader reads next (a frame that
// arrived during the watch included) goes to the consumer.
func (c *Conn) Claim() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lost = nil
	return !c.ended && !c.closing
}

// Send writes one text frame.
func (c *Conn) Send(ctx context.Context, frame []byte) error {
	if err := c.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("send upstream frame: %w", err)
	}
	return nil
}

// Ping sends a ping frame and waits until the reader reads the pong or ctx
// ends. When ctx ends first the socket stays open; the caller decides
// whether a peer that did not answer in time is dead.
func (c *Conn) Ping(ctx context.Context) error {
	if err := c.ws.Ping(ctx); err != nil {
		return fmt.Errorf("ping upstream: %w", err)
	}
	return nil
}

// Close sends a close frame with code and reason and waits for the peer's
// answer, which the reader reads, at most CloseTimeout; then it closes the
// socket hard. It returns once the socket is released and the reader has
// returned (unless it is called from a watch's lost). A Conn whose reader
// stopped has nobody to read the answer: Close is then CloseNow.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	c.mu.Lock()
	if c.closing || c.ended || c.inLost {
		c.mu.Unlock()
		return c.CloseNow()
	}
	c.closing, c.handshaking = true, true
	c.mu.Unlock()
	c.signal() // a frame the reader holds is discarded: it reads on, for the answer
	hard := make(chan struct{})
	timer := time.AfterFunc(CloseTimeout, func() {
		defer close(hard)
		_ = c.raw.Close() // ends the handshake's wait for the peer at once
	})
	err := c.ws.Close(code, reason)
	if !timer.Stop() {
		<-hard
		err = nil // the peer did not answer in time; the socket is released
	}
	<-c.exited
	if err != nil && !isClosed(err) {
		return fmt.Errorf("close upstream socket: %w", err)
	}
	return nil
}

// CloseNow closes the socket without a close handshake (cutting short one
// Close is waiting for) and releases its file descriptor before it
// returns. It waits for the reader, unless it is called from a watch's
// lost (or while lost runs).
func (c *Conn) CloseNow() error {
	c.mu.Lock()
	c.closing = true
	handshaking, inLost := c.handshaking, c.inLost
	c.mu.Unlock()
	c.signal()
	if handshaking {
		_ = c.raw.Close() // coder/websocket's CloseNow would wait for the handshake
	}
	err := c.ws.CloseNow()
	if !inLost {
		<-c.exited
	}
	if err != nil && !isClosed(err) {
		return fmt.Errorf("close upstream socket: %w", err)
	}
	return nil
}

// CloseStatus returns the close code the peer sent, or -1 when err is not
// a peer close.
func CloseStatus(err error) websocket.StatusCode { return websocket.CloseStatus(err) }

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || websocket.CloseStatus(err) != -1
}
