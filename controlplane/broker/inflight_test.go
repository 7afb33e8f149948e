package broker_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/internal/account"
)

// A refresh whose caller gave up goes on (its refresh token is redeemed and
// must be written back), and Run, stopped meanwhile, returns only once it
// has written the rotated tokens: nothing writes the logins after Run.
func TestRunWaitsForARefreshInFlight(t *testing.T) {
	p := startIDP(t, time.Hour)
	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	gate := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(reached) })
		<-release
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(p.url, r.Header.Get("Content-Type"), bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	}))
	t.Cleanup(gate.Close)
	b, err := broker.New(broker.Options{Logins: openLogins(t, t.TempDir()), Key: newKey(t), TokenEndpoint: gate.URL, Now: p.clock.Now, Tick: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	importIssued(t, b, p, "acct-a")
	key := account.Key("acct-a")
	p.clock.Advance(time.Hour - 100*time.Second) // within the 120 s skew: due

	runCtx, stopRun := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- b.Run(runCtx) }()
	tctx, giveUp := context.WithCancel(t.Context())
	go func() { <-reached; giveUp() }()
	if _, err := b.Token(tctx, key, ""); !errors.Is(err, context.Canceled) {
		t.Fatalf("Token whose caller gave up mid-refresh = %v; want context.Canceled", err)
	}
	stopRun()
	close(release)
	if err := <-ran; err != nil {
		t.Fatalf("Run = %v", err)
	}
	st, err := b.Get(t.Context(), key)
	if err != nil || st.Refreshes != 1 {
		t.Errorf("when Run returned: Get = %+v, %v; want the refresh written (1 refresh)", st, err)
	}
	if got := p.a.Stats().TokenRefreshes; got != 1 {
		t.Errorf("identity provider saw %d refreshes; want 1", got)
	}
}
