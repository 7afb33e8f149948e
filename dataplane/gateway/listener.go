package gateway

import (
	"bytes"
	"log/slog"
	"net"
	"strconv"
)

// goHeaderTooLarge is what net/http writes, straight to the connection
// and before any handler runs, when a request's header block exceeds
// http.Server.MaxHeaderBytes (net/http's server.go, errTooLarge). The
// listener's connections replace it with an Anthropic error body;
// TestHeaderTooLarge fails if a Go release changes these bytes.
var goHeaderTooLarge = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large")

// Listener wraps the API listener (served with http.Server.MaxHeaderBytes
// set to MaxHeaderBytes): a request whose headers are too large is
// answered 431 with an Anthropic error body instead of net/http's plain
// text, counted in the request metric and logged.
func (s *Server) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, s: s} }

type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, s: l.s}, nil
}

type conn struct {
	net.Conn
	s *Server
}

func (c *conn) Write(b []byte) (int, error) {
	if !bytes.Equal(b, goHeaderTooLarge) {
		return c.Conn.Write(b)
	}
	msg := "Request headers exceed the " + strconv.Itoa(MaxHeaderBytes) + " byte limit; send smaller headers"
	var body bytes.Buffer
	writeErrorBody(&body, "request_too_large", msg)
	resp := "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(body.Len()) + "\r\nConnection: close\r\n\r\n" + body.String()
	c.s.metrics.requests.WithLabelValues("431").Inc()
	c.s.cfg.Logger.Info("request", slog.Int(keyStatus, 431), slog.String("remote", c.RemoteAddr().String()),
		slog.String(keyErr, "request headers too large"))
	if _, err := c.Conn.Write([]byte(resp)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets net/http half-close the connection after the 431, as it
// does on a bare TCP connection, so the client reads the answer.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
