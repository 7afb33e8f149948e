package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Pinger is implemented by a [Conn] that can check that its peer still
// answers: Ping sends a ping and returns nil when the pong arrives, or an
// error when ctx ends first. The pong is read by the pool's idle reader (a
// Next in progress), as coder/websocket requires. The pool pings only idle
// heads, and only when their Conn implements Pinger.
type Pinger interface {
	Ping(ctx context.Context) error
}

// closeGrace bounds how long a Conn's own close handshake may keep the
// idle reader's read in progress. The reader holds the socket's read lock,
// so a handshake that waits for the peer's close frame relies on it to
// read that frame; when the peer does not answer, ending the reader's
// context after closeGrace releases the socket (coder/websocket closes a
// socket whose read context ends).
const closeGrace = time.Second

// readResult is one Next's outcome.
type readResult struct {
	data []byte
	err  error
}

// sock is a head's socket: the Conn the Dialer returned, plus the reader
// and keepalive that watch it while the head is idle. A head's Lease.Conn
// is its sock.
//
// A socket needs a reader at all times: coder/websocket answers pings and
// sees close frames only inside a read, and a read cannot be interrupted
// without closing the socket. So when a request takes an idle head, the
// reader blocked in Next is handed over rather than stopped: the request's
// first Next waits for that read's result, which is the request's own first
// frame (or the error that ended the socket), so nothing is lost and there
// is never a second read in flight. From then on the request reads on its
// own goroutine. When the head is idle again the pool starts a new reader,
// or keeps the handed-over one if it is still waiting.
//
// Which of the two happens to a frame is decided under Pool.mu: a read that
// returns while the head is idle drops the head, one that returns after a
// request took it goes to the request.
type sock struct {
	Conn                  // the dialled socket; Send passes through
	p     *Pool           // immutable
	h     *head           // the head the socket serves; immutable
	res   chan readResult // size 1: the handed-over read's result
	owed  atomic.Bool     // a request's Next must take res before reading itself
	pings sync.WaitGroup  // keepalive callbacks armed or running

	// guarded by p.mu
	reading    bool               // the reader goroutine is running
	readerDone chan struct{}      // closed when the latest reader returns
	stopRead   context.CancelFunc // ends the latest reader's read (which closes the socket)
	closed     bool               // Close was called or the head was dropped
	ping       *time.Timer
	pingSeq    uint64 // bumped on every arm and disarm; a stale callback does nothing
}

func (p *Pool) newSock(h *head, c Conn) *sock {
	return &sock{Conn: c, p: p, h: h, res: make(chan readResult, 1)}
}

// Next reads one frame. Right after the request took the head it returns
// the handed-over reader's result; then it reads the socket directly. If
// ctx ends while it waits for that result, the socket is closed, as a
// Next whose ctx ends does.
func (s *sock) Next(ctx context.Context) ([]byte, error) {
	if !s.owed.Load() {
		return s.Conn.Next(ctx)
	}
	select {
	case r := <-s.res:
		s.owed.Store(false)
		return r.data, r.err
	case <-ctx.Done():
		s.p.mu.Lock()
		stop, done := s.stopRead, s.readerDone
		s.p.mu.Unlock()
		stop() // ends the read, which closes the socket
		<-done // the reader's result, the socket's end, stays in res
		return nil, fmt.Errorf("read socket: %w", ctx.Err())
	}
}

// Close closes the socket and waits for its reader and keepalive.
func (s *sock) Close(reason string) error {
	p := s.p
	p.mu.Lock()
	s.closed = true
	s.disarmLocked()
	done, stop := s.readerDone, s.stopRead
	p.mu.Unlock()
	if stop == nil {
		err := s.Conn.Close(reason)
		s.pings.Wait()
		return err
	}
	grace := time.AfterFunc(closeGrace, stop)
	err := s.Conn.Close(reason)
	grace.Stop()
	stop()
	<-done
	s.pings.Wait()
	return err
}

// handOverLocked is called when a request takes s's idle head: the
// keepalive stops and a reader still in Next now reads for the request.
func (s *sock) handOverLocked() {
	s.disarmLocked()
	if s.reading {
		s.owed.Store(true)
	}
}

// watchLocked starts watching s, whose head just became idle: a reader,
// unless the one handed to the last request is still in Next, and the
// keepalive. A result the request never took is given to the new reader
// as if it had just read it: it drops the head, or goes to a request that
// took the head first.
func (s *sock) watchLocked() {
	if s.closed {
		return
	}
	if s.reading {
		s.owed.Store(false)
	} else {
		var pending *readResult
		if s.owed.Load() {
			select {
			case r := <-s.res: // the handed-over reader is done; nobody took its result
				pending = &r
			default:
			}
			s.owed.Store(false)
		}
		ctx, cancel := context.WithCancel(context.Background()) // the socket's lifetime, no request's
		done := make(chan struct{})
		s.reading, s.readerDone, s.stopRead = true, done, cancel
		go s.idleRead(ctx, cancel, done, pending)
	}
	s.armLocked()
}

// idleRead is the reader goroutine (owned by s: Close waits for it). It
// reads once, then gives the result to the request that took the head
// meanwhile, or drops the head, whose socket then has nothing to say.
func (s *sock) idleRead(ctx context.Context, cancel context.CancelFunc, done chan struct{}, pending *readResult) {
	defer close(done)
	defer cancel()
	var r readResult
	if pending != nil {
		r = *pending
	} else {
		r.data, r.err = s.Conn.Next(ctx)
	}
	p := s.p
	p.mu.Lock()
	s.reading = false
	switch {
	case s.owed.Load():
		// A request holds the head, and maybe waits in Next: even on a
		// socket being closed, the result (then an error) is its answer.
		s.res <- r // empty: one reader at a time, and each result is taken or drained before the next read
		p.mu.Unlock()
	case s.closed:
		// Its closer waits for this goroutine.
		p.mu.Unlock()
	default:
		l := classifyIdle(r)
		rec, ok := p.dropLocked(s, l)
		p.mu.Unlock()
		if ok {
			p.finishDrop(s, rec, func() { s.pings.Wait() })
		}
	}
}

// armLocked schedules the next keepalive ping of idle s.
func (s *sock) armLocked() {
	p := s.p
	pinger, ok := s.Conn.(Pinger)
	if !ok || p.cfg.KeepaliveInterval <= 0 || s.closed {
		return
	}
	s.pingSeq++
	seq := s.pingSeq
	s.pings.Add(1)
	s.ping = time.AfterFunc(p.cfg.KeepaliveInterval, func() { s.keepalive(pinger, seq) })
}

// disarmLocked cancels the scheduled keepalive; one already running finds
// its arming stale and does nothing.
func (s *sock) disarmLocked() {
	s.pingSeq++
	if s.ping != nil && s.ping.Stop() {
		s.pings.Done()
	}
	s.ping = nil
}

// keepalive is a timer callback (owned by s: Close waits for it). It pings
// the idle socket; on a pong it schedules the next ping, without one it
// drops the head.
func (s *sock) keepalive(pinger Pinger, seq uint64) {
	defer s.pings.Done()
	p := s.p
	p.mu.Lock()
	stale := seq != s.pingSeq
	p.mu.Unlock()
	if stale {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.KeepaliveTimeout) // not a request's
	err := pinger.Ping(ctx)
	cancel()
	p.mu.Lock()
	if seq != s.pingSeq {
		// A request took the head, or it was closed: not ours to judge.
		p.mu.Unlock()
		return
	}
	if err == nil {
		s.armLocked()
		p.mu.Unlock()
		return
	}
	l := lostHow{reason: EvictConnectionLost}
	if errors.Is(err, context.DeadlineExceeded) {
		l.reason = EvictKeepaliveTimeout
	}
	rec, ok := p.dropLocked(s, l)
	done := s.readerDone
	p.mu.Unlock()
	if ok {
		p.finishDrop(s, rec, func() {
			if done != nil {
				<-done
			}
		})
	}
}

// lostHow is why an idle head is dropped.
type lostHow struct {
	reason    string // EvictPeerClosed, EvictConnectionLost, EvictUnexpectedFrame or EvictKeepaliveTimeout
	closeCode int    // the peer's close code (EvictPeerClosed)
	frameType string // the unexpected frame's "type", bounded (EvictUnexpectedFrame)
}

// classifyIdle says what a read that returned while the head was idle means.
func classifyIdle(r readResult) lostHow {
	if r.err == nil {
		var ev struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(r.data, &ev)
		return lostHow{reason: EvictUnexpectedFrame, frameType: boundedID(ev.Type)}
	}
	if code := websocket.CloseStatus(r.err); code != -1 {
		return lostHow{reason: EvictPeerClosed, closeCode: int(code)}
	}
	return lostHow{reason: EvictConnectionLost}
}

// dropLocked unregisters s's head if it is still idle and served by s,
// and marks s closed. The caller then calls finishDrop.
func (p *Pool) dropLocked(s *sock, l lostHow) (*lostRecord, bool) {
	h := s.h
	if s.closed || h.removed || h.busy || h.conn != s {
		return nil, false
	}
	now := p.now()
	p.removeLocked(h)
	p.countEvictionLocked(l.reason, h, nil)
	s.closed = true
	s.disarmLocked()
	p.drops.Add(1)
	return &lostRecord{
		Event:                      "ws_head_lost",
		Time:                       now.UTC(),
		Reason:                     l.reason,
		CloseCode:                  l.closeCode,
		FrameType:                  l.frameType,
		ConnectionID:               h.id,
		PartitionHash:              h.part.hash,
		Generation:                 h.gen,
		IdleMs:                     now.Sub(h.lastUsed).Milliseconds(),
		PhysicalAgeMs:              now.Sub(h.created).Milliseconds(),
		NurseryConnectionCount:     p.nNursery,
		EstablishedConnectionCount: p.nEstablish,
	}, true
}

// finishDrop closes a dropped head's socket, waits for the other watcher
// goroutine of s (wait), and reports the drop. Pool.Close waits for it.
func (p *Pool) finishDrop(s *sock, rec *lostRecord, wait func()) {
	defer p.drops.Done()
	_ = s.Conn.Close("idle socket lost: " + rec.Reason)
	wait()
	p.cfg.Logger.Debug("idle head dropped", "reason", rec.Reason, "connection_id", rec.ConnectionID,
		"close_code", rec.CloseCode, "frame_type", rec.FrameType, "idle_ms", rec.IdleMs)
	if p.cfg.Diagnostics != nil {
		p.writeJSON(rec)
	}
}
