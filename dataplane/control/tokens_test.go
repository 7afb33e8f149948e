package control_test

import (
	"errors"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/control"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// idp is an identity provider the broker refreshes its logins at.
type idp struct {
	auth     *simauth.Authority
	endpoint string // the token endpoint
}

func startIdP(t *testing.T) *idp {
	t.Helper()
	a, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return &idp{auth: a, endpoint: srv.URL + "/oauth/token"}
}

// login issues a sign-in of the ChatGPT account id and imports it into the
// broker; it returns the access token issued.
func (i *idp) login(t *testing.T, admin controlplanev1.AdminServiceClient, id string) string {
	t.Helper()
	issued, err := i.auth.Issue(id)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{AccessToken: issued.AccessToken, RefreshToken: issued.RefreshToken}); err != nil {
		t.Fatal(err)
	}
	return issued.AccessToken
}

// brokered returns a client taking its tokens from srv's broker, not run.
func brokered(t *testing.T, srv *controlplanetest.Server) *control.Client {
	t.Helper()
	c, err := control.New(control.Config{Target: srv.Addr, Token: srv.AgentToken, AgentID: "b-1-x", Broker: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The client learns its accounts from the broker, hands out the broker's
// token, and after an upstream 401 gets one replacement: one refresh at
// the identity provider however often the rejection is reported.
func TestTokensRejected(t *testing.T) {
	i := startIdP(t)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: i.endpoint})
	issued := i.login(t, adminClient(cp), "acct-a")
	src := brokered(t, cp)
	if err := src.Ready(); err == nil || !strings.Contains(err.Error(), "no ChatGPT access token") {
		t.Errorf("Ready() before any token = %v, want not ready: no access token yet", err)
	}
	learned, err := src.Accounts(t.Context())
	if err != nil || !slices.Equal(learned, []string{account.Key("acct-a")}) {
		t.Fatalf("Accounts = %v, %v; want the broker's one account", learned, err)
	}
	c, err := src.Credential(t.Context(), learned[0])
	if err != nil || c.AccessToken.Reveal() != issued || c.AccountID != "acct-a" || c.Expiry.IsZero() {
		t.Fatalf("Credential = %+v, %v; want the imported token for acct-a with its expiry", c, err)
	}
	if err := src.Ready(); err != nil {
		t.Errorf("Ready() with a token held = %v, want nil", err)
	}
	var first codexauth.Credential
	for n := range 3 {
		r, err := src.Rejected(t.Context(), learned[0], c.AccessToken)
		if err != nil || r.AccessToken == c.AccessToken {
			t.Fatalf("Rejected #%d = %v (same token %v); want a new token", n, err, r.AccessToken == c.AccessToken)
		}
		if n == 0 {
			first = r
		} else if r.AccessToken != first.AccessToken {
			t.Errorf("Rejected #%d handed out another token; want the first replacement again", n)
		}
	}
	if st := i.auth.Stats(); st.TokenRefreshes != 1 {
		t.Errorf("identity provider saw %d refreshes; want 1", st.TokenRefreshes)
	}

	// Without the broker: the turn is told to come back later.
	cp.Stop()
	_, err = src.Rejected(t.Context(), learned[0], first.AccessToken)
	var un *accounts.UnavailableError
	if !errors.As(err, &un) || un.RetryAfter <= 0 || un.RetryAfter > time.Minute {
		t.Errorf("Rejected with the control plane stopped = %v; want an UnavailableError with a retry hint", err)
	}
}

// A client serving two accounts hands out each account's own token by its
// account key, and learns both accounts.
func TestTokensSeveralAccounts(t *testing.T) {
	i := startIdP(t)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: i.endpoint})
	admin := adminClient(cp)
	tokens := map[string]string{}
	for _, id := range []string{"acct-a", "acct-b"} {
		tokens[id] = i.login(t, admin, id)
	}
	src := brokered(t, cp)
	keys, err := src.Accounts(t.Context()) // learns the accounts
	if err != nil {
		t.Fatal(err)
	}
	if want := slices.Sorted(slices.Values([]string{account.Key("acct-a"), account.Key("acct-b")})); !slices.Equal(keys, want) {
		t.Fatalf("Accounts = %v; want acct-a's and acct-b's keys, sorted", keys)
	}
	for _, id := range []string{"acct-b", "acct-a", "acct-b"} {
		c, err := src.Credential(t.Context(), account.Key(id))
		if err != nil || c.AccountID != id || c.AccessToken.Reveal() != tokens[id] {
			t.Fatalf("Credential(%s) = account %q, %v (right token: %v); want %s's imported token", id, c.AccountID, err, c.AccessToken.Reveal() == tokens[id], id)
		}
	}
	if _, err := src.Credential(t.Context(), account.Key("acct-unknown")); err == nil {
		t.Fatal("Credential for an account the broker does not hold succeeded; want an error")
	}
}

// Accounts says why no account can be served: a broker that cannot be
// reached is an UnavailableError naming the control plane; one that holds
// no sign-in is a LoginRequiredError telling the operator what to run.
func TestTokensNoAccounts(t *testing.T) {
	down := control.Config{Target: closedAddr(t), Token: tok(t, "agent"), AgentID: "b-1-x", Broker: true}
	c, err := control.New(down)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Accounts(t.Context())
	var un *accounts.UnavailableError
	if !errors.As(err, &un) || !strings.Contains(un.Message, "credential broker at "+down.Target) || un.RetryAfter <= 0 {
		t.Errorf("Accounts with no control plane = %v; want an UnavailableError naming the broker at %s with a retry hint", err, down.Target)
	}

	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: startIdP(t).endpoint})
	_, err = brokered(t, cp).Accounts(t.Context())
	var lr *accounts.LoginRequiredError
	if !errors.As(err, &lr) || !errors.Is(err, accounts.ErrLoginRequired) || !strings.Contains(lr.Message, "clodexctl account login") {
		t.Errorf("Accounts with no sign-in = %v; want a LoginRequiredError saying to run clodexctl account login", err)
	}
}

// Without Config.Broker the accounts are the configured ones and the
// broker's calls are refused.
func TestTokensFileMode(t *testing.T) {
	c, err := control.New(control.Config{Target: closedAddr(t), Token: tok(t, "agent"), AgentID: "f-1-x", Accounts: []string{keyB, keyA, keyB}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if keys, err := c.Accounts(t.Context()); err != nil || !slices.Equal(keys, slices.Sorted(slices.Values([]string{keyA, keyB}))) {
		t.Errorf("Accounts = %v, %v; want keyA and keyB, sorted and distinct", keys, err)
	}
	if _, err := c.Credential(t.Context(), keyA); err == nil || !strings.Contains(err.Error(), "Config.Broker is off") {
		t.Errorf("Credential without the broker = %v; want an error saying the broker is off", err)
	}
}
