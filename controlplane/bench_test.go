package controlplane_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// BenchmarkRPC compares Admit with the no-op floor through the same
// server, listener, authentication and stats handler, in one process.
// scripts/bench-controlplane.sh measures the same with the load generator
// in a separate process.
func BenchmarkRPC(b *testing.B) {
	srv := controlplanetest.Start(b, &controlplanetest.Options{
		EnableBench: true,
		Defaults:    &pacing.Policy{RatePerMinute: 600, Burst: 1000, Budget: pacing.DefaultBudget()},
	})
	cc := srv.Dial(srv.AgentToken, nil)
	admission := controlplanev1.NewAdmissionServiceClient(cc)
	noop := controlplanev1.NewBenchServiceClient(cc)
	// At most the agent credential's cap of registered accounts.
	for _, accounts := range []int{1, controlplane.DefaultMaxAccountsPerCredential} {
		keys := make([]string, accounts)
		for i := range keys {
			keys[i] = account.Key(fmt.Sprint("bench-", i))
		}
		var next atomic.Uint64
		key := func() string { return keys[next.Add(1)%uint64(len(keys))] }
		b.Run(fmt.Sprintf("noop/accounts=%d", accounts), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := noop.Noop(b.Context(), &controlplanev1.NoopRequest{Account: key()}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
		b.Run(fmt.Sprintf("admit/accounts=%d", accounts), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := admission.Admit(b.Context(), &controlplanev1.AdmitRequest{Account: key(), AgentId: "bench"}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
