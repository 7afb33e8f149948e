package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
)

// PoolDialer returns the pool.Dialer the data plane gives its pool: each
// new socket is an upstream.Conn dialled with base and the credential
// creds holds at dial time (so a refreshed token is used for new sockets
// while existing heads keep theirs). When creds is an AccountCredentials,
// the credential is that of the socket's Partition.Account. The pool's Close on it is a hard
// close that releases the file descriptor at once, except on Pool.Close,
// which closes idle sockets with 1001 (see GoingAwayTimeout).
//
// With a health (give the gateway the same one), every dial first asks
// health.Dial for the upstream's key (UpstreamKey of base.URL): while the
// upstream is unreachable a new socket is refused at once with a
// *retry.DownError, without a dial, until the next probe is due. A dial
// that opens no socket (refused, DNS, TLS, a timeout, an upgrade 5xx) is
// recorded as Unreachable with an *UnreachableError naming the host and
// the cause; any other answer as Reached. A nil health gates nothing.
func PoolDialer(base upstream.DialOptions, creds CredentialsSource, health *retry.Health) pool.Dialer {
	key := UpstreamKey(base.URL)
	multi, _ := creds.(AccountCredentials)
	return pool.DialerFunc(func(ctx context.Context, part pool.Partition) (pool.Conn, error) {
		var cred codexauth.Credential
		var err error
		if multi != nil && part.Account != "" {
			cred, err = multi.CredentialFor(ctx, part.Account)
		} else {
			cred, err = creds.Credential(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("dial upstream: get credential: %w", err)
		}
		var ticket *retry.DialTicket
		if health != nil {
			if ticket, err = health.Dial(key); err != nil {
				return nil, err
			}
			defer ticket.Done()
		}
		opts := base
		opts.Credential = cred
		c, err := upstream.Dial(ctx, opts)
		if err != nil {
			switch {
			case ctx.Err() != nil:
			case isUnreachable(err):
				err = &UnreachableError{Upstream: key, Cause: dialCause(err), Err: err}
				ticket.Unreachable(err)
			default:
				ticket.Reached()
			}
			return nil, markRejected(err, cred.AccessToken)
		}
		ticket.Reached()
		return &poolConn{c: c}, nil
	})
}

// UpstreamKey is how the data plane names an upstream in messages, logs
// and its failure memory: the host (and port, when the URL has one) of its
// URL, or the URL itself when it has no host.
func UpstreamKey(rawURL string) string {
	if rawURL == "" {
		rawURL = upstream.DefaultURL
	}
	if u, err := url.Parse(rawURL); err == nil && u.Host != "" {
		return u.Host
	}
	return rawURL
}

// UnreachableError is a dial that opened no socket: the client is told the
// upstream's host and the cause.
type UnreachableError struct {
	Upstream string // UpstreamKey
	Cause    string // "connection refused", "DNS lookup failed: no such host", …
	Err      error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("upstream %s cannot be reached: %s: %v", e.Upstream, e.Cause, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// isUnreachable reports whether a dial error means the backend could not
// be reached at all, or answered the upgrade with a 5xx: not a refusal of
// this client (401, 403, 429), which shows the backend up.
func isUnreachable(err error) bool {
	var ue *upstream.UpgradeError
	if errors.As(err, &ue) {
		return ue.Status >= 500
	}
	return true
}

// dialCause says in a few words why a dial opened no socket.
func dialCause(err error) string {
	var ue *upstream.UpgradeError
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

// GoingAwayTimeout bounds the close handshake of a pooled socket closed
// because the pool is closing.
const GoingAwayTimeout = time.Second

// poolConn adapts *upstream.Conn to pool.Conn. Close is a hard close that
// releases the descriptor at once, except when the pool closes
// (pool.ReasonPoolClosed): then the backend is told with a 1001 close
// frame, within GoingAwayTimeout.
type poolConn struct{ c *upstream.Conn }

func (p *poolConn) Send(ctx context.Context, frame []byte) error { return p.c.Send(ctx, frame) }
func (p *poolConn) Next(ctx context.Context) ([]byte, error)     { return p.c.Next(ctx) }
func (p *poolConn) Ping(ctx context.Context) error               { return p.c.Ping(ctx) } // the pool's keepalive of idle heads
func (p *poolConn) Close(reason string) error {
	if reason != pool.ReasonPoolClosed {
		return p.c.CloseNow()
	}
	return closeGoingAway(p.c, reason, GoingAwayTimeout)
}

// closeGoingAway closes an idle socket with 1001 and reason, waiting about
// timeout for the peer's answer. A reader runs while the close frame goes
// out: it takes the peer's close frame (which ends the handshake), and when
// timeout passes first its read's deadline hard-closes the socket, which
// also ends the handshake. The reader is started first and waited for. (If
// the close handshake still takes the socket's read lock before the reader
// does, coder/websocket's own bound applies: at most 5 s for the answer. An
// idle pooled socket already has a reader, the pool's: it reads the answer,
// and the pool ends its read after a second.)
func closeGoingAway(c *upstream.Conn, reason string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	started, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		close(started)
		for {
			if _, err := c.Next(ctx); err != nil && !errors.Is(err, upstream.ErrBinaryFrame) {
				return
			}
		}
	}()
	<-started
	runtime.Gosched() // let the reader take the read lock first
	err := c.Close(websocket.StatusGoingAway, reason)
	cancel()
	<-done
	_ = c.CloseNow() // a no-op once closed; releases the socket if the handshake did not
	return err
}

// rejectedError marks an upgrade the backend refused with 401, with the
// token it refused (never printed).
type rejectedError struct {
	token codexauth.Secret
	err   error
}

func (e *rejectedError) Error() string { return e.err.Error() }
func (e *rejectedError) Unwrap() error { return e.err }

func markRejected(err error, token codexauth.Secret) error {
	var ue *upstream.UpgradeError
	if errors.As(err, &ue) && ue.Status == http.StatusUnauthorized {
		return &rejectedError{token: token, err: err}
	}
	return err
}
