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
	"syscall"
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
// ctx ended first.
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
	h.Set("Authorization", "Bearer "+opts.Credential.AccessToken.Reveal())
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
	logger.DebugContext(ctx, "upstream socket open", "upstream", redactURL(u), "account_id", opts.Credential.AccountID)
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
