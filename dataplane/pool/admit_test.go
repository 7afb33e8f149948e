package pool

import (
	"context"
	"errors"
	"testing"
)

// Every new socket asks the Admitter, the replacement of a socket the
// request continued included; only the replacement of a socket the
// request was itself admitted for (a new head) does not ask again.
func TestReplaceAsksAdmissionUnlessTheRequestWasAdmitted(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-replace-admit")
	in1 := items(user("u1"))
	// A new head: admitted for this request.
	l, err := e.pool.Acquire(t.Context(), pt, in1)
	if err != nil {
		t.Fatal(err)
	}
	if e.admit.count() != 1 {
		t.Fatalf("admissions = %d after a new head, want 1", e.admit.count())
	}
	r, err := l.Replace(t.Context(), ReplaceTransport)
	if err != nil {
		t.Fatal(err)
	}
	if e.admit.count() != 1 || e.dialer.dials() != 2 {
		t.Errorf("admissions %d, dials %d after replacing an admitted socket; want 1 and 2 (already admitted)", e.admit.count(), e.dialer.dials())
	}
	r.Complete("r1", items(assistant("a1")), Usage{})

	// A continuation on the held socket: the socket drops; its
	// replacement is a new socket for a request nobody admitted.
	in2 := items(user("u1"), assistant("a1"), user("u2"))
	l, err = e.pool.Acquire(t.Context(), pt, in2)
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionContinuation || e.admit.count() != 1 {
		t.Fatalf("lease %q with %d admissions, want a continuation that did not ask", l.Decision, e.admit.count())
	}
	r, err = l.Replace(t.Context(), ReplaceTransport)
	if err != nil {
		t.Fatal(err)
	}
	if e.admit.count() != 2 || e.dialer.dials() != 3 {
		t.Errorf("admissions %d, dials %d after replacing a held socket; want 2 and 3", e.admit.count(), e.dialer.dials())
	}
	r.Complete("r2", items(assistant("a2")), Usage{})

	// Refused: the lease ends, its head is dropped, the refusal reaches
	// the caller (the turn retries after the hint) and nothing is dialled.
	refused := errors.New("refused: retry after 4s")
	e.admit.hook = func(int) error { return refused }
	in3 := cat(in2, items(assistant("a2"), user("u3")))
	l, err = e.pool.Acquire(t.Context(), pt, in3)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Replace(t.Context(), ReplacePreviousResponseNotFound); !errors.Is(err, refused) {
		t.Fatalf("Replace with admission refused = %v, want the refusal", err)
	}
	if e.dialer.dials() != 3 {
		t.Errorf("dials = %d after a refused replacement, want 3", e.dialer.dials())
	}
	if s := e.pool.Stats(); s.Nursery+s.Established+s.InFlight != 0 {
		t.Errorf("heads after a refused replacement: %+v, want none", s)
	}
	if _, err := l.Replace(t.Context(), ReplaceTransport); !errors.Is(err, ErrLeaseDone) {
		t.Errorf("Replace after the refusal = %v, want ErrLeaseDone", err)
	}
	recs := e.records()
	if last := recs[len(recs)-1]; last["decision"] != DecisionReplacement || last["outcome"] != "admission_refused" {
		t.Errorf("last record %v, want a replacement refused admission", last)
	}
}

// A head that frees up while a request waits for admission ends the
// wait: the Admitter sees its context cancelled (and hands back what it
// reserved), and the request continues the head without a new socket.
func TestAdmissionWaitEndsWhenAHeadFrees(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-wait")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	in2 := items(user("u1"), assistant("a1"), user("u2"))
	busy, err := e.pool.Acquire(t.Context(), pt, in2)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	causes := make(chan error, 1)
	e.pool.cfg.Admitter = AdmitterFunc(func(ctx context.Context, account string) error {
		close(waiting)
		<-ctx.Done() // a granted wait that the freed head cuts short
		causes <- context.Cause(ctx)
		return ctx.Err()
	})
	in3 := items(user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3"))
	got := make(chan *Lease, 1)
	errc := make(chan error, 1)
	go func() {
		l, err := e.pool.Acquire(t.Context(), pt, in3)
		got <- l
		errc <- err
	}()
	<-waiting
	busy.Complete("r2", items(assistant("a2")), Usage{})
	l, err := <-got, <-errc
	if err != nil {
		t.Fatalf("Acquire = %v, want the freed head", err)
	}
	if cause := <-causes; !errors.Is(cause, errHeadFreed) {
		t.Errorf("the admission wait ended with %v, want errHeadFreed", cause)
	}
	if l.Decision != DecisionContinuation || e.connID(l.Conn) != 1 || l.PreviousResponseID != "r2" {
		t.Fatalf("lease %q conn %d prev %q, want a continuation on conn 1 after r2", l.Decision, e.connID(l.Conn), l.PreviousResponseID)
	}
	if s := e.pool.Stats(); e.dialer.dials() != 1 || s.Rematches != 1 || s.ReturnedAdmissions != 1 {
		t.Errorf("dials %d, rematches %d, returned admissions %d; want 1, 1, 1", e.dialer.dials(), s.Rematches, s.ReturnedAdmissions)
	}
	// The request holds no admission now: a replacement asks.
	e.pool.cfg.Admitter = e.admit
	before := e.admit.count()
	r, err := l.Replace(t.Context(), ReplaceTransport)
	if err != nil {
		t.Fatal(err)
	}
	if e.admit.count() != before+1 {
		t.Errorf("admissions %d after replacing the rematched head, want %d", e.admit.count(), before+1)
	}
	r.Discard("done")
}

// A head that frees up but does not match the waiting request leaves its
// wait alone.
func TestAdmissionWaitIgnoresAnotherConversation(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-other")
	other, err := e.pool.Acquire(t.Context(), pt, items(user("x1")))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	asked := make(chan struct{})
	ended := make(chan error, 1)
	e.pool.cfg.Admitter = AdmitterFunc(func(ctx context.Context, _ string) error {
		close(asked) // the request is registered as waiting by now
		select {
		case <-ctx.Done():
			ended <- context.Cause(ctx)
			return ctx.Err()
		case <-release:
			ended <- nil
			return nil
		}
	})
	done := make(chan error, 1)
	go func() {
		l, err := e.pool.Acquire(t.Context(), pt, items(user("y1")))
		if err == nil {
			l.Discard("done")
		}
		done <- err
	}()
	<-asked
	other.Complete("rx", items(assistant("ax")), Usage{})
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if cause := <-ended; cause != nil {
		t.Errorf("the wait ended with %v; want it to run to its end", cause)
	}
	if s := e.pool.Stats(); s.ReturnedAdmissions != 0 || e.dialer.dials() != 2 {
		t.Errorf("returned admissions %d, dials %d; want 0 and 2", s.ReturnedAdmissions, e.dialer.dials())
	}
}
