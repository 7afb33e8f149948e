package gateway

import (
	"context"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/credentials"
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

// Dialer gives a turn its upstream socket. Today every turn dials a new
// socket and the gateway closes it when the turn ends; a connection pool
// (a later part) will implement Dialer to hand out retained sockets.
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
