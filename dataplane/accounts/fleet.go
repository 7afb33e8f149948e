package accounts

import (
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// FleetView is the fleet's plan usage as the control plane pushes it
// (QuotaPush): per account, the latest figures any data plane reported,
// with the time they were read (RateLimits.at_unix_ms). The
// control-plane client (dataplane/control) implements it.
type FleetView interface {
	FleetLimits(key string) (*controlplanev1.RateLimits, bool)
}

// limitsLocked returns the plan usage a new conversation's choice judges
// the account with key by, and until when the account is at its limit:
// the router's own figures (read from its sockets' frames), or the
// fleet's when it has none of its own or the fleet's were read later. So
// an account another data plane found at 90 % is not taken for an unused
// one here, and one the fleet found at its limit takes no new
// conversation until its reset.
func (r *Router) limitsLocked(key string, st *state) (RateLimits, time.Time) {
	lim, until := st.limits, st.limitedUntil
	if r.fleet == nil {
		return lim, until
	}
	m, ok := r.fleet.FleetLimits(key)
	if !ok || m.GetAtUnixMs() <= 0 {
		return lim, until
	}
	if at := time.UnixMilli(m.GetAtUnixMs()); !st.limitsAt.IsZero() && !at.After(st.limitsAt) {
		return lim, until
	}
	lim = fromMessage(m)
	if u := lim.exhaustedUntil(); u.After(until) {
		until = u
	}
	return lim, until
}

// fromMessage is a RateLimits message as the router's RateLimits.
func fromMessage(m *controlplanev1.RateLimits) RateLimits {
	rl := RateLimits{PlanType: m.GetPlanType(), LimitReached: m.GetLimitReached()}
	for _, w := range m.GetWindows() {
		win := RateLimitWindow{Name: w.GetName(), UsedPercent: min(max(w.GetUsedPercent(), 0), 1000),
			Window: time.Duration(w.GetWindowMinutes()) * time.Minute}
		if ms := w.GetResetsAtUnixMs(); ms > 0 {
			win.ResetsAt = time.UnixMilli(ms)
		}
		rl.Windows = append(rl.Windows, win)
	}
	return rl
}
