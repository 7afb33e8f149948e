package control_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// outage stops srv and admits n requests for key locally, one every 2 s
// of the fake clock (the local share, 60/min burst 10 at one live agent,
// starts empty: each request waits 1 s, then the next finds a token).
func outage(t *testing.T, c *control.Client, clk *fakeClock, key string, n int) {
	t.Helper()
	for range n {
		clk.Advance(2 * sec)
		if err := c.Admit(t.Context(), key); err != nil {
			t.Fatalf("local Admit = %v, want nil", err)
		}
	}
	if got := c.Mode(); got != control.ModeLocal {
		t.Fatalf("Mode() during the outage = %q, want %q", got, control.ModeLocal)
	}
	clk.TakeSleeps()
}

// The grants a data plane made locally while the control plane was down
// are debited from the account's bucket by the probe that finds it back,
// before that probe's own admission: the restarted control plane's full
// bucket of 10 ends at 10 - 6 - 1 = 3.
func TestProbeHandsGrantsOver(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: "host-1-abcd"}, clk, &notes)
	runSteps(t, c, clk, []step{{key: keyA}})
	srv.Stop()
	outage(t, c, clk, keyA, 6)

	srv.Restart() // buckets start full: 10 tokens
	waitReady(t, c)
	clk.Advance(2 * sec) // past the probe backoff
	runSteps(t, c, clk, []step{{key: keyA}})
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() after the probe = %q, want %q", got, control.ModeCentral)
	}
	if got := tokens(t, admin, keyA); got != 3 {
		t.Errorf("tokens after the hand-over and one central admission = %v, want 3 (10 - 6 handed over - 1)", got)
	}
	// The first failed probe of the outage left a report of the grant
	// made before it, sent again now, and the five after it follow in one
	// more: each grant reaches the control plane once.
	st := c.Stats()
	if st.HandOvers != 2 || st.HandedOver != 6 || st.Central.Admits != 2 {
		t.Errorf("Stats() = %+v, want 6 grants handed over in 2 reports and 2 central admits", st)
	}
}

// A report the control plane does not confirm (a probe found it still
// down) is kept and sent again with the same id; grants made meanwhile
// follow in a report of their own. The control plane debits each grant
// once, and Recover (the agent stream is back) hands them over without
// waiting for a request.
func TestUnconfirmedReportIsSentAgain(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &notes)
	runSteps(t, c, clk, []step{{key: keyA}})
	srv.Stop()
	outage(t, c, clk, keyA, 3)
	// Probes while it is down fail: the report stays pending.
	outage(t, c, clk, keyA, 2)
	if st := c.Stats(); st.Probes == 0 || st.HandOvers != 0 {
		t.Fatalf("Stats() = %+v, want failed probes and no hand-over yet", st)
	}

	srv.Restart()
	waitReady(t, c)
	if err := c.Recover(t.Context()); err != nil {
		t.Fatalf("Recover = %v, want nil", err)
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() after Recover = %q, want %q", got, control.ModeCentral)
	}
	if got := tokens(t, admin, keyA); got != 5 {
		t.Errorf("tokens after the hand-over = %v, want 5 (10 - 5)", got)
	}
	// The first failed probe's report (one grant) is sent again, then one
	// report of the four made after it: two reports, five grants.
	if st := c.Stats(); st.HandedOver != 5 || st.HandOvers != 2 {
		t.Errorf("Stats() = %+v, want 5 grants handed over in 2 reports", st)
	}
	msgs := notes.Msgs()
	if len(msgs) != 2 || !strings.Contains(msgs[1], "reachable again") {
		t.Errorf("notices = %q, want the unreachable notice and one back notice", msgs)
	}
	// Nothing is left: a second Recover (central) reports nothing.
	if err := c.Recover(t.Context()); err != nil || c.Stats().HandedOver != 5 {
		t.Errorf("second Recover = %v with %d handed over, want nil and 5", err, c.Stats().HandedOver)
	}
}

// A local reservation refunded before it was reported is not handed over.
func TestRefundedLocalGrantIsNotHandedOver(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &notes)
	runSteps(t, c, clk, []step{{key: keyA}})
	srv.Stop()
	outage(t, c, clk, keyA, 2)

	clk.SetBlocking(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Admit(ctx, keyA) }()
	<-clk.Blocked // a local wait, debited
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("cancelled local Admit = %v, want context.Canceled", err)
	}
	clk.SetBlocking(false)

	srv.Restart()
	waitReady(t, c)
	if err := c.Recover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := tokens(t, admin, keyA); got != 8 {
		t.Errorf("tokens after the hand-over = %v, want 8 (the refunded grant is not reported)", got)
	}
}

// oldControlPlane is an AdmissionService from before the hand-over: its
// ReportGrants is Unimplemented.
type oldControlPlane struct {
	controlplanev1.UnimplementedAdmissionServiceServer
	mu     sync.Mutex
	admits int
}

func (o *oldControlPlane) Admit(context.Context, *controlplanev1.AdmitRequest) (*controlplanev1.AdmitResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.admits++
	return &controlplanev1.AdmitResponse{Decision: controlplanev1.Decision_DECISION_ADMIT}, nil
}

// A control plane that predates the hand-over is used as before: the
// report is dropped with a one-time notice and admission is central again.
func TestHandOverToAnOldControlPlane(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	old := &oldControlPlane{}
	serve := func(lis net.Listener) *grpc.Server {
		s := grpc.NewServer()
		controlplanev1.RegisterAdmissionServiceServer(s, old)
		go s.Serve(lis) //nolint:errcheck // ends with Stop
		return s
	}
	s := serve(lis)
	clk := newFakeClock()
	var notes noticeLog
	c := newClient(t, control.Config{Target: addr, Token: tok(t, "agent-token")}, clk, &notes)
	runSteps(t, c, clk, []step{{key: keyA}})
	s.Stop()
	outage(t, c, clk, keyA, 2)

	lis, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s = serve(lis)
	t.Cleanup(s.Stop)
	waitReady(t, c)
	clk.Advance(2 * sec)
	runSteps(t, c, clk, []step{{key: keyA}})
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() = %q, want %q", got, control.ModeCentral)
	}
	msgs := notes.Msgs()
	if len(msgs) != 3 || !strings.Contains(msgs[1], "predates the hand-over") || !strings.Contains(msgs[2], "reachable again") {
		t.Errorf("notices = %q, want unreachable, predates the hand-over, reachable again", msgs)
	}
	old.mu.Lock()
	defer old.mu.Unlock()
	if old.admits != 2 {
		t.Errorf("the old control plane answered %d Admits, want 2", old.admits)
	}
}
