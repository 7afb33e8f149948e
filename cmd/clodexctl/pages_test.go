package main

import (
	"encoding/json"
	"fmt"
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
