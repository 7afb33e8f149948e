package broker_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redisstore"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is a manually advanced clock shared by the identity provider and
// the brokers.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// idp is the emulator's identity provider on a loopback listener.
type idp struct {
	a     *simauth.Authority
	clock *clock
	url   string // the token endpoint
}

func startIDP(t *testing.T, ttl time.Duration) *idp {
	t.Helper()
	clk := &clock{now: time.Now().Truncate(time.Second)}
	a, err := simauth.New(simauth.Config{TokenTTL: ttl, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return &idp{a: a, clock: clk, url: srv.URL + "/oauth/token"}
}

func newBroker(t *testing.T, p *idp, logins broker.Logins, key broker.Key) *broker.Broker {
	t.Helper()
	b, err := broker.New(broker.Options{Logins: logins, Key: key, TokenEndpoint: p.url, Now: p.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newKey(t *testing.T) broker.Key {
	t.Helper()
	k, _, err := broker.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func openLogins(t *testing.T, dir string) *store.LoginFile {
	t.Helper()
	f, err := store.OpenLogins(dir)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// importIssued stores a fresh family for accountID and returns its tokens.
func importIssued(t *testing.T, b *broker.Broker, p *idp, accountID string) simauth.Tokens {
	t.Helper()
	tok, err := p.a.Issue(accountID)
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.Import(t.Context(), codexauth.Secret(tok.AccessToken), codexauth.Secret(tok.RefreshToken), codexauth.Secret(tok.IDToken), "")
	if err != nil {
		t.Fatalf("Import: %v", err)
	}
	if st.Key != account.Key(accountID) || st.AccountID != accountID {
		t.Fatalf("Import = key %s account %s, want %s %s", st.Key, st.AccountID, account.Key(accountID), accountID)
	}
	return tok
}

// A fresh token is handed out as stored; within the skew of its expiry
// it is refreshed once, and the rotated token is handed out from then on.
func TestRefreshAheadOfExpiry(t *testing.T) {
	p := startIDP(t, time.Hour)
	b := newBroker(t, p, openLogins(t, t.TempDir()), newKey(t))
	issued := importIssued(t, b, p, "acct-a")
	key := account.Key("acct-a")

	tok, err := b.Token(t.Context(), key, "")
	if err != nil || tok.Access.Reveal() != issued.AccessToken || tok.AccountID != "acct-a" {
		t.Fatalf("Token = %v, %v; want the imported token for acct-a", tok, err)
	}
	p.clock.Advance(time.Hour - 100*time.Second) // within the 120 s skew
	tok2, err := b.Token(t.Context(), key, "")
	if err != nil || tok2.Access == tok.Access {
		t.Fatalf("Token near expiry = %v (same: %v); want a refreshed token", err, tok2.Access == tok.Access)
	}
	tok3, err := b.Token(t.Context(), key, "")
	if err != nil || tok3.Access != tok2.Access {
		t.Fatalf("Token after the refresh = %v (same: %v); want the refreshed token again", err, tok3.Access == tok2.Access)
	}
	if st := p.a.Stats(); st.TokenRefreshes != 1 || st.RefreshReuseDetected != 0 {
		t.Errorf("identity provider saw %+v; want 1 refresh, no reuse", st)
	}
	st, err := b.Get(t.Context(), key)
	if err != nil || st.Refreshes != 1 || st.NeedsLogin != "" {
		t.Errorf("Get = %+v, %v; want 1 refresh, no needs-login", st, err)
	}
}

// Several brokers sharing one store (processes on one data dir, or
// replicas on one Redis) refresh each expiry once between them.
func TestOneRefreshAcrossBrokers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		logins func(t *testing.T) []broker.Logins
	}{
		{"file", func(t *testing.T) []broker.Logins {
			dir := t.TempDir()
			return []broker.Logins{openLogins(t, dir), openLogins(t, dir), openLogins(t, dir)}
		}},
		{"redis", func(t *testing.T) []broker.Logins {
			rs := redistest.Start(t)
			var out []broker.Logins
			for range 3 {
				r, err := redisstore.Open(t.Context(), redisstore.Options{URL: rs.URL, Timeout: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = r.Close() })
				out = append(out, r)
			}
			return out
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startIDP(t, time.Hour)
			key := newKey(t)
			var bs []*broker.Broker
			for _, l := range tc.logins(t) {
				bs = append(bs, newBroker(t, p, l, key))
			}
			importIssued(t, bs[0], p, "acct-a")
			k := account.Key("acct-a")
			for round := 1; round <= 3; round++ {
				p.clock.Advance(time.Hour - 60*time.Second)
				var wg sync.WaitGroup
				got := make([]codexauth.Secret, 3*8)
				errs := make([]error, len(got))
				for i := range got {
					wg.Go(func() {
						tok, err := bs[i%3].Token(t.Context(), k, "")
						got[i], errs[i] = tok.Access, err
					})
				}
				wg.Wait()
				for i := range got {
					if errs[i] != nil || got[i] != got[0] {
						t.Fatalf("round %d: caller %d got err %v, same token as caller 0: %v", round, i, errs[i], got[i] == got[0])
					}
				}
				if st := p.a.Stats(); st.TokenRefreshes != int64(round) || st.RefreshReuseDetected != 0 {
					t.Fatalf("round %d: identity provider saw %+v; want %d refreshes, no reuse", round, st, round)
				}
			}
		})
	}
}

// A refresh token the identity provider refuses for good marks the login
// needs-login; it is never presented again, and every caller is told to
// run clodexctl account login.
func TestReusedRefreshTokenNeedsLogin(t *testing.T) {
	p := startIDP(t, time.Hour)
	b := newBroker(t, p, openLogins(t, t.TempDir()), newKey(t))
	issued := importIssued(t, b, p, "acct-a")
	key := account.Key("acct-a")
	// Someone else redeems the same refresh token first (a stray copy of
	// auth.json on another host).
	resp, err := http.PostForm(p.url, url.Values{"grant_type": {"refresh_token"}, "refresh_token": {issued.RefreshToken}, "client_id": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	p.clock.Advance(time.Hour)

	for i := range 3 {
		_, err := b.Token(t.Context(), key, "")
		var nl *broker.NeedsLoginError
		if !errors.As(err, &nl) || nl.Reason != "refresh_token_reused" || !strings.Contains(err.Error(), "clodexctl account login") {
			t.Fatalf("Token #%d = %v; want a NeedsLoginError (refresh_token_reused) naming clodexctl account login", i, err)
		}
	}
	if st := p.a.Stats(); st.RefreshReuseDetected != 1 {
		t.Errorf("reuse detected %d times; want 1 (the dead token is never presented again)", st.RefreshReuseDetected)
	}
	list, err := b.List(t.Context())
	if err != nil || len(list) != 1 || list[0].NeedsLogin != "refresh_token_reused" {
		t.Errorf("List = %+v, %v; want the account marked needs-login", list, err)
	}
	// A new login replaces it.
	importIssued(t, b, p, "acct-a")
	if _, err := b.Token(t.Context(), key, ""); err != nil {
		t.Errorf("Token after a new login: %v", err)
	}
}

// A token the upstream rejected is replaced by one forced refresh; the
// same rejection reported again gets the replacement without another.
func TestRejectedTokenForcesOneRefresh(t *testing.T) {
	p := startIDP(t, time.Hour)
	b := newBroker(t, p, openLogins(t, t.TempDir()), newKey(t))
	issued := importIssued(t, b, p, "acct-a")
	key := account.Key("acct-a")
	for range 3 {
		tok, err := b.Token(t.Context(), key, codexauth.Secret(issued.AccessToken))
		if err != nil || tok.Access.Reveal() == issued.AccessToken {
			t.Fatalf("Token(rejected) = %v, same token %v; want a different token", err, tok.Access.Reveal() == issued.AccessToken)
		}
	}
	if st := p.a.Stats(); st.TokenRefreshes != 1 {
		t.Errorf("identity provider saw %d refreshes; want 1", st.TokenRefreshes)
	}
}

// Tokens are sealed at rest: the logins file holds neither token, has
// mode 0600, and another key cannot open it.
func TestSealedAtRest(t *testing.T) {
	p := startIDP(t, time.Hour)
	dir := t.TempDir()
	b := newBroker(t, p, openLogins(t, dir), newKey(t))
	issued := importIssued(t, b, p, "acct-a")
	path := filepath.Join(dir, store.LoginsFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]string{"access": issued.AccessToken, "refresh": issued.RefreshToken, "id": issued.IDToken} {
		if strings.Contains(string(data), tok) {
			t.Errorf("%s holds the %s token in clear", path, name)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s mode = %v, %v; want 0600", path, fi.Mode().Perm(), err)
	}
	other := newBroker(t, p, openLogins(t, dir), newKey(t))
	_, err = other.Token(t.Context(), account.Key("acct-a"), "")
	if err == nil || !strings.Contains(err.Error(), "do not open with this credential key") {
		t.Errorf("Token with another key = %v; want an error saying the key does not open them", err)
	}
}

// The key file must hold 32 base64 bytes and be private.
func TestReadKeyFile(t *testing.T) {
	dir := t.TempDir()
	_, good, err := broker.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want          string
	}{
		{"ok", good + "\n", 0o600, ""},
		{"loose mode", good, 0o644, "chmod 600"},
		{"short", "c2hvcnQ=", 0o600, "decodes to 5 bytes; want exactly 32"},
		{"not base64", "%%%", 0o600, "not base64"},
		{"empty", "\n", 0o600, "empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			if err := os.WriteFile(path, []byte(tc.content), tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			_, err := broker.ReadKeyFile(path)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("ReadKeyFile = %v; want ok", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path)):
				t.Errorf("ReadKeyFile = %v; want an error naming %s and %q", err, path, tc.want)
			}
		})
	}
	if _, err := broker.ReadKeyFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("ReadKeyFile(missing) = nil; want an error")
	}
}

// A Redis lease that expired is taken by another holder, and a write
// under the old one is refused.
func TestRedisLeaseFencing(t *testing.T) {
	rs := redistest.Start(t)
	open := func() *redisstore.Store {
		r, err := redisstore.Open(t.Context(), redisstore.Options{URL: rs.URL, Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	}
	a, b := open(), open()
	key := account.Key("acct-a")
	la, err := a.AcquireLease(t.Context(), key, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	lb, err := b.AcquireLease(ctx, key, time.Minute) // waits for la to lapse
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lb.Release() }()
	if lb.Fence <= la.Fence {
		t.Errorf("fences %d then %d; want increasing", la.Fence, lb.Fence)
	}
	if _, err := a.PutLogin(t.Context(), store.Login{Key: key, Sealed: []byte("x")}, la); !errors.Is(err, store.ErrFenced) {
		t.Errorf("PutLogin under a lapsed lease = %v; want ErrFenced", err)
	}
	if _, err := b.PutLogin(t.Context(), store.Login{Key: key, Sealed: []byte("x")}, lb); err != nil {
		t.Errorf("PutLogin under the current lease = %v", err)
	}
	if _, err := b.PutLogin(t.Context(), store.Login{Key: key, Sealed: []byte("y")}, lb); !errors.Is(err, store.ErrConflict) {
		t.Errorf("PutLogin over a stale generation = %v; want ErrConflict", err)
	}
	_ = la.Release()
}

// A transient refresh failure (the token endpoint answers 503) keeps the
// current token in service while it is valid, holds further attempts off
// for a few seconds instead of hammering the endpoint, and once the token
// has expired reports that no token can be had now.
func TestTransientFailure(t *testing.T) {
	p := startIDP(t, time.Hour)
	var mu sync.Mutex
	failing, posts := true, 0
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts++
		f := failing
		mu.Unlock()
		if f {
			http.Error(w, `{"error":{"code":"server_error"}}`, http.StatusServiceUnavailable)
			return
		}
		p.a.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(flaky.Close)
	b, err := broker.New(broker.Options{Logins: openLogins(t, t.TempDir()), Key: newKey(t), TokenEndpoint: flaky.URL + "/oauth/token", Now: p.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	issued := importIssued(t, b, p, "acct-a")
	key := account.Key("acct-a")
	count := func() int { mu.Lock(); defer mu.Unlock(); return posts }

	p.clock.Advance(time.Hour - 60*time.Second)
	for range 5 {
		tok, err := b.Token(t.Context(), key, "")
		if err != nil || tok.Access.Reveal() != issued.AccessToken {
			t.Fatalf("Token while the endpoint fails = %v; want the current token", err)
		}
	}
	if n := count(); n != 1 {
		t.Errorf("the token endpoint was asked %d times within the hold-off; want 1", n)
	}
	p.clock.Advance(10 * time.Second)
	if _, err := b.Token(t.Context(), key, ""); err != nil || count() != 2 {
		t.Errorf("Token after the hold-off = %v with %d requests; want the current token after a second attempt", err, count())
	}
	p.clock.Advance(time.Minute) // expired
	_, err = b.Token(t.Context(), key, "")
	var un *broker.UnavailableError
	if !errors.As(err, &un) {
		t.Errorf("Token after expiry while the endpoint fails = %v; want an UnavailableError", err)
	}
	mu.Lock()
	failing = false
	mu.Unlock()
	p.clock.Advance(10 * time.Second)
	if tok, err := b.Token(t.Context(), key, ""); err != nil || tok.Access.Reveal() == issued.AccessToken {
		t.Errorf("Token once the endpoint answers = %v; want a refreshed token", err)
	}
}
