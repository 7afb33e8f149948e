package pool

import "testing"

// A socket whose response failed on it is kept without its conversation:
// the partition's next request that continues no head sends its full
// context on it, without admission or a dial, and once a response
// completes there it is a head like any other.
func TestReleasedSocketCarriesTheFullResend(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-kept")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	in := items(user("u1"), assistant("a1"), user("u2"))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionContinuation {
		t.Fatalf("decision %q, want continuation", l.Decision)
	}
	e.send(l, in)
	l.Release() // its response failed: response.failed server_error
	l.Release() // a second end is a no-op
	if e.conn(l.Conn).isClosed() {
		t.Fatal("the socket was closed; want it kept")
	}

	// The retry: no head to continue (the failed response is none), the
	// kept socket with the full context.
	k, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	e.send(k, in)
	f := e.lastFrame(k.Conn)
	if k.Decision != DecisionKeptSocket || !k.Reused || k.PreviousResponseID != "" || k.Delta != 0 || e.connID(k.Conn) != 1 {
		t.Fatalf("retry: decision %q reused %v previous %q delta %d conn %d; want kept_socket, reused, none, 0, conn 1",
			k.Decision, k.Reused, k.PreviousResponseID, k.Delta, e.connID(k.Conn))
	}
	if f.PreviousResponseID != "" || len(f.Input) != 3 {
		t.Fatalf("retry sent previous_response_id %q and %d items; want none and the full 3", f.PreviousResponseID, len(f.Input))
	}
	k.Complete("r2", items(assistant("a2")), Usage{})

	// The next turn continues the response that completed on it.
	next := items(user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3"))
	c, err := e.pool.Acquire(t.Context(), pt, next)
	if err != nil {
		t.Fatal(err)
	}
	if c.Decision != DecisionContinuation || c.PreviousResponseID != "r2" || c.Delta != 4 || e.connID(c.Conn) != 1 {
		t.Fatalf("next turn: decision %q previous %q delta %d conn %d; want continuation of r2 from 4 on conn 1",
			c.Decision, c.PreviousResponseID, c.Delta, e.connID(c.Conn))
	}
	c.Discard(DiscardSocketFailed)
	if d, a := e.dialer.dials(), e.admit.count(); d != 1 || a != 1 {
		t.Errorf("dials %d, admissions %d; want 1 and 1: the kept socket needs neither", d, a)
	}
	s := e.pool.Stats()
	if s.KeptSockets != 1 || s.KeptSocketReuses != 1 || s.KeptSocketsFailed != 0 || s.NewSockets != 1 {
		t.Errorf("stats kept=%d reuses=%d kept failed=%d new sockets=%d; want 1, 1, 0, 1",
			s.KeptSockets, s.KeptSocketReuses, s.KeptSocketsFailed, s.NewSockets)
	}
}

// A kept socket that fails on its next attempt is counted as a kept
// socket that failed; an unpartitioned socket is never kept.
func TestReleasedSocketThatFailsAndUnpartitioned(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-kept-fail")
	in := items(user("u1"))
	l, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	k, err := e.pool.Acquire(t.Context(), pt, in)
	if err != nil || k.Decision != DecisionKeptSocket {
		t.Fatalf("retry: %v, decision %v; want kept_socket", err, k)
	}
	kc := e.conn(k.Conn)
	k.Discard(DiscardSocketFailed)
	if !kc.isClosed() {
		t.Fatal("the failed kept socket is open")
	}
	if s := e.pool.Stats(); s.KeptSocketsFailed != 1 || s.Nursery+s.Established+s.InFlight != 0 {
		t.Errorf("stats kept failed=%d heads %d/%d/%d; want 1 and no head left", s.KeptSocketsFailed, s.Nursery, s.Established, s.InFlight)
	}

	u, err := e.pool.Acquire(t.Context(), Partition{Account: "acct"}, in)
	if err != nil {
		t.Fatal(err)
	}
	uc := e.conn(u.Conn)
	u.Release()
	if !uc.isClosed() {
		t.Fatal("an unpartitioned socket was kept")
	}
	if s := e.pool.Stats(); s.KeptSockets != 1 {
		t.Errorf("kept sockets %d, want 1: the unpartitioned one is not", s.KeptSockets)
	}
}
