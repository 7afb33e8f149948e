package pool

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/dataplane/upstream"
)

func TestIdleHeadDroppedWhenItsSocketSpeaks(t *testing.T) {
	tests := []struct {
		name      string
		peer      peerAct
		reason    string
		closeCode float64
		frameType string
	}{
		{"close frame", closeWith(websocket.StatusGoingAway, "idle"), EvictPeerClosed, 1001, ""},
		{"reset without a close frame", dropConn(), EvictConnectionLost, 0, ""},
		{"unexpected data frame", sendFrame(`{"type":"error","error":{"code":"idle_timeout"}}`),
			EvictUnexpectedFrame, 0, "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			e := newEnv(t, func(c *Config) { c.Registerer = reg })
			pt := part("speak")
			in := items(user("#1"))
			e.turn(pt, in, "r1", items(assistant("a1")))
			conn := e.dialer.conns[0]

			push(t, conn, tt.peer)
			lost := e.waitRecords("ws_head_lost", 1)[0]
			if lost["reason"] != tt.reason || lost["connectionId"] != 1.0 || lost["generation"] != GenerationNursery ||
				lost["partitionHash"] != pt.hash() {
				t.Errorf("ws_head_lost = %v, want reason %s for connection 1, nursery, partition %s", lost, tt.reason, pt.hash())
			}
			if got, _ := lost["closeCode"].(float64); got != tt.closeCode {
				t.Errorf("closeCode = %v, want %v", got, tt.closeCode)
			}
			if got, _ := lost["frameType"].(string); got != tt.frameType {
				t.Errorf("frameType = %q, want %q", got, tt.frameType)
			}
			if !conn.isClosed() {
				t.Error("the lost head's socket is still open; want it closed at once")
			}
			s := e.pool.Stats()
			if s.Evictions[tt.reason] != 1 || s.Nursery+s.Established != 0 {
				t.Errorf("evictions %v, heads %d; want one %s and no head", s.Evictions, s.Nursery+s.Established, tt.reason)
			}
			if v := gather(t, reg)[`clodex_dataplane_pool_evictions_total{reason="`+tt.reason+`"}`]; v != 1 {
				t.Errorf("evictions_total{reason=%q} = %v, want 1", tt.reason, v)
			}

			// The next turn dials once, as a new head, and nothing fails.
			l, err := e.pool.Acquire(t.Context(), pt, cat(in, items(assistant("a1"), user("#2"))))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Discard("test over")
			if l.Decision != DecisionNewPartition || e.dialer.dials() != 2 || l.Delta != 0 {
				t.Errorf("next turn: %s on %d dials, delta %d; want new_partition_head, 2 dials, full context", l.Decision, e.dialer.dials(), l.Delta)
			}
		})
	}
}

func TestHandOverGivesTheIdleReadersFrameToTheRequest(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("handover")
	in := items(user("#1"))
	e.turn(pt, in, "r1", items(assistant("a1")))
	conn := e.dialer.conns[0]
	in = cat(in, items(assistant("a1"), user("#2")))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil || l.Decision != DecisionContinuation {
		t.Fatalf("Acquire = %v, %v; want a continuation", l, err)
	}
	e.send(l, in)
	// The response's first frame arrives before the request reads: the
	// socket's reader, which watched the idle head, takes it and must hand
	// it to the request.
	push(t, conn, sendFrame(`{"type":"response.created","n":1}`))
	got, err := l.Conn.Next(t.Context())
	if err != nil || string(got) != `{"type":"response.created","n":1}` {
		t.Fatalf("first Next = %q, %v; want the frame the idle reader took", got, err)
	}
	// Later frames are read by the request itself.
	pushed := pushAsync(t, conn, sendFrame(`{"type":"response.completed","n":2}`))
	if got, err := l.Conn.Next(t.Context()); err != nil || string(got) != `{"type":"response.completed","n":2}` {
		t.Fatalf("second Next = %q, %v; want the second frame", got, err)
	}
	if err := <-pushed; err != nil {
		t.Fatal(err)
	}
	l.Complete("r2", items(assistant("a2")), Usage{})
	if s := e.pool.Stats(); len(s.Evictions) != 0 || s.Established != 1 {
		t.Fatalf("evictions %v, established %d; want none and the head kept", s.Evictions, s.Established)
	}

	// Idle again: a new reader watches it.
	push(t, conn, closeWith(websocket.StatusNormalClosure, ""))
	if lost := e.waitRecords("ws_head_lost", 1)[0]; lost["reason"] != EvictPeerClosed {
		t.Errorf("after the second turn: %v, want the head dropped for peer_closed", lost)
	}
}

func TestHandOverWhenTheRequestReadsFirst(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("reads-first")
	in := items(user("#1"))
	e.turn(pt, in, "r1", items(assistant("a1")))
	conn := e.dialer.conns[0]
	in = cat(in, items(assistant("a1"), user("#2")))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		b   []byte
		err error
	}
	got := make(chan res, 1)
	go func() {
		b, err := l.Conn.Next(t.Context())
		got <- res{b, err}
	}()
	push(t, conn, sendFrame(`{"type":"response.created"}`))
	if r := <-got; r.err != nil || string(r.b) != `{"type":"response.created"}` {
		t.Fatalf("Next = %q, %v; want the frame", r.b, r.err)
	}
	l.Complete("r2", nil, Usage{})
}

func TestHandOverCancelledWhileWaitingClosesTheSocket(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("cancel")
	in := items(user("#1"))
	e.turn(pt, in, "r1", items(assistant("a1")))
	conn := e.dialer.conns[0]
	l, err := e.pool.Acquire(t.Context(), pt, cat(in, items(assistant("a1"), user("#2"))))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := l.Conn.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Next with an ended context = %v, want context.Canceled", err)
	}
	if !conn.isClosed() {
		t.Error("socket open after its read's context ended; want it closed")
	}
	l.Discard("client cancelled")
	if s := e.pool.Stats(); len(s.Evictions) != 0 {
		t.Errorf("evictions %v; a socket closed under a request is not an idle loss", s.Evictions)
	}
}

// TestHandOverRace races a frame from the peer against a request taking
// the idle head. Either the frame arrived while the head was idle (the
// head is dropped and the request gets a new socket) or after the request
// took it (the request reads it first). It is never lost.
func TestHandOverRace(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("race")
	hist := items(user("#0"))
	e.turn(pt, hist, "r0", items(assistant("a0")))
	hist = cat(hist, items(assistant("a0")))
	dropped, handed := 0, 0
	for i := 1; i <= 200; i++ {
		conn := e.dialer.conns[len(e.dialer.conns)-1]
		frame := fmt.Sprintf(`{"type":"response.created","i":%d}`, i)
		pushed := pushAsync(t, conn, sendFrame(frame))
		hist = cat(hist, items(user(fmt.Sprintf("#%d", i))))
		l, err := e.pool.Acquire(t.Context(), pt, hist)
		if err != nil {
			t.Fatal(err)
		}
		if l.Decision == DecisionContinuation {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			got, err := l.Conn.Next(ctx)
			cancel()
			if err != nil || string(got) != frame {
				t.Fatalf("iteration %d: continuation read %q, %v; want the raced frame %s", i, got, err, frame)
			}
			handed++
		} else {
			if err := <-pushed; err != nil {
				t.Fatal(err)
			}
			pushed = nil
			// The reader dropped the head under the pool's lock; it closes
			// the socket, then reports, after unlocking.
			e.waitRecords("ws_head_lost", dropped+1)
			if !conn.isClosed() {
				t.Fatalf("iteration %d: %s, but the old socket is open; want it dropped for its idle frame", i, l.Decision)
			}
			dropped++
		}
		if pushed != nil {
			if err := <-pushed; err != nil {
				t.Fatal(err)
			}
		}
		out := assistant(fmt.Sprintf("a%d", i))
		l.Complete(fmt.Sprintf("r%d", i), items(out), Usage{})
		hist = cat(hist, items(out))
	}
	if s := e.pool.Stats(); s.Evictions[EvictUnexpectedFrame] != uint64(dropped) {
		t.Errorf("unexpected_frame evictions = %d, want %d (the dropped iterations)", s.Evictions[EvictUnexpectedFrame], dropped)
	}
	t.Logf("200 races: %d frames handed to the request, %d heads dropped while idle", handed, dropped)
}

// The keepalive runs over in-memory sockets in a synctest bubble: the
// pings are real WebSocket pings, counted by the peer as it reads them.
func TestKeepalive(t *testing.T) {
	t.Run("an answering peer keeps the head", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newPipeEnv(t, nil)
			pt := part("pong")
			in := items(user("#1"))
			e.turn(pt, in, "r1", items(assistant("a1")))
			time.Sleep(10*DefaultKeepaliveInterval + DefaultKeepaliveInterval/2)
			synctest.Wait()
			if n := e.dialer.conns[0].peerSide(t).Pings(); n != 10 {
				t.Errorf("pings in 10.5 idle intervals = %d, want 10", n)
			}
			l := e.turn(pt, cat(in, items(assistant("a1"), user("#2"))), "r2", nil)
			if l.Decision != DecisionContinuation {
				t.Errorf("after 10 pings: %s, want a continuation", l.Decision)
			}
		})
	})
	t.Run("a silent peer is dropped after interval + timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newPipeEnv(t, nil)
			e.srv.IgnorePings(true)
			e.turn(part("silent"), items(user("#1")), "r1", items(assistant("a1")))
			time.Sleep(DefaultKeepaliveInterval + DefaultKeepaliveTimeout - time.Second)
			synctest.Wait()
			if s := e.pool.Stats(); s.Nursery != 1 {
				t.Fatalf("head gone %v before the pong's deadline; want it kept", DefaultKeepaliveInterval+DefaultKeepaliveTimeout-time.Second)
			}
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if lost := e.waitRecords("ws_head_lost", 1)[0]; lost["reason"] != EvictKeepaliveTimeout {
				t.Errorf("ws_head_lost = %v, want keepalive_timeout", lost)
			}
			if !e.dialer.conns[0].isClosed() || e.pool.Stats().Nursery != 0 {
				t.Error("silent head kept or its socket open; want it dropped and closed")
			}
		})
	})
	t.Run("a broken connection is a lost connection", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newPipeEnv(t, nil)
			e.turn(part("broken"), items(user("#1")), "r1", items(assistant("a1")))
			e.dialer.conns[0].peerSide(t).Drop()
			time.Sleep(DefaultKeepaliveInterval + time.Second)
			synctest.Wait()
			if lost := e.waitRecords("ws_head_lost", 1)[0]; lost["reason"] != EvictConnectionLost {
				t.Errorf("ws_head_lost = %v, want connection_lost", lost)
			}
		})
	})
	t.Run("a ping that times out after a request took the head is ignored", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newPipeEnv(t, nil)
			e.srv.IgnorePings(true)
			pt := part("taken")
			in := items(user("#1"))
			e.turn(pt, in, "r1", items(assistant("a1")))
			peer := e.dialer.conns[0].peerSide(t)
			time.Sleep(DefaultKeepaliveInterval + time.Second) // the ping is waiting
			synctest.Wait()
			in = cat(in, items(assistant("a1"), user("#2")))
			l, err := e.pool.Acquire(t.Context(), pt, in)
			if err != nil || l.Decision != DecisionContinuation {
				t.Fatalf("Acquire = %v, %v; want a continuation", l, err)
			}
			time.Sleep(DefaultKeepaliveTimeout) // its deadline passes mid-turn
			synctest.Wait()
			if s := e.pool.Stats(); len(s.Evictions) != 0 || s.InFlight != 1 {
				t.Fatalf("evictions %v in flight %d; a ping that failed while a request holds the head must not drop it", s.Evictions, s.InFlight)
			}
			l.Complete("r2", nil, Usage{})
			if n := peer.Pings(); n != 1 {
				t.Errorf("pings = %d, want 1", n)
			}
			// Idle again: the next ping comes one interval later.
			time.Sleep(DefaultKeepaliveInterval - time.Second)
			synctest.Wait()
			if n := peer.Pings(); n != 1 {
				t.Errorf("pings before the next interval = %d, want 1", n)
			}
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if n := peer.Pings(); n != 2 {
				t.Errorf("pings after the next interval = %d, want 2", n)
			}
		})
	})
	t.Run("a negative interval disables pings", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newPipeEnv(t, func(c *Config) { c.KeepaliveInterval = -1 })
			e.turn(part("off"), items(user("#1")), "r1", items(assistant("a1")))
			time.Sleep(time.Hour)
			synctest.Wait()
			if n := e.dialer.conns[0].peerSide(t).Pings(); n != 0 {
				t.Errorf("pings with KeepaliveInterval < 0 = %d, want 0", n)
			}
		})
	})
}

// Pool.Close sends each idle socket a 1001 close frame; a peer that never
// answers holds it for the close handshake's bound only.
func TestPoolCloseBoundsACloseHandshakeThePeerNeverAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newPipeEnv(t, nil)
		e.srv.Deafen(true)
		in := items(user("#1"))
		l, err := e.pool.Acquire(t.Context(), part("bye"), in)
		if err != nil {
			t.Fatal(err)
		}
		l.Complete("r1", nil, Usage{})
		start := time.Now()
		if err := e.pool.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if d := time.Since(start); d != upstream.CloseTimeout {
			t.Errorf("Close took %v with a peer that never answers; want the %v bound", d, upstream.CloseTimeout)
		}
		if !e.dialer.conns[0].isClosed() {
			t.Error("Close left the idle socket open")
		}
	})
}

// Pool.Close tells an answering peer why with the close handshake.
func TestPoolCloseSaysGoingAway(t *testing.T) {
	e := newEnv(t, nil)
	e.turn(part("bye"), items(user("#1")), "r1", nil)
	peer := e.dialer.conns[0].peerSide(t)
	if err := e.pool.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-peer.Gone():
	case <-time.After(30 * time.Second):
		t.Fatal("the peer did not see the socket close within 30 s")
	}
	var ce websocket.CloseError
	if err := peer.Err(); !errors.As(err, &ce) || ce.Code != websocket.StatusGoingAway || ce.Reason != ReasonPoolClosed {
		t.Errorf("peer saw %v, want 1001 %q", err, ReasonPoolClosed)
	}
}

func TestDiscardEndsANextWaitingForTheHandedOverRead(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("discard-wait")
	in := items(user("#1"))
	e.turn(pt, in, "r1", items(assistant("a1")))
	l, err := e.pool.Acquire(t.Context(), pt, cat(in, items(assistant("a1"), user("#2"))))
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := l.Conn.Next(t.Context()) // no deadline: only the close can end it
		errc <- err
	}()
	l.Discard("downstream went away")
	select {
	case err := <-errc:
		if err == nil {
			t.Error("Next on a discarded lease returned a frame; want the socket's end")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Next still waiting 30 s after the lease's socket was closed")
	}
}
