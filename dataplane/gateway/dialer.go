package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
)

// PoolDialer returns the pool.Dialer the data plane gives its pool: each
// new socket is an upstream.Conn dialled with base and the credential
// creds holds at dial time (so a refreshed token is used for new sockets
// while existing heads keep theirs). The pool's Close on it is a hard
// close that releases the file descriptor at once, except on Pool.Close,
// which closes idle sockets with 1001 (see GoingAwayTimeout).
func PoolDialer(base upstream.DialOptions, creds CredentialsSource) pool.Dialer {
	return pool.DialerFunc(func(ctx context.Context, _ pool.Partition) (pool.Conn, error) {
		cred, err := creds.Credential(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial upstream: get credential: %w", err)
		}
		opts := base
		opts.Credential = cred
		c, err := upstream.Dial(ctx, opts)
		if err != nil {
			return nil, markRejected(err, cred.AccessToken)
		}
		return &poolConn{c: c}, nil
	})
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
	token credentials.Secret
	err   error
}

func (e *rejectedError) Error() string { return e.err.Error() }
func (e *rejectedError) Unwrap() error { return e.err }

func markRejected(err error, token credentials.Secret) error {
	var ue *upstream.UpgradeError
	if errors.As(err, &ue) && ue.Status == http.StatusUnauthorized {
		return &rejectedError{token: token, err: err}
	}
	return err
}
