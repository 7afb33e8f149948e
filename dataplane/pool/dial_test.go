package pool

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
)

// A dial that opens no socket names the upstream and the cause, over real
// sockets: nothing listening, a certificate nobody trusts, a backend that
// never answers the handshake. The failure memory then refuses the next
// new socket at once, before admission and without a dial.
func TestDialThatOpensNoSocketMarksTheUpstreamUnreachable(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := closed.Addr().String()
	closed.Close()

	tlsSrv := httptest.NewUnstartedServer(http.NotFoundHandler())
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake errors are the point
	tlsSrv.StartTLS()
	defer tlsSrv.Close()
	tlsAddr := strings.TrimPrefix(tlsSrv.URL, "https://")

	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the kernel does), never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	tests := []struct {
		name, url, cause string
		timeout          time.Duration // the dial's bound
	}{
		{"nothing listens", "ws://" + refusedAddr + "/r", "connection refused", time.Minute},
		{"untrusted certificate", "wss://" + tlsAddr + "/r", "TLS certificate not trusted", time.Minute},
		{"no answer", "ws://" + silent.Addr().String() + "/r", "timed out", 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			health, err := retry.NewHealth(retry.HealthConfig{}) // the next probe is a second or more away
			if err != nil {
				t.Fatal(err)
			}
			admit := &countingAdmitter{}
			p, err := New(Config{Upstream: upstream.DialOptions{URL: tt.url, DialTimeout: tt.timeout},
				Credentials: staticCredentials(testCred), Health: health, Admitter: admit})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			key := upstream.Key(tt.url)
			_, err = p.Acquire(t.Context(), part("down"), items(user("u1")))
			var ue *upstream.UnreachableError
			if !errors.As(err, &ue) || ue.Cause != tt.cause || ue.Upstream != key {
				t.Fatalf("Acquire = %v, want an UnreachableError for %s: %s", err, key, tt.cause)
			}
			if st := health.Status(key); !st.Unreachable {
				t.Errorf("health %+v, want the upstream unreachable", st)
			}
			_, err = p.Acquire(t.Context(), part("down"), items(user("u1")))
			var de *retry.DownError
			if !errors.As(err, &de) || !errors.As(err, &ue) {
				t.Errorf("second Acquire = %v, want a DownError carrying the cause, without a dial", err)
			}
			if n := admit.count(); n != 1 {
				t.Errorf("admissions = %d, want 1: a known-unreachable upstream is refused before admission", n)
			}
		})
	}
}

// changingCredentials hands out cur, which the test changes.
type changingCredentials struct {
	mu  sync.Mutex
	cur codexauth.Credential
}

func (c *changingCredentials) Credential(context.Context, string) (codexauth.Credential, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cur, nil
}

func (c *changingCredentials) set(cred codexauth.Credential) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cur = cred
}

// The pool reads the credential at each dial (a refreshed token is used
// for new sockets), a discarded socket is released at once, and a 401 on
// the upgrade carries (but never prints) the refused token.
func TestDialUsesTheCurrentCredentialAndHardCloses(t *testing.T) {
	sim, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		_ = sim.Close()
		ts.Close()
	})
	creds := &changingCredentials{cur: codexauth.Credential{AccessToken: "tok-a", AccountID: "acct-a"}}
	p, err := New(Config{Upstream: simUpstream(strings.TrimPrefix(ts.URL, "http://")), Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	unkeyed := Partition{}
	l1, err := p.Acquire(t.Context(), unkeyed, items(user("one")))
	if err != nil {
		t.Fatalf("first dial: %v", err)
	}
	creds.set(codexauth.Credential{AccessToken: "tok-b", AccountID: "acct-b"})
	l2, err := p.Acquire(t.Context(), unkeyed, items(user("two")))
	if err != nil {
		t.Fatalf("second dial: %v", err)
	}
	if st := sim.Stats(); st.UpgradesByAccount["acct-a"] != 1 || st.UpgradesByAccount["acct-b"] != 1 || st.OpenSockets != 2 {
		t.Errorf("sim upgrades by account %v open %d, want one each and 2 open", st.UpgradesByAccount, st.OpenSockets)
	}
	l1.Discard("test")
	l2.Discard("test")
	waitFor(t, "the sim to see both sockets closed", func() bool { return sim.Stats().OpenSockets == 0 })

	creds.set(codexauth.Credential{AccessToken: "tok-unknown", AccountID: "acct-a"})
	_, err = p.Acquire(t.Context(), unkeyed, items(user("three")))
	var ue *upstream.UpgradeError
	if !errors.As(err, &ue) || ue.Status != http.StatusUnauthorized || ue.Token != "tok-unknown" || strings.Contains(err.Error(), "tok-unknown") {
		t.Errorf("dial with a refused token: %v, want a 401 rejection carrying (but not printing) the token", err)
	}
}

// waitFor polls cond until it holds; for a condition another process or
// goroutine establishes (the emulator noticing a closed socket). The
// deadline only turns a hang into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The hooks: every frame of a socket whose partition names an account goes
// to OnFrame with the account; every upgrade refused with 403 to
// OnForbidden with the account and the Retry-After in seconds.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var frames []string
	var forbidden []string
	e := newEnv(t, func(c *Config) {
		c.OnFrame = func(account string, frame []byte) {
			mu.Lock()
			frames = append(frames, account+" "+string(frame))
			mu.Unlock()
		}
		c.OnForbidden = func(account string, retryAfter time.Duration) {
			mu.Lock()
			forbidden = append(forbidden, account+" "+retryAfter.String())
			mu.Unlock()
		}
	})
	pt := part("hooks")
	l, err := e.pool.Acquire(t.Context(), pt, items(user("u1")))
	if err != nil {
		t.Fatal(err)
	}
	push(t, e.dialer.conns[0], sendFrame(`{"type":"codex.rate_limits"}`))
	if got, err := l.Conn.Next(t.Context()); err != nil || string(got) != `{"type":"codex.rate_limits"}` {
		t.Fatalf("Next = %q, %v", got, err)
	}
	mu.Lock()
	if !slices.Equal(frames, []string{`acct-1 {"type":"codex.rate_limits"}`}) {
		t.Errorf("OnFrame saw %q, want the frame with the partition's account", frames)
	}
	mu.Unlock()
	l.Discard("done")

	e.srv.Refuse(http.StatusForbidden, "7")
	if _, err := e.pool.Acquire(t.Context(), part("refused"), items(user("u2"))); err == nil {
		t.Fatal("Acquire on a refused upgrade succeeded")
	}
	if _, err := e.pool.Acquire(t.Context(), Partition{Model: "m"}, items(user("u3"))); err == nil {
		t.Fatal("unpartitioned Acquire on a refused upgrade succeeded")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(forbidden, []string{"acct-1 7s"}) {
		t.Errorf("OnForbidden saw %q, want one report for acct-1 with retry-after 7 (none for a partition without an account)", forbidden)
	}
}

func TestParseRetryAfter(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"7": 7 * time.Second, " 30 ": 30 * time.Second, "99999": time.Hour,
		"": 0, "0": 0, "-3": 0, "soon": 0, "Wed, 21 Oct 2026 07:28:00 GMT": 0,
	} {
		if got := parseRetryAfter(in); got != want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
}
