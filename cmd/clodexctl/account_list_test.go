package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// account list says what last wrote the tokens: a sign-in (import or
// login) until the broker's first refresh, a refresh after, so the time
// shown never claims a refresh that did not happen.
func TestAccountListUpdated(t *testing.T) {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli()
	ka, kb := account.Key("acct-a"), account.Key("acct-b")
	var b strings.Builder
	if err := writeLogins(&b, []loginView{
		loginViewOf(&controlplanev1.Login{Key: ka, AccountId: "acct-a", RefreshedAtUnixMs: at}),
		loginViewOf(&controlplanev1.Login{Key: kb, AccountId: "acct-b", RefreshedAtUnixMs: at, Refreshes: 3}),
	}); err != nil {
		t.Fatal(err)
	}
	rowOf := func(key string) map[string]string {
		var header []string
		for _, line := range strings.Split(b.String(), "\n") {
			f := splitColumns(line)
			if len(f) > 0 && f[0] == "KEY" {
				header = f
			} else if len(f) == len(header) && f[0] == key {
				row := map[string]string{}
				for i, h := range header {
					row[h] = f[i]
				}
				return row
			}
		}
		t.Fatalf("no row for %s in\n%s", key, b.String())
		return nil
	}
	if r := rowOf(ka); r["UPDATED"] != "2026-12-01T10:00:00Z (sign-in)" || r["REFRESHES"] != "0" {
		t.Errorf("never refreshed: row %v; want UPDATED 2026-12-01T10:00:00Z (sign-in), REFRESHES 0", r)
	}
	if r := rowOf(kb); r["UPDATED"] != "2026-12-01T10:00:00Z (refresh)" || r["REFRESHES"] != "3" {
		t.Errorf("refreshed: row %v; want UPDATED 2026-12-01T10:00:00Z (refresh), REFRESHES 3", r)
	}

	// From the broker: an import just made is a sign-in.
	idp, err := simauth.New(simauth.Config{})
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true})
	auth := filepath.Join(t.TempDir(), "auth.json")
	if err := idp.WriteAuthFile(auth, "acct-a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ctl(t, srv, "account", "import", "--codex-auth", auth); err != nil {
		t.Fatal(err)
	}
	out, _, err := ctl(t, srv, "account", "list", "-o", "json")
	var views []loginView
	if err != nil || json.Unmarshal([]byte(out), &views) != nil || len(views) != 1 ||
		views[0].UpdatedBy != "sign-in" || views[0].UpdatedAt == "" || views[0].Refreshes != 0 || strings.Contains(out, "refreshed_at") {
		t.Errorf("account list -o json after an import = %v\n%s\nwant updated_by sign-in, an updated_at and 0 refreshes", err, out)
	}
}
