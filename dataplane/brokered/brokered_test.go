package brokered_test

import (
	"errors"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/brokered"
	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The source learns its accounts from the broker, hands out the broker's
// token, and after an upstream 401 gets one replacement: one refresh at
// the identity provider however often the rejection is reported.
func TestSourceRejected(t *testing.T) {
	a, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(a.Handler())
	t.Cleanup(idp.Close)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: idp.URL + "/oauth/token"})
	issued, err := a.Issue("acct-a")
	if err != nil {
		t.Fatal(err)
	}
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{AccessToken: issued.AccessToken, RefreshToken: issued.RefreshToken}); err != nil {
		t.Fatal(err)
	}
	var learned []string
	src, err := brokered.New(brokered.Config{Conn: cp.Dial(cp.AgentToken, nil), OnAccounts: func(k []string) { learned = k }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := src.Credential(t.Context())
	if err != nil || c.AccessToken.Reveal() != issued.AccessToken || c.AccountID != "acct-a" || c.Expiry.IsZero() {
		t.Fatalf("Credential = %+v, %v; want the imported token for acct-a with its expiry", c, err)
	}
	if !slices.Equal(learned, []string{account.Key("acct-a")}) {
		t.Errorf("OnAccounts got %v; want the broker's one account", learned)
	}
	var first codexauth.Credential
	for i := range 3 {
		n, err := src.Rejected(t.Context(), c.AccessToken)
		if err != nil || n.AccessToken == c.AccessToken {
			t.Fatalf("Rejected #%d = %v (same token %v); want a new token", i, err, n.AccessToken == c.AccessToken)
		}
		if i == 0 {
			first = n
		} else if n.AccessToken != first.AccessToken {
			t.Errorf("Rejected #%d handed out another token; want the first replacement again", i)
		}
	}
	if st := a.Stats(); st.TokenRefreshes != 1 {
		t.Errorf("identity provider saw %d refreshes; want 1", st.TokenRefreshes)
	}

	// Without the broker: the turn is told to come back later.
	cp.Stop()
	_, err = src.Rejected(t.Context(), first.AccessToken)
	var un *credentials.UnavailableError
	if !errors.As(err, &un) || un.RetryAfter <= 0 || un.RetryAfter > time.Minute {
		t.Errorf("Rejected with the control plane stopped = %v; want an UnavailableError with a retry hint", err)
	}
}

// A source serving two accounts hands out each account's own token by its
// account id, and names each account id once as its first token arrives.
func TestSourceSeveralAccounts(t *testing.T) {
	a, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(a.Handler())
	t.Cleanup(idp.Close)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: idp.URL + "/oauth/token"})
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	tokens := map[string]string{}
	for _, id := range []string{"acct-a", "acct-b"} {
		issued, err := a.Issue(id)
		if err != nil {
			t.Fatal(err)
		}
		tokens[id] = issued.AccessToken
		if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{AccessToken: issued.AccessToken, RefreshToken: issued.RefreshToken}); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	src, err := brokered.New(brokered.Config{Conn: cp.Dial(cp.AgentToken, nil), OnAccountID: func(id string) { ids = append(ids, id) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Credential(t.Context()); err != nil { // learns the accounts
		t.Fatal(err)
	}
	for _, id := range []string{"acct-b", "acct-a", "acct-b"} {
		c, err := src.CredentialFor(t.Context(), id)
		if err != nil || c.AccountID != id || c.AccessToken.Reveal() != tokens[id] {
			t.Fatalf("CredentialFor(%s) = account %q, %v (right token: %v); want %s's imported token", id, c.AccountID, err, c.AccessToken.Reveal() == tokens[id], id)
		}
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"acct-a", "acct-b"}) {
		t.Fatalf("OnAccountID got %v; want acct-a and acct-b once each", ids)
	}
	if _, err := src.CredentialFor(t.Context(), "acct-unknown"); err == nil {
		t.Fatal("CredentialFor an account the broker does not hold succeeded; want an error")
	}
}
