package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// clodexctl accounts reads every page: 1001 accounts are three pages of
// the server's default 500, and every one is listed once, in key order.
func TestAccountsEveryPage(t *testing.T) {
	srv := startServer(t)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	const n = 1001
	want := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		k := account.Key(fmt.Sprintf("chatgpt-account-%d", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: k, RatePerMinute: 30}); err != nil {
				errs <- err
				return
			}
			mu.Lock()
			want[k] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	out, _, err := ctl(t, srv, "accounts", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not a JSON array: %v", err)
	}
	if len(got) != n {
		t.Fatalf("accounts lists %d, want %d", len(got), n)
	}
	for i, a := range got {
		if !want[a.Key] {
			t.Errorf("accounts[%d] = %s, not set or listed twice", i, a.Key)
		}
		delete(want, a.Key)
		if i > 0 && got[i-1].Key >= a.Key {
			t.Errorf("accounts[%d] = %s after %s, want key order", i, a.Key, got[i-1].Key)
		}
	}
}

// agent list reads every page: 45 scoped credentials are three pages of
// the server's default 20.
func TestAgentListEveryPage(t *testing.T) {
	srv := startServer(t)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	const n = 45
	var want []string
	for i := range n {
		name := fmt.Sprintf("team-%02d", i)
		want = append(want, name)
		sum := sha256.Sum256([]byte("token-of-" + name))
		if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{
			Name: name, Accounts: []string{account.Key("acct-a")}, TokenSha256: sum[:],
		}); err != nil {
			t.Fatal(err)
		}
	}
	first, err := admin.ListAgentCredentials(t.Context(), &controlplanev1.ListAgentCredentialsRequest{})
	if err != nil || len(first.GetCredentials()) != 20 || first.GetNextPageToken() == "" {
		t.Fatalf("first page = %d credentials, next %q, %v; want 20 and a next page", len(first.GetCredentials()), first.GetNextPageToken(), err)
	}
	out, _, err := ctl(t, srv, "agent", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var views []agentCredView
	if err := json.Unmarshal([]byte(out), &views); err != nil {
		t.Fatalf("agent list -o json: %v\n%s", err, out)
	}
	var got []string
	for _, v := range views {
		got = append(got, v.Name)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("agent list = %v, want all %d credentials in order %v", got, n, want)
	}
}
