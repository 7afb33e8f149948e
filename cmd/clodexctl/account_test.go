package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// account login runs the device-code flow against the emulator's issuer
// and hands the sign-in to the broker; import, list, show and remove
// manage it by ChatGPT account id or key. No token is ever printed.
func TestAccountCommands(t *testing.T) {
	a, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(a.Handler())
	t.Cleanup(idp.Close)
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: idp.URL + "/oauth/token"})

	out, errOut, err := ctl(t, srv, "account", "login", "--issuer", idp.URL)
	if err != nil || !strings.Contains(out, "account acct-sim (key "+account.Key("acct-sim")+") signed in") ||
		!strings.Contains(errOut, idp.URL+"/codex/device") {
		t.Fatalf("account login = %v\nstdout %s\nstderr %s", err, out, errOut)
	}
	auth := filepath.Join(t.TempDir(), "auth.json")
	if err := a.WriteAuthFile(auth, "acct-b"); err != nil {
		t.Fatal(err)
	}
	if out, _, err := ctl(t, srv, "account", "import", "--codex-auth", auth); err != nil || !strings.Contains(out, "acct-b") {
		t.Fatalf("account import = %v\n%s", err, out)
	}
	out, _, err = ctl(t, srv, "account", "list", "-o", "json")
	var views []loginView
	if err != nil || json.Unmarshal([]byte(out), &views) != nil || len(views) != 2 {
		t.Fatalf("account list = %v\n%s", err, out)
	}
	for _, v := range views {
		if v.State != "ok" || v.ExpiresAt == "" || (v.AccountID != "acct-sim" && v.AccountID != "acct-b") || v.Key != account.Key(v.AccountID) {
			t.Errorf("account list row %+v; want state ok, an expiry, account acct-sim or acct-b", v)
		}
	}
	if out, _, err := ctl(t, srv, "account", "show", "--key", account.Key("acct-b")); err != nil || !strings.Contains(out, "acct-b") {
		t.Errorf("account show --key = %v\n%s", err, out)
	}
	if _, _, err := ctl(t, srv, "account", "remove", "acct-b"); err != nil {
		t.Errorf("account remove: %v", err)
	}
	if _, _, err := ctl(t, srv, "account", "show", "acct-b"); err == nil || !strings.Contains(err.Error(), "holds no sign-in for acct-b") {
		t.Errorf("account show after remove = %v; want an error saying it holds no sign-in", err)
	}
	if _, _, err := ctl(t, srv, "account", "import"); err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "--codex-auth FILE") {
		t.Errorf("account import without --codex-auth = %v; want a usage error naming --codex-auth FILE", err)
	}

	plain := startServer(t)
	if _, _, err := ctl(t, plain, "account", "list"); err == nil || !strings.Contains(err.Error(), "--credential-key-file") {
		t.Errorf("account list without a broker = %v; want an error naming --credential-key-file", err)
	}
}

// agent create writes a new token (mode 0600) and registers it for the
// accounts named by id or key; it never overwrites a file.
func TestAgentCreate(t *testing.T) {
	srv := startServer(t)
	out := filepath.Join(t.TempDir(), "team.token")
	keyB := account.Key("acct-b")
	if o, _, err := ctl(t, srv, "agent", "create", "team", "--accounts", "acct-a,"+keyB, "--out", out); err != nil || !strings.Contains(o, out) {
		t.Fatalf("agent create = %v\n%s", err, o)
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 || fi.Size() < 20 {
		t.Fatalf("token file: %v, %v; want a token with mode 0600", err, fi)
	}
	o, _, err := ctl(t, srv, "agent", "list", "-o", "json")
	var views []agentCredView
	if err != nil || json.Unmarshal([]byte(o), &views) != nil || len(views) != 1 || views[0].Name != "team" ||
		strings.Join(views[0].Accounts, ",") != strings.Join(sorted(account.Key("acct-a"), keyB), ",") {
		t.Errorf("agent list = %v\n%s", err, o)
	}
	if _, _, err := ctl(t, srv, "agent", "create", "team2", "--accounts", "acct-a", "--out", out); err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "exists") {
		t.Errorf("agent create over an existing file = %v; want a usage error", err)
	}
	if _, _, err := ctl(t, srv, "agent", "remove", "team"); err != nil {
		t.Errorf("agent remove: %v", err)
	}
	if _, _, err := ctl(t, srv, "agent", "remove", "team"); err == nil || !strings.Contains(err.Error(), "no agent credential named team") {
		t.Errorf("agent remove twice = %v; want an error naming the missing credential", err)
	}
}

func sorted(s ...string) []string { slices.Sort(s); return s }

// A sign-in the identity provider refused for good shows as needs-login,
// with the reason and what to run.
func TestAccountListNeedsLogin(t *testing.T) {
	a, err := simauth.New(simauth.Config{TokenTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	idp := httptest.NewServer(a.Handler())
	t.Cleanup(idp.Close)
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: idp.URL + "/oauth/token"})
	auth := filepath.Join(t.TempDir(), "auth.json")
	if err := a.WriteAuthFile(auth, "acct-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl(t, srv, "account", "import", "--codex-auth", auth); err != nil {
		t.Fatal(err)
	}
	// Another program redeems the file's refresh token first.
	var f struct {
		Tokens struct {
			RefreshToken string `json:"refresh_token"`
		}
	}
	b, _ := os.ReadFile(auth)
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	resp, err := http.PostForm(idp.URL+"/oauth/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {f.Tokens.RefreshToken}, "client_id": {"x"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var out string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if out, _, err = ctl(t, srv, "account", "list"); err == nil && strings.Contains(out, "needs-login") {
			break
		}
	}
	if !strings.Contains(out, "needs-login (refresh_token_reused)") || !strings.Contains(out, "run `clodexctl account login`") {
		t.Errorf("account list = %v\n%s\nwant acct-a in state needs-login (refresh_token_reused) and the command to run", err, out)
	}
}
