package store_test

import (
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/controlplane/store/storetest"
	"github.com/clodex/clodex/internal/pacing"
)

// What the control plane's server reads of the memory store.
var (
	_ controlplane.Admitter      = (*store.Memory)(nil)
	_ controlplane.PolicyStore   = (*store.Memory)(nil)
	_ controlplane.AgentCounter  = (*store.Memory)(nil)
	_ controlplane.QuotaStore    = (*store.Memory)(nil)
	_ controlplane.MemberBuckets = (*store.Memory)(nil)
)

// What the credential broker and the server need of the logins file.
var (
	_ broker.Logins               = (*store.LoginFile)(nil)
	_ controlplane.AgentCredStore = (*store.LoginFile)(nil)
	_ controlplane.MemberStore    = (*store.LoginFile)(nil)
)

// The memory store serves every handle of one process: a peer is the
// store itself.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Kind{
		Open: func(t *testing.T, now func() time.Time, defaults *pacing.Policy) storetest.Store {
			m, err := store.Open(store.Options{Now: now, Defaults: defaults})
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		Peer: func(_ *testing.T, s storetest.Store, _ func() time.Time) storetest.Store { return s },
	})
}
