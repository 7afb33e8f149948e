package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
)

// Conn is the upstream socket a turn runs on. *upstream.Conn implements it.
type Conn interface {
	// Send writes one frame.
	Send(ctx context.Context, frame []byte) error
	// Next reads one upstream event; cancelling ctx closes the socket.
	Next(ctx context.Context) ([]byte, error)
	// Close sends a close frame with code and reason and releases the
	// socket.
	Close(code websocket.StatusCode, reason string) error
}

// Dialer opens upstream sockets for the gateway's private pool, used when
// Config.Pool is nil (tests, and callers that do not share a pool). The
// turn argument is nil: a pooled socket serves many turns.
//
// A refused upgrade should be reported as an error that wraps
// *upstream.UpgradeError so the client gets the classified status.
type Dialer interface {
	Dial(ctx context.Context, cred credentials.Credential, turn *translate.Turn) (Conn, error)
}

// DialFunc adapts a function to Dialer.
type DialFunc func(ctx context.Context, cred credentials.Credential, turn *translate.Turn) (Conn, error)

// Dial implements Dialer.
func (f DialFunc) Dial(ctx context.Context, cred credentials.Credential, turn *translate.Turn) (Conn, error) {
	return f(ctx, cred, turn)
}

// UpstreamDialer returns a Dialer that opens a new upstream.Conn per turn
// with base (its Credential is replaced by the turn's).
func UpstreamDialer(base upstream.DialOptions) Dialer {
	return DialFunc(func(ctx context.Context, cred credentials.Credential, _ *translate.Turn) (Conn, error) {
		opts := base
		opts.Credential = cred
		c, err := upstream.Dial(ctx, opts)
		if err != nil {
			return nil, err // never a typed nil inside the interface
		}
		return c, nil
	})
}

// PoolDialer returns the pool.Dialer the data plane gives its pool: each
// new socket is an upstream.Conn dialled with base and the credential
// creds holds at dial time (so a refreshed token is used for new sockets
// while existing heads keep theirs). The pool's Close on it is a hard
// close that releases the file descriptor at once.
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
		return &poolConn{c: c, token: cred.AccessToken}, nil
	})
}

// poolConn adapts *upstream.Conn to pool.Conn: Close is a hard close.
type poolConn struct {
	c     *upstream.Conn
	token credentials.Secret
}

func (p *poolConn) Send(ctx context.Context, frame []byte) error { return p.c.Send(ctx, frame) }
func (p *poolConn) Next(ctx context.Context) ([]byte, error)     { return p.c.Next(ctx) }
func (p *poolConn) Close(string) error                           { return p.c.CloseNow() }
func (p *poolConn) Token() credentials.Secret                    { return p.token }

// dialerConn adapts a Conn from a Config.Dialer to pool.Conn. Close sends
// a close frame with the reason (1001 when the client or the server went
// away, else 1000), or hard-closes a Conn that has CloseNow.
type dialerConn struct {
	c     Conn
	token credentials.Secret
}

func (d *dialerConn) Send(ctx context.Context, frame []byte) error { return d.c.Send(ctx, frame) }
func (d *dialerConn) Next(ctx context.Context) ([]byte, error)     { return d.c.Next(ctx) }
func (d *dialerConn) Token() credentials.Secret                    { return d.token }
func (d *dialerConn) Close(reason string) error {
	code := websocket.StatusNormalClosure
	if reason == reasonClientGone || reason == reasonShutdown {
		code = websocket.StatusGoingAway
	}
	return d.c.Close(code, reason)
}

// tokenConn is a pooled socket that knows which access token opened it.
type tokenConn interface{ Token() credentials.Secret }

// configDialer turns Config.Dialer into the private pool's dialer.
func configDialer(d Dialer, creds CredentialsSource) pool.Dialer {
	return pool.DialerFunc(func(ctx context.Context, _ pool.Partition) (pool.Conn, error) {
		cred, err := creds.Credential(ctx)
		if err != nil {
			return nil, fmt.Errorf("dial upstream: get credential: %w", err)
		}
		c, err := d.Dial(ctx, cred, nil)
		if err != nil {
			return nil, markRejected(err, cred.AccessToken)
		}
		return &dialerConn{c: c, token: cred.AccessToken}, nil
	})
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
