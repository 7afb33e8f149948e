package upstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

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
// selects its default; Dial never modifies the options it is given.
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
	// http.DefaultClient).
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
}

// UpgradeError reports a WebSocket upgrade the backend refused with an
// HTTP status. The response body is never read into it.
type UpgradeError struct {
	// Status is the HTTP status of the refused upgrade.
	Status int
	// RetryAfter is the raw Retry-After header ("" if absent).
	RetryAfter string
}

func (e *UpgradeError) Error() string {
	return fmt.Sprintf("websocket upgrade refused with HTTP %d", e.Status)
}

// ErrBinaryFrame is returned by Next when the backend sends a binary frame;
// the protocol only uses text frames.
var ErrBinaryFrame = errors.New("upstream sent a binary frame")

// Conn is one upstream WebSocket. Send may be called concurrently with
// Next; Next must have a single caller at a time.
type Conn struct {
	ws     *websocket.Conn
	logger *slog.Logger
}

// Dial opens a Responses WebSocket.
func Dial(ctx context.Context, opts DialOptions) (*Conn, error) {
	u, err := dialURL(opts.URL)
	if err != nil {
		return nil, err
	}
	if opts.Credential.AccessToken == "" {
		return nil, errors.New("dial upstream: no access token")
	}
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
	version := opts.Version
	if version == "" {
		version = "dev"
	}
	h.Set("Authorization", "Bearer "+opts.Credential.AccessToken.Reveal())
	if opts.Credential.AccountID != "" {
		h.Set("Chatgpt-Account-Id", opts.Credential.AccountID)
	}
	h.Set("Originator", Originator)
	h.Set("User-Agent", "clodex/"+version)
	h.Set("Openai-Beta", BetaHeader)
	prop := opts.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	prop.Inject(ctx, propagation.HeaderCarrier(h))

	dctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{
		HTTPClient:      opts.HTTPClient,
		HTTPHeader:      h,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.StatusCode != 0 {
			if resp.Body != nil {
				resp.Body.Close()
			}
			return nil, &UpgradeError{Status: resp.StatusCode, RetryAfter: resp.Header.Get("Retry-After")}
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("dial upstream %s: %w", redactURL(u), ctxErr)
		}
		if dctx.Err() != nil {
			return nil, fmt.Errorf("dial upstream %s: handshake exceeded %v: %w", redactURL(u), timeout, context.DeadlineExceeded)
		}
		return nil, fmt.Errorf("dial upstream %s: %w", redactURL(u), err)
	}
	ws.SetReadLimit(readLimit)
	logger.DebugContext(ctx, "upstream socket open", "upstream", redactURL(u), "account_id", opts.Credential.AccountID)
	return &Conn{ws: ws, logger: logger}, nil
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

// Send writes one text frame.
func (c *Conn) Send(ctx context.Context, frame []byte) error {
	if err := c.ws.Write(ctx, websocket.MessageText, frame); err != nil {
		return fmt.Errorf("send upstream frame: %w", err)
	}
	return nil
}

// Next reads one server event (one text frame). If ctx ends while Next is
// waiting, the socket is closed and cannot be used again. A close by the
// peer is reported as an error for which CloseStatus returns its code.
func (c *Conn) Next(ctx context.Context) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		// coder/websocket closes the socket only when ctx ends during a
		// read; make an already-ended ctx behave the same.
		_ = c.ws.CloseNow() // the socket is abandoned either way; ctx's error is the one to report
		return nil, fmt.Errorf("read upstream frame: %w", err)
	}
	typ, data, err := c.ws.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("read upstream frame: %w", err)
	}
	if typ != websocket.MessageText {
		return nil, ErrBinaryFrame
	}
	return data, nil
}

// Close sends a close frame with code and reason and waits a bounded time
// for the peer's answer (coder/websocket waits at most 5 s each for the
// write and the reply); the socket is released either way.
func (c *Conn) Close(code websocket.StatusCode, reason string) error {
	if err := c.ws.Close(code, reason); err != nil && !isClosed(err) {
		return fmt.Errorf("close upstream socket: %w", err)
	}
	return nil
}

// Ping sends a ping frame and waits until the pong arrives or ctx ends.
// The pong is read by whoever is reading the socket: Ping needs a
// concurrent Next (coder/websocket answers control frames inside reads).
// When ctx ends first the socket stays open; the caller decides whether a
// peer that did not answer in time is dead.
func (c *Conn) Ping(ctx context.Context) error {
	if err := c.ws.Ping(ctx); err != nil {
		return fmt.Errorf("ping upstream: %w", err)
	}
	return nil
}

// CloseNow releases the socket at once without a close handshake.
func (c *Conn) CloseNow() error { return c.ws.CloseNow() }

// CloseStatus returns the close code the peer sent, or -1 when err is not
// a peer close.
func CloseStatus(err error) websocket.StatusCode { return websocket.CloseStatus(err) }

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || websocket.CloseStatus(err) != -1
}
