package control_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// step is one Admit and what the caller sees: the delays Admit waited out
// before returning and the refusal (nil: admitted).
type step struct {
	key     string
	sleeps  []time.Duration
	refused *control.RefusedError
}

func runSteps(t *testing.T, c *control.Client, clk *fakeClock, steps []step) {
	t.Helper()
	for i, s := range steps {
		err := c.Admit(t.Context(), s.key)
		if got := clk.TakeSleeps(); !slices.Equal(got, s.sleeps) {
			t.Errorf("step %d: Admit waited %v, want %v", i+1, got, s.sleeps)
		}
		if s.refused == nil {
			if err != nil {
				t.Errorf("step %d: Admit = %v, want nil", i+1, err)
			}
			continue
		}
		var got *control.RefusedError
		if !errors.As(err, &got) {
			t.Errorf("step %d: Admit = %v, want %+v", i+1, err, *s.refused)
			continue
		}
		if *got != *s.refused {
			t.Errorf("step %d: Admit refused %+v, want %+v", i+1, *got, *s.refused)
		}
	}
}

const sec = time.Second

func TestCentralDecisions(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: "host-1"}, clk, &notes)

	// 60/minute, burst 1, default budget (bound 4833ms, hint 4s): one token
	// a second, so simultaneous arrivals wait 1, 2, 3, 4 s and the next
	// (5 s > bound) is refused.
	setRate(t, admin, keyA, 60, 1)
	runSteps(t, c, clk, []step{
		{key: keyA},
		{key: keyA, sleeps: []time.Duration{1 * sec}},
		{key: keyA, sleeps: []time.Duration{2 * sec}},
		{key: keyA, sleeps: []time.Duration{3 * sec}},
		{key: keyA, sleeps: []time.Duration{4 * sec}},
		{key: keyA, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 5 * sec}},
	})
	// A refusal debits nothing: the bucket holds the four waiting tokens.
	if got := tokens(t, admin, keyA); got != -4 {
		t.Errorf("tokens after the refusal = %v, want -4", got)
	}
	want := control.Stats{Central: control.Counts{Admits: 1, Waits: 4, Refusals: 1}}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Errorf("Mode() = %q, want %q", got, control.ModeCentral)
	}
	if got := notes.Msgs(); len(got) != 0 {
		t.Errorf("notices = %q, want none", got)
	}
}

func TestRefusedErrorMessage(t *testing.T) {
	tests := []struct {
		err  *control.RefusedError
		want string
	}{
		{&control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 5 * sec}, "admission refused: retry after 4s"},
		{&control.RefusedError{RetryAfter: 1 * sec, Local: true}, "admission refused locally: retry after 1s"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%+v.Error() = %q, want %q", *tt.err, got, tt.want)
		}
		if !tt.err.Retryable() {
			t.Errorf("%+v.Retryable() = false, want true", *tt.err)
		}
	}
}

func TestCancelDuringCentralWaitRefunds(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &noticeLog{})
	setRate(t, admin, keyA, 60, 1)

	runSteps(t, c, clk, []step{{key: keyA}})
	clk.SetBlocking(true)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Admit(ctx, keyA) }()
	if d := recv(t, clk.Blocked); d != 1*sec {
		t.Fatalf("Admit waits %v, want 1s", d)
	}
	if got := tokens(t, admin, keyA); got != -1 {
		t.Fatalf("tokens while waiting = %v, want -1", got)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit after cancel = %v, want context.Canceled", err)
	}
	if got := tokens(t, admin, keyA); got != 0 {
		t.Errorf("tokens after cancel = %v, want 0 (refunded)", got)
	}
	clk.SetBlocking(false)
	clk.TakeSleeps()
	// The refunded slot is the next one: a 1 s wait again, not 2 s.
	runSteps(t, c, clk, []step{{key: keyA, sleeps: []time.Duration{1 * sec}}})
	if s := c.Stats(); s.Cancels != 1 || s.Refunds != 1 {
		t.Errorf("Stats() cancels %d refunds %d, want 1 and 1", s.Cancels, s.Refunds)
	}
}

// TestFallbackAndRecovery stops the control plane, checks the local share
// (2 live agents: half the rate and burst), one notice, the probe backoff,
// and the return to central admission after a restart.
func TestFallbackAndRecovery(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &notes)
	c.SetLiveAgents(keyA, 2)
	c.SetLiveAgents(keyB, 2)

	runSteps(t, c, clk, []step{{key: keyA}}) // central, connection established
	srv.Stop()

	// Default policy 60/minute burst 10, halved: 30/minute (one token per
	// 2 s) burst 5. The local bucket starts empty: waits of 2 s and 4 s,
	// then a 6 s deficit is past the 4833ms bound: refused with the 4 s
	// hint.
	runSteps(t, c, clk, []step{
		{key: keyA, sleeps: []time.Duration{2 * sec}},
		{key: keyA, sleeps: []time.Duration{4 * sec}},
		{key: keyA, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 6 * sec, Local: true}},
	})
	if got := c.Mode(); got != control.ModeLocal {
		t.Fatalf("Mode() = %q, want %q", got, control.ModeLocal)
	}
	msgs := notes.Msgs()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "control plane unreachable (Unavailable)") || !strings.Contains(msgs[0], "1/2") {
		t.Fatalf("notices = %q, want one unreachable notice naming Unavailable and the 1/2 share", msgs)
	}
	want := control.Stats{
		Central:   control.Counts{Admits: 1},
		Local:     control.Counts{Waits: 2, Refusals: 1},
		Fallbacks: 1,
	}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}

	// Probes: the first after 250 ms, then 500 ms after a failed one.
	// keyB's pacing is off, so its local decisions are all admits.
	if err := c.SetPolicy(keyB, pacing.Policy{RatePerMinute: 0, Burst: 10, Budget: pacing.DefaultBudget()}); err != nil {
		t.Fatal(err)
	}
	probes := func() int64 { return c.Stats().Probes }
	for _, tt := range []struct {
		advance    time.Duration
		wantProbes int64
	}{
		{249 * time.Millisecond, 0},
		{1 * time.Millisecond, 1},   // t = 250ms: probe fails (still stopped)
		{499 * time.Millisecond, 1}, // t = 749ms
		{1 * time.Millisecond, 2},   // t = 750ms: second probe fails
	} {
		clk.Advance(tt.advance)
		if err := c.Admit(t.Context(), keyB); err != nil {
			t.Fatalf("local Admit = %v, want nil", err)
		}
		if got := probes(); got != tt.wantProbes {
			t.Fatalf("after +%v: probes = %d, want %d", tt.advance, got, tt.wantProbes)
		}
	}
	if got := c.Mode(); got != control.ModeLocal || len(notes.Msgs()) != 1 {
		t.Fatalf("after failed probes: Mode() = %q, notices %q; want local and still one notice", got, notes.Msgs())
	}

	srv.Restart()
	waitReady(t, c)
	clk.Advance(999 * time.Millisecond) // the next probe is 1 s after the last
	if err := c.Admit(t.Context(), keyB); err != nil || c.Mode() != control.ModeLocal {
		t.Fatalf("Admit before the backoff = %v in mode %q, want nil in local", err, c.Mode())
	}
	clk.Advance(1 * time.Millisecond)
	if err := c.Admit(t.Context(), keyB); err != nil {
		t.Fatalf("Admit after restart = %v, want nil", err)
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Fatalf("Mode() after restart = %q, want %q", got, control.ModeCentral)
	}
	msgs = notes.Msgs()
	if len(msgs) != 2 || !strings.Contains(msgs[1], "reachable again") {
		t.Fatalf("notices = %q, want the unreachable notice then one back notice", msgs)
	}
	s := c.Stats()
	if s.Recoveries != 1 || s.Probes != 3 || s.Central.Admits != 2 || s.Fallbacks != 1 {
		t.Errorf("Stats() = %+v, want 1 recovery, 3 probes, 2 central admits, 1 fallback", s)
	}
	// Central again: the next request asks the control plane at once.
	if err := c.Admit(t.Context(), keyB); err != nil || c.Stats().Central.Admits != 3 {
		t.Errorf("Admit = %v with %d central admits, want nil and 3", err, c.Stats().Central.Admits)
	}
}

// hangingAdmission is an AdmissionService whose Admit blocks until the
// caller's deadline; it reports the deadline it was given.
type hangingAdmission struct {
	controlplanev1.UnimplementedAdmissionServiceServer
	remaining chan time.Duration // the deadline left when Admit started; -1: none
}

func (h *hangingAdmission) Admit(ctx context.Context, _ *controlplanev1.AdmitRequest) (*controlplanev1.AdmitResponse, error) {
	left := time.Duration(-1)
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	h.remaining <- left
	<-ctx.Done()
	return nil, ctx.Err()
}

// recv receives from ch; the timeout only keeps a broken client from
// hanging the test.
func recv[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received in 10s")
		panic("unreachable")
	}
}

func startHanging(t *testing.T) (addr string, h *hangingAdmission) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h = &hangingAdmission{remaining: make(chan time.Duration, 8)}
	s := grpc.NewServer()
	controlplanev1.RegisterAdmissionServiceServer(s, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis.Addr().String(), h
}

func TestHangingControlPlaneFallsBackAfterTimeout(t *testing.T) {
	addr, h := startHanging(t)
	clk := newFakeClock()
	var notes noticeLog
	c := newClient(t, control.Config{Target: addr, Token: tok(t, "agent")}, clk, &notes)

	// The request's own deadline is far beyond the RPC's; it only turns a
	// client that ignores its Timeout into a failure instead of a hang.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := c.Admit(ctx, keyA); err != nil {
		t.Fatalf("Admit = %v, want nil (admitted locally)", err)
	}
	if left := <-h.remaining; left < 0 || left > control.DefaultTimeout {
		t.Errorf("server saw a deadline %v away, want at most %v", left, control.DefaultTimeout)
	}
	if got := c.Mode(); got != control.ModeLocal {
		t.Errorf("Mode() = %q, want %q", got, control.ModeLocal)
	}
	if msgs := notes.Msgs(); len(msgs) != 1 || !strings.Contains(msgs[0], "DeadlineExceeded") {
		t.Errorf("notices = %q, want one naming DeadlineExceeded", msgs)
	}
	// The default 60/minute from an empty local bucket: one token in 1 s.
	if got := clk.TakeSleeps(); !slices.Equal(got, []time.Duration{sec}) {
		t.Errorf("Admit waited %v, want [1s]", got)
	}
	want := control.Stats{Local: control.Counts{Waits: 1}, Fallbacks: 1}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
}

// TestOneProbeAtATime starts local (nothing listens), then brings up a
// control plane that hangs: while one request probes it, the others decide
// locally without asking.
func TestOneProbeAtATime(t *testing.T) {
	addr := closedAddr(t)
	clk := newFakeClock()
	c := newClient(t, control.Config{Target: addr, Token: tok(t, "agent"), Timeout: time.Hour}, clk, &noticeLog{})
	if err := c.Admit(t.Context(), keyA); err != nil || c.Mode() != control.ModeLocal {
		t.Fatalf("Admit with nothing listening = %v in mode %q, want nil in local", err, c.Mode())
	}

	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", addr, err)
	}
	h := &hangingAdmission{remaining: make(chan time.Duration, 8)}
	s := grpc.NewServer()
	controlplanev1.RegisterAdmissionServiceServer(s, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	defer func() {
		s.Stop()
		<-done
	}()
	waitReady(t, c)

	clk.Advance(control.MinBackoff)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Admit(ctx, keyA) }()
	recv(t, h.remaining) // the probe is at the server
	for i := range 3 {
		// A bounded context turns a second probe (which would hang) into
		// a failure.
		actx, acancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := c.Admit(actx, keyB)
		acancel()
		if err != nil {
			t.Fatalf("Admit %d during the probe = %v, want nil", i+1, err)
		}
	}
	if got := c.Stats().Probes; got != 1 {
		t.Errorf("probes during a probe = %d, want 1", got)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("probe Admit after cancel = %v, want context.Canceled", err)
	}
	if got := c.Mode(); got != control.ModeLocal {
		t.Errorf("Mode() after a cancelled probe = %q, want %q", got, control.ModeLocal)
	}
	// Empty buckets at 60/minute: keyA waited 1 s, keyB 1, 2 and 3 s.
	if got, want := clk.TakeSleeps(), []time.Duration{sec, sec, 2 * sec, 3 * sec}; !slices.Equal(got, want) {
		t.Errorf("local waits %v, want %v", got, want)
	}
	want := control.Stats{Local: control.Counts{Waits: 4}, Fallbacks: 1, Probes: 1}
	if got := c.Stats(); got != want {
		t.Errorf("Stats() = %+v, want %+v", got, want)
	}
	// The cancelled probe released its turn: the next request probes.
	ctx2, cancel2 := context.WithCancel(t.Context())
	go func() { errc <- c.Admit(ctx2, keyA) }()
	recv(t, h.remaining)
	cancel2()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("second probe Admit after cancel = %v, want context.Canceled", err)
	}
	if got := c.Stats().Probes; got != 2 {
		t.Errorf("probes = %d, want 2", got)
	}
}

func TestCancelDuringRPCReturnsCtxErr(t *testing.T) {
	addr, h := startHanging(t)
	clk := newFakeClock()
	var notes noticeLog
	c := newClient(t, control.Config{Target: addr, Token: tok(t, "agent"), Timeout: time.Hour}, clk, &notes)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Admit(ctx, keyA) }()
	recv(t, h.remaining) // the RPC reached the server
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit = %v, want context.Canceled", err)
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Errorf("Mode() = %q, want %q: a cancelled request says nothing about the control plane", got, control.ModeCentral)
	}
	if got := c.Stats(); got != (control.Stats{}) {
		t.Errorf("Stats() = %+v, want zero", got)
	}
	if msgs := notes.Msgs(); len(msgs) != 0 {
		t.Errorf("notices = %q, want none", msgs)
	}
}

// A token the control plane does not know refuses the data plane: Admit
// returns the *AgentRefusedError (no local admission, no socket), and so
// does every Admit after it without asking again, once announced with the
// cause and the fix; the mode stays central (the control plane answers).
func TestRefusedTokenStopsAdmission(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	srv.Register(keyA, keyB)
	clk := newFakeClock()
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: tok(t, "not-the-agent-token")}, clk, &notes)

	for i := range 2 {
		err := c.Admit(t.Context(), keyA)
		var refused *control.AgentRefusedError
		if !errors.As(err, &refused) || refused.Revoked || refused.Target != srv.Addr {
			t.Fatalf("Admit %d = %v, want an *AgentRefusedError from %s", i+1, err, srv.Addr)
		}
	}
	if err := c.Refused(); err == nil {
		t.Error("Refused() = nil after the control plane refused the token")
	}
	if got := c.Mode(); got != control.ModeCentral {
		t.Errorf("Mode() = %q, want %q", got, control.ModeCentral)
	}
	if got := clk.TakeSleeps(); len(got) != 0 {
		t.Errorf("local waits %v, want none: a refused data plane admits nothing", got)
	}
	if got := c.Stats(); got != (control.Stats{}) {
		t.Errorf("Stats() = %+v, want zero: nothing was decided", got)
	}
	msgs := notes.Msgs()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "does not accept this data plane's agent token") {
		t.Fatalf("notices = %q, want one saying the token is not accepted", msgs)
	}
	if strings.Contains(msgs[0], "not-the-agent-token") {
		t.Errorf("notice %q contains the token", msgs[0])
	}
	if !strings.Contains(msgs[0], "--agent-token-file") {
		t.Errorf("notice %q does not say to check the agent token file", msgs[0])
	}
}

// An account the control plane does not let this data plane use is
// refused; the notice carries the control plane's reason instead of
// blaming the token. (Every Admit names the agent id, which registers an
// account for the fleet's agent token, so the refusal comes from a
// credential an operator scoped to another account.)
func TestUnknownAccountNoticeSaysWhy(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	scoped := tok(t, "scoped-agent-token")
	sum := sha256.Sum256([]byte(scoped.Reveal()))
	if _, err := adminClient(srv).CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{
		Name: "dp-b", Accounts: []string{keyB}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	var notes noticeLog
	c := newClient(t, control.Config{Target: srv.Addr, Token: scoped}, clk, &notes)

	if err := c.Admit(t.Context(), keyA); err != nil {
		t.Fatalf("Admit = %v, want nil (admitted locally)", err)
	}
	msgs := notes.Msgs()
	if len(msgs) != 1 || !strings.Contains(msgs[0], "PermissionDenied") || !strings.Contains(msgs[0], keyA) {
		t.Fatalf("notices = %q, want one naming PermissionDenied and the account %s", msgs, keyA)
	}
	if strings.Contains(msgs[0], "token") {
		t.Errorf("notice %q blames the token for an unknown account", msgs[0])
	}
}

// localClient returns a client whose control plane is never reachable.
func localClient(t *testing.T, cfg control.Config, clk *fakeClock, notes *noticeLog) *control.Client {
	t.Helper()
	cfg.Target, cfg.Token = closedAddr(t), tok(t, "agent")
	return newClient(t, cfg, clk, notes)
}

func TestLocalShareFollowsPolicyAndLiveAgents(t *testing.T) {
	clk := newFakeClock()
	c := localClient(t, control.Config{}, clk, &noticeLog{})
	c.SetLiveAgents(keyA, 2)
	if err := c.SetPolicy(keyA, pacing.Policy{RatePerMinute: 6, Burst: 3, Budget: pacing.DefaultBudget()}); err != nil {
		t.Fatal(err)
	}
	// keyA: 6/minute burst 3 shared by 2 = 3/minute (one token per 20 s)
	// burst 2. The bucket starts empty: the first token is 20 s away,
	// past the 4833ms bound: refused with the 4 s hint.
	runSteps(t, c, clk, []step{
		{key: keyA, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 20 * sec, Local: true}},
	})
	// Ten minutes later the bucket holds its burst of 2, not 3: two admit,
	// the third needs 20 s again. keyB, alone (1 live agent), gets the
	// whole fallback (defaults, 60/minute burst 10) from an empty bucket:
	// waits of 1, 2, 3 and 4 s, then a 5 s deficit is past the bound.
	clk.Advance(10 * time.Minute)
	runSteps(t, c, clk, []step{
		{key: keyA}, {key: keyA},
		{key: keyA, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 20 * sec, Local: true}},
		{key: keyB, sleeps: []time.Duration{1 * sec}},
		{key: keyB, sleeps: []time.Duration{2 * sec}},
		{key: keyB, sleeps: []time.Duration{3 * sec}},
		{key: keyB, sleeps: []time.Duration{4 * sec}},
		{key: keyB, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 5 * sec, Local: true}},
	})
	// One agent left: keyA gets the whole 6/minute; a token is now 10 s away.
	c.SetLiveAgents(keyA, 1)
	runSteps(t, c, clk, []step{
		{key: keyA, refused: &control.RefusedError{RetryAfter: 4 * sec, RequiredWait: 10 * sec, Local: true}},
	})
}

func TestLocalCancelRefunds(t *testing.T) {
	clk := newFakeClock()
	fallback := pacing.Policy{RatePerMinute: 60, Burst: 1, Budget: pacing.DefaultBudget()}
	c := localClient(t, control.Config{Fallback: fallback}, clk, &noticeLog{})

	// An empty bucket at one token a second: the first waits 1 s, the
	// second 2 s; cancelled, its token comes back, so the next waits 2 s
	// again, not 3 s.
	runSteps(t, c, clk, []step{{key: keyA, sleeps: []time.Duration{1 * sec}}})
	clk.SetBlocking(true)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Admit(ctx, keyA) }()
	if d := recv(t, clk.Blocked); d != 2*sec {
		t.Fatalf("Admit waits %v, want 2s", d)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Admit after cancel = %v, want context.Canceled", err)
	}
	clk.SetBlocking(false)
	clk.TakeSleeps()
	runSteps(t, c, clk, []step{{key: keyA, sleeps: []time.Duration{2 * sec}}})
	if s := c.Stats(); s.Cancels != 1 || s.Refunds != 1 {
		t.Errorf("Stats() cancels %d refunds %d, want 1 and 1", s.Cancels, s.Refunds)
	}
}

func TestLocalRelaxedNoticeOnce(t *testing.T) {
	clk := newFakeClock()
	var notes noticeLog
	// 1/minute cannot refuse (5 retries × 4 s < 60 s): the empty bucket
	// makes the first wait the whole 4833ms bound, then relaxes.
	fallback := pacing.Policy{RatePerMinute: 1, Burst: 1, Budget: pacing.DefaultBudget()}
	c := localClient(t, control.Config{Fallback: fallback}, clk, &notes)
	runSteps(t, c, clk, []step{
		{key: keyA, sleeps: []time.Duration{4833 * time.Millisecond}},
		{key: keyA},
		{key: keyA},
	})
	var relaxed []string
	for _, m := range notes.Msgs() {
		if strings.Contains(m, "past the 1/minute ceiling") {
			relaxed = append(relaxed, m)
		}
	}
	if len(relaxed) != 1 {
		t.Errorf("relaxed notices = %q (all: %q), want exactly one", relaxed, notes.Msgs())
	}
}

func TestLocalPacingOff(t *testing.T) {
	clk := newFakeClock()
	fallback := pacing.Policy{RatePerMinute: 0, Burst: 10, Budget: pacing.DefaultBudget()}
	c := localClient(t, control.Config{Fallback: fallback}, clk, &noticeLog{})
	c.SetLiveAgents(keyA, 3)
	for i := range 50 {
		if err := c.Admit(t.Context(), keyA); err != nil {
			t.Fatalf("Admit %d = %v, want nil (pacing off stays off in the share)", i+1, err)
		}
	}
	if got := clk.TakeSleeps(); len(got) != 0 {
		t.Errorf("waited %v, want nothing", got)
	}
}

func TestAdmitInvalidKey(t *testing.T) {
	c := localClient(t, control.Config{}, newFakeClock(), &noticeLog{})
	raw := "user-RAWACCOUNTID-1234"
	for _, key := range []string{"", raw, "acct_0123456789ABCDEF", "acct_0123"} {
		err := c.Admit(t.Context(), key)
		if !errors.Is(err, control.ErrInvalidKey) {
			t.Errorf("Admit(%q) = %v, want ErrInvalidKey", key, err)
		}
		if key != "" && err != nil && strings.Contains(err.Error(), key) {
			t.Errorf("Admit(%q) error %q repeats the argument", key, err)
		}
	}
	if got := c.Stats(); got != (control.Stats{}) {
		t.Errorf("Stats() = %+v, want zero: nothing was asked", got)
	}
}

func TestSetPolicyRejectsBadInput(t *testing.T) {
	c := localClient(t, control.Config{}, newFakeClock(), &noticeLog{})
	good := pacing.DefaultPolicy()
	bad := good
	bad.RatePerMinute = 601
	tests := []struct {
		name, key string
		p         pacing.Policy
		want      string // substring; "" means no error
	}{
		{"ok", keyA, good, ""},
		{"raw id", "chatgpt-account-a", good, "account key is invalid"},
		{"rate out of range", keyA, bad, "rate_per_minute 601 is out of range; allowed 0..600"},
		{"zero budget", keyA, pacing.Policy{RatePerMinute: 60, Burst: 10}, "idle_timeout_ms 0 is out of range"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := c.SetPolicy(tt.key, tt.p)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("SetPolicy = %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("SetPolicy = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestNewRejectsBadConfig holds the rows of the admission client's and the
// agent's configuration checks, and the connection's.
func TestNewRejectsBadConfig(t *testing.T) {
	minimal := control.Config{Target: closedAddr(t), Token: tok(t, "agent"), AgentID: "x"}
	with := func(f func(*control.Config)) control.Config {
		cfg := minimal
		f(&cfg)
		return cfg
	}
	badFallback := pacing.DefaultPolicy()
	badFallback.Burst = 0
	tests := []struct {
		name string
		cfg  control.Config
		want []string // substrings, all required
	}{
		{"no target", with(func(c *control.Config) { c.Target = "" }), []string{"field Target is required"}},
		{"everything", control.Config{Timeout: -1, Fallback: badFallback, Heartbeat: -1, Accounts: []string{"chatgpt-account-a"}},
			[]string{"field Target is required", "field Token is required", "field AgentID: agent id is empty", "field Heartbeat -1ns is invalid",
				"field Timeout -1ns is negative", "field Fallback: burst 0 is out of range; allowed 1..1000", "field Accounts[0]: account key is invalid"}},
		{"negative timeout", with(func(c *control.Config) { c.Timeout = -time.Second }), []string{"Timeout -1s is negative"}},
		{"bad target", with(func(c *control.Config) { c.Target = "http://cp:17700" }), []string{`field Target: control plane address "http://cp:17700" has a scheme`}},
		{"no token", with(func(c *control.Config) { c.Token = bearer.Token{} }), []string{"field Token is required"}},
		{"no id", with(func(c *control.Config) { c.AgentID = "" }), []string{"agent id is empty"}},
		{"space in id", with(func(c *control.Config) { c.AgentID = "a b" }), []string{`agent id "a b" has a byte 0x20 at 1; allowed printable ASCII without spaces`}},
		{"long id", with(func(c *control.Config) { c.AgentID = strings.Repeat("x", 129) }), []string{"agent id is 129 bytes; allowed 1..128"}},
		{"heartbeat too long", with(func(c *control.Config) { c.Heartbeat = 15 * time.Second }), []string{"field Heartbeat 15s is invalid"}},
		{"negative heartbeat", with(func(c *control.Config) { c.Heartbeat = -time.Second }), []string{"field Heartbeat -1s is invalid"}},
		{"raw account id", with(func(c *control.Config) { c.Accounts = []string{keyA, "chatgpt-account-b"} }), []string{"field Accounts[1]: account key is invalid"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := control.New(tt.cfg)
			if err == nil {
				_ = c.Close()
				t.Fatalf("New = nil error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New = %v, want it to contain %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "chatgpt-account") {
				t.Errorf("New = %v repeats a raw account id", err)
			}
		})
	}
	if c, err := control.New(minimal); err != nil {
		t.Errorf("New(minimal) = %v, want nil", err)
	} else {
		_ = c.Close()
	}
}

func TestAdmitAfterCloseAndCancelledCtx(t *testing.T) {
	c := localClient(t, control.Config{}, newFakeClock(), &noticeLog{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := c.Admit(ctx, keyA); !errors.Is(err, context.Canceled) {
		t.Errorf("Admit(cancelled ctx) = %v, want context.Canceled", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	if err := c.Admit(t.Context(), keyA); !errors.Is(err, control.ErrClosed) {
		t.Errorf("Admit after Close = %v, want ErrClosed", err)
	}
	if got := c.Stats(); got != (control.Stats{}) {
		t.Errorf("Stats() = %+v, want zero", got)
	}
}

func TestConcurrentAdmitsDuringOutage(t *testing.T) {
	clk := newFakeClock()
	var notes noticeLog
	fallback := pacing.Policy{RatePerMinute: 0, Burst: 1, Budget: pacing.DefaultBudget()}
	c := localClient(t, control.Config{Fallback: fallback}, clk, &notes)
	const n = 32
	errc := make(chan error, n)
	for i := range n {
		go func() { errc <- c.Admit(t.Context(), []string{keyA, keyB}[i%2]) }()
	}
	for range n {
		if err := <-errc; err != nil {
			t.Errorf("Admit = %v, want nil", err)
		}
	}
	s := c.Stats()
	if s.Fallbacks != 1 || s.Local.Admits != n {
		t.Errorf("Stats() = %+v, want 1 fallback and %d local admits", s, n)
	}
	if msgs := notes.Msgs(); len(msgs) != 1 {
		t.Errorf("notices = %q, want exactly one", msgs)
	}
}

func ExampleRefusedError() {
	err := error(&control.RefusedError{RetryAfter: 4 * time.Second, RequiredWait: 5 * time.Second})
	var refused *control.RefusedError
	if errors.As(err, &refused) {
		fmt.Println(err, "- next attempt in", refused.RetryAfter)
	}
	// Output: admission refused: retry after 4s - next attempt in 4s
}

// A pause pushed while a request waits out a granted slot (an upstream 403
// elsewhere in the fleet): the request does not dial; its reservation is
// refunded and it is refused until the pause's end.
func TestPauseDuringCentralWaitGivesTheSlotBack(t *testing.T) {
	clk := newFakeClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(keyA, keyB)
	admin := adminClient(srv)
	c := newClient(t, control.Config{Target: srv.Addr, Token: srv.AgentToken}, clk, &noticeLog{})
	setRate(t, admin, keyA, 60, 1)
	runSteps(t, c, clk, []step{{key: keyA}})

	c.SetPause(keyA, clk.Now().Add(29500*time.Millisecond))
	err := c.Admit(t.Context(), keyA)
	var refused *control.RefusedError
	if !errors.As(err, &refused) || !refused.Paused || refused.RetryAfter != 30*sec {
		t.Fatalf("Admit during a pause = %v, want a paused refusal retrying after 30s (the pause's end, whole seconds)", err)
	}
	if got := tokens(t, admin, keyA); got != 0 {
		t.Errorf("tokens after the paused refusal = %v, want 0 (the slot refunded)", got)
	}
	if !strings.Contains(err.Error(), "paused after an upstream 403") {
		t.Errorf("error %q does not say why", err)
	}
	// Another account is not paused; the pause's end (or a zero pause
	// pushed) lets the account dial again.
	clk.TakeSleeps()
	runSteps(t, c, clk, []step{{key: keyB}})
	c.SetPause(keyA, time.Time{})
	runSteps(t, c, clk, []step{{key: keyA, sleeps: []time.Duration{1 * sec}}})
}
