package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/coder/websocket"
)

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
