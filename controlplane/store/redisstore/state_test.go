package redisstore

import (
	"fmt"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/pacing"
)

// An account state in the text format earlier versions wrote (field 's',
// 15 integers, or 13 before the pause) is read by both the admit script
// and the prelude's readers, and replaced by the packed field 'S' on the
// next write.
func TestLegacyTextStateIsReadAndRewritten(t *testing.T) {
	rs := redistest.Start(t)
	raw := rawClient(t, rs)
	ctx := t.Context()
	clk := &fixedClock{t: t0}
	r := openReplica(t, rs, "old:", "cp-a", &Options{Now: clk.Now, Defaults: &pacing.Policy{RatePerMinute: 60, Burst: 10, Budget: pacing.DefaultBudget()}})
	bound := r.defaults.Budget.WaitBound.Milliseconds()
	retries := r.defaults.Budget.MaxRetries
	us := t0.UnixMicro()
	// 2 tokens left at t0, reservation ids up to 7, no pending ones;
	// adaptive off at the configured rate.
	const units = 2 * 60_000_000_000
	states := map[string]string{
		"acct_00000000000000d1": fmt.Sprintf("%d %d 7 8 0 60 10 %d %d 0 60 -1 %d 0 0", units, us, bound, retries, us),
		"acct_00000000000000d2": fmt.Sprintf("%d %d 7 8 0 60 10 %d %d 0 60 -1 %d", units, us, bound, retries, us), // 13 fields
	}
	for k, s := range states {
		if err := raw.HSet(ctx, "old:a:"+k, "s", s).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for k := range states {
		if got := mustTokens(t, r.Store, k, t0); got != 2 {
			t.Errorf("%s: Account over a text state of 2 tokens = %v tokens; want 2", k, got)
		}
		for i := range 2 {
			a := mustAdmit(t, r.Store, k, t0)
			if a.Decision.Kind != pacing.KindAdmit || a.Decision.Wait != 0 || a.Decision.ID != uint64(8+i) {
				t.Errorf("%s: Admit %d over a text state of 2 tokens = %+v; want admitted now as reservation %d", k, i+1, a.Decision, 8+i)
			}
		}
		if a := mustAdmit(t, r.Store, k, t0); a.Decision.Kind == pacing.KindAdmit && a.Decision.Wait == 0 {
			t.Errorf("%s: third Admit = %+v; want a wait or a refusal (the bucket is empty)", k, a.Decision)
		}
		fields, err := raw.HKeys(ctx, "old:a:"+k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(fields, ","); strings.Contains(","+got+",", ",s,") || !strings.Contains(","+got+",", ",S,") {
			t.Errorf("%s: fields after the writes = %s; want S and no s", k, got)
		}
	}
}
