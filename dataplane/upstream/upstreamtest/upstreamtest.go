// Package upstreamtest is a Responses WebSocket peer for tests of the data
// plane's sockets: a server that accepts upgrades and hands each accepted
// socket to the test as a [Peer] it drives frame by frame.
//
//	srv := upstreamtest.NewServer(t) // loopback; NewPipe(t) for a synctest bubble
//	conn, err := upstream.Dial(ctx, upstream.DialOptions{URL: srv.URL, HTTPClient: srv.Client(), Credential: cred})
//	peer, err := srv.Accept(ctx)
//	frame, err := peer.Recv(ctx)      // what the client sent
//	err = peer.Send(ctx, event)       // what the client reads
//	peer.Close(websocket.StatusGoingAway, "bye") // or peer.Drop(): no close frame
//	<-peer.Gone()                     // the client side went away; peer.Err() says how
//	srv.Refuse(http.StatusForbidden, "7") // later upgrades are refused
//
// [NewServer] serves on a loopback httptest server: real TCP sockets.
// [NewPipe] carries each upgrade over an in-memory net.Pipe instead, through
// [Server.Client]; nothing then waits on the network, which is what a
// testing/synctest bubble needs. Every peer reads at all times (answering
// pings and close frames, as a backend does) unless the server was made
// deaf ([Server.Deafen]) when it accepted it. The server and every peer
// are closed at the test's cleanup.
package upstreamtest

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/coder/websocket"
)

// Path is the path of the Responses WebSocket in Server.URL.
const Path = "/backend-api/codex/responses"

// Server accepts upgrades on any path and makes each socket a Peer.
type Server struct {
	// URL is the Responses WebSocket URL to dial.
	URL string

	ts   *httptest.Server // nil for a pipe server
	pipe http.RoundTripper
	wg   sync.WaitGroup // peers' readers

	mu          sync.Mutex // guards the following fields
	peers       []*Peer
	accepted    int           // peers Accept has returned
	changed     chan struct{} // closed (and replaced) when peers grows
	upgrades    int
	refuse      int
	retryAfter  string
	deaf        bool
	ignorePings bool
	closed      bool
}

// NewServer starts a loopback server; it is closed at t's cleanup.
func NewServer(t testing.TB) *Server {
	t.Helper()
	s := &Server{changed: make(chan struct{})}
	s.ts = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = "ws" + strings.TrimPrefix(s.ts.URL, "http") + Path
	t.Cleanup(s.Close)
	return s
}

// NewPipe returns a server reached only through Client (or Transport),
// over in-memory pipes; it is closed at t's cleanup. Made inside a
// testing/synctest bubble, its sockets belong to the bubble.
func NewPipe(t testing.TB) *Server {
	t.Helper()
	s := &Server{URL: "ws://upstreamtest.invalid" + Path, changed: make(chan struct{})}
	s.pipe = pipeTransport{s}
	t.Cleanup(s.Close)
	return s
}

// Client is the HTTP client to dial a pipe server with (for
// upstream.DialOptions.HTTPClient); nil for a loopback server, which any
// client reaches.
func (s *Server) Client() *http.Client {
	if s.pipe == nil {
		return nil
	}
	return &http.Client{Transport: s.pipe}
}

// Transport is the pipe server's in-memory transport (nil for a loopback
// server), for a test that wraps it.
func (s *Server) Transport() http.RoundTripper { return s.pipe }

// Refuse makes the server answer every later upgrade with status and,
// when retryAfter is not empty, a Retry-After header; status 0 accepts
// again.
func (s *Server) Refuse(status int, retryAfter string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse, s.retryAfter = status, retryAfter
}

// Deafen makes the peers accepted from now on read nothing (no pong, no
// answer to a close frame) until their Listen; false reads at once again.
func (s *Server) Deafen(deaf bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deaf = deaf
}

// IgnorePings makes the peers accepted from now on read pings without
// answering them (Peer.Pings still counts them).
func (s *Server) IgnorePings(ignore bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ignorePings = ignore
}

// Upgrades is how many upgrade requests the server received, refused ones
// included.
func (s *Server) Upgrades() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.upgrades
}

// Peers returns every socket accepted so far, in order.
func (s *Server) Peers() []*Peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Peer(nil), s.peers...)
}

// Accept returns the next accepted socket Accept has not returned yet, in
// the order the server accepted them, waiting until ctx ends.
func (s *Server) Accept(ctx context.Context) (*Peer, error) {
	for {
		s.mu.Lock()
		if s.accepted < len(s.peers) {
			p := s.peers[s.accepted]
			s.accepted++
			s.mu.Unlock()
			return p, nil
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Close drops every peer, waits for their readers and stops the server.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	peers := s.peers
	s.mu.Unlock()
	for _, p := range peers {
		p.Drop()
	}
	s.wg.Wait()
	if s.ts != nil {
		s.ts.Close()
	}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.upgrades++
	status, retryAfter, deaf, ignore, closed := s.refuse, s.retryAfter, s.deaf, s.ignorePings, s.closed
	s.mu.Unlock()
	if closed {
		http.Error(w, "upstreamtest: server closed", http.StatusServiceUnavailable)
		return
	}
	if status != 0 {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		http.Error(w, "upstreamtest: upgrade refused", status)
		return
	}
	p := &Peer{Header: r.Header.Clone(), RemoteAddr: r.RemoteAddr, listen: make(chan struct{}),
		dropped: make(chan struct{}), gone: make(chan struct{}), arrived: make(chan struct{}, 1)}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{OnPingReceived: func(context.Context, []byte) bool {
		p.pings.Add(1)
		return !ignore
	}})
	if err != nil {
		return
	}
	ws.SetReadLimit(64 << 20)
	p.ws = ws
	if !deaf {
		p.Listen()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ws.CloseNow()
		return
	}
	s.peers = append(s.peers, p)
	close(s.changed)
	s.changed = make(chan struct{})
	s.wg.Go(p.readLoop)
	s.mu.Unlock()
}

// Peer is the server's side of one accepted socket.
type Peer struct {
	// Header is the upgrade request's headers.
	Header http.Header
	// RemoteAddr is the client's address (its socket's local address);
	// "" over a pipe.
	RemoteAddr string

	ws       *websocket.Conn
	listen   chan struct{} // closed by Listen
	listenMu sync.Once
	dropped  chan struct{} // closed by Drop
	dropMu   sync.Once
	gone     chan struct{} // closed when the read ended
	arrived  chan struct{} // size 1: a frame was queued
	pings    atomic.Int64

	mu     sync.Mutex // guards the following fields
	frames [][]byte   // read, not yet received
	err    error
}

// readLoop reads the client's frames (owned by the Server: Close waits for
// it).
func (p *Peer) readLoop() {
	defer close(p.gone)
	select {
	case <-p.listen:
	case <-p.dropped:
		p.mu.Lock()
		p.err = net.ErrClosed
		p.mu.Unlock()
		return
	}
	for {
		_, data, err := p.ws.Read(context.Background())
		p.mu.Lock()
		if err != nil {
			p.err = err
			p.mu.Unlock()
			return
		}
		p.frames = append(p.frames, data)
		p.mu.Unlock()
		select {
		case p.arrived <- struct{}{}:
		default:
		}
	}
}

// Listen makes a deaf peer start reading.
func (p *Peer) Listen() { p.listenMu.Do(func() { close(p.listen) }) }

// Recv returns the next frame the client sent, waiting until ctx ends; once
// the client side went away and every frame was received it returns Err.
func (p *Peer) Recv(ctx context.Context) ([]byte, error) {
	for {
		p.mu.Lock()
		if len(p.frames) > 0 {
			f := p.frames[0]
			p.frames = p.frames[1:]
			p.mu.Unlock()
			return f, nil
		}
		p.mu.Unlock()
		select {
		case <-p.arrived:
		case <-p.gone:
			p.mu.Lock()
			n, err := len(p.frames), p.err
			p.mu.Unlock()
			if n == 0 {
				return nil, err
			}
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// Send writes one text frame to the client.
func (p *Peer) Send(ctx context.Context, frame []byte) error {
	return p.ws.Write(ctx, websocket.MessageText, frame)
}

// SendBinary writes one binary frame, which the protocol never uses.
func (p *Peer) SendBinary(ctx context.Context, data []byte) error {
	return p.ws.Write(ctx, websocket.MessageBinary, data)
}

// Close closes the socket with a close frame, waiting (at most 5 s, as
// coder/websocket does) for the client's answer.
func (p *Peer) Close(code websocket.StatusCode, reason string) error {
	return p.ws.Close(code, reason)
}

// Drop closes the socket without a close frame, as a reset or a dead peer
// host looks to the client.
func (p *Peer) Drop() {
	p.dropMu.Do(func() { close(p.dropped) })
	_ = p.ws.CloseNow()
}

// Gone is closed when the peer's read ended: the client closed the socket
// (or Drop or Close did).
func (p *Peer) Gone() <-chan struct{} { return p.gone }

// Err says how the socket ended once Gone is closed: the client's close
// frame (websocket.CloseStatus returns its code and the error its reason),
// or a connection that closed without one (CloseStatus -1).
func (p *Peer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Pings is how many pings the peer read.
func (p *Peer) Pings() int { return int(p.pings.Load()) }

// pipeTransport runs the server's handler for each request over a new
// in-memory pipe.
type pipeTransport struct{ s *Server }

func (t pipeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	client, server := net.Pipe()
	rec := httptest.NewRecorder()
	r = r.Clone(r.Context())
	r.RemoteAddr = ""
	t.s.serve(hijacker{rec, server}, r)
	resp := rec.Result()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body = client
		return resp, nil
	}
	client.Close()
	server.Close()
	return resp, nil
}

// hijacker is the ResponseWriter of a pipe upgrade: Hijack hands the
// handler the server's end of the pipe.
type hijacker struct {
	*httptest.ResponseRecorder
	conn net.Conn
}

func (h hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return h.conn, bufio.NewReadWriter(bufio.NewReader(h.conn), bufio.NewWriter(h.conn)), nil
}
