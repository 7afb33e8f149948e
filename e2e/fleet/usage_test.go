package fleet

import (
	"context"
	"encoding/json"
	"math"
	"time"
)

// usageTotals are the sums of clodexctl usage -o json's rows.
type usageTotals struct {
	Turns        int64 `json:"turns"`
	InputTokens  int64 `json:"input_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	NewSockets   int64 `json:"new_sockets"`
	Refusals     int64 `json:"refusals"`
}

// usageMatches checks the usage ledger against what clodex-sim counted
// over the whole run (a control plane killed and restarted twice, turns
// refused and failed on 403s included): the input, cached and output
// tokens, and the new sockets against its upgrades, within 1 %. The data
// planes send their usage every second (--usage-flush 1s), so the ledger
// catches up within a few; the figures are logged.
func (h *harness) usageMatches(ctx context.Context) {
	t, f := h.t, h.f
	within := func(got, want int64) bool {
		return math.Abs(float64(got-want)) <= 0.01*float64(want)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := f.ControlPlane.Ctl(ctx, "usage", "--by", "agent", "--since", "1h", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		var v struct{ Rows []usageTotals }
		if err := json.Unmarshal(out, &v); err != nil {
			t.Fatalf("clodexctl usage -o json: %v\n%s", err, out)
		}
		var led usageTotals
		for _, r := range v.Rows {
			led.Turns += r.Turns
			led.InputTokens += r.InputTokens
			led.CachedTokens += r.CachedTokens
			led.OutputTokens += r.OutputTokens
			led.NewSockets += r.NewSockets
			led.Refusals += r.Refusals
		}
		st, err := f.Sim.Stats(ctx, h.client)
		if err != nil {
			t.Fatal(err)
		}
		ok := within(led.InputTokens, st.InputTokens) && within(led.CachedTokens, st.CachedTokens) &&
			within(led.OutputTokens, st.OutputTokens) && within(led.NewSockets, st.Upgrades)
		if ok || time.Now().After(deadline) {
			t.Logf("ledger (%d agents): %d turns (%d refused), %d input, %d cached, %d output tokens, %d new sockets", len(v.Rows),
				led.Turns, led.Refusals, led.InputTokens, led.CachedTokens, led.OutputTokens, led.NewSockets)
			t.Logf("clodex-sim: %d completed responses, %d input, %d cached, %d output tokens, %d upgrades",
				st.CompletedResponses, st.InputTokens, st.CachedTokens, st.OutputTokens, st.Upgrades)
			if !ok {
				t.Errorf("the usage ledger does not hold what clodex-sim counted within 1 %% after 30 s (figures above)")
			}
			return
		}
		if err := sleepUntil(ctx, time.Now().Add(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
}
