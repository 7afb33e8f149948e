package redisstore

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/controlplane/store/storetest"
	"github.com/clodex/clodex/internal/pacing"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const key = "acct_0123456789abcdef"

// What the control plane's server reads of the Redis store.
var (
	_ controlplane.Admitter      = (*Store)(nil)
	_ controlplane.PolicyStore   = (*Store)(nil)
	_ controlplane.AgentCounter  = (*Store)(nil)
	_ controlplane.AgentRoster   = (*Store)(nil)
	_ controlplane.QuotaStore    = (*Store)(nil)
	_ controlplane.PolicyWatcher = (*Store)(nil)
)

// What the credential broker and the server need of its logins.
var (
	_ broker.Logins               = (*Store)(nil)
	_ controlplane.AgentCredStore = (*Store)(nil)
)

// Every store of the suite is another replica's view of one redis-server
// (a real one): a peer shares the store's key prefix.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	storetest.Run(t, storetest.Kind{
		Open: func(t *testing.T, now func() time.Time, defaults *pacing.Policy) storetest.Store {
			return openRedisAt(t, srv, now, defaults)
		},
		Peer: func(t *testing.T, s storetest.Store, now func() time.Time) storetest.Store {
			b, err := Open(t.Context(), Options{URL: srv.URL, Prefix: s.(*Store).prefix, Now: now, Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			return b
		},
	})
}

var prefixSeq atomic.Int64

// openRedisAt opens a Redis store with a prefix no other store in this
// process uses, so stores sharing one redis-server start empty.
func openRedisAt(t testing.TB, srv *redistest.Server, now func() time.Time, defaults *pacing.Policy) *Store {
	t.Helper()
	r, err := Open(t.Context(), Options{
		URL:      srv.URL,
		Prefix:   fmt.Sprintf("t%d:", prefixSeq.Add(1)),
		Defaults: defaults,
		Now:      now,
		Timeout:  5 * time.Second, // tests assert decisions here, not deadlines
	})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func mustAdmit(t *testing.T, s *Store, key string, now time.Time) store.Admission {
	t.Helper()
	a, err := s.Admit(t.Context(), key, now)
	if err != nil {
		t.Fatalf("Admit(%s, %v): %v", key, now.Sub(t0), err)
	}
	return a
}

func mustTokens(t *testing.T, s *Store, key string, now time.Time) float64 {
	t.Helper()
	a, err := s.Account(t.Context(), key, now)
	if err != nil {
		t.Fatalf("Account(%s): %v", key, err)
	}
	return a.Tokens
}
