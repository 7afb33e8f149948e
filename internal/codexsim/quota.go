package codexsim

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// Defaults of Quota.
const (
	DefaultPrimaryWindow   = 5 * time.Hour
	DefaultSecondaryWindow = 7 * 24 * time.Hour
	DefaultPrimaryStart    = 7
	DefaultSecondaryStart  = 29
	DefaultQuotaPlan       = "pro"
)

// Quota is the plan usage the emulator reports in codex.rate_limits,
// per account. Each account starts a window at its first response with
// the window's starting percent; every completed generating response adds
// its per-response percent to both windows; a window that has run its
// length starts over at 0. A response.create while a window is at 100 %
// or more is answered usage_limit_reached, resetting when that window
// does. The zero value reports 7 % of 5 hours and 29 % of a week that
// never move, as the real backend's example does.
type Quota struct {
	// PrimaryWindow and SecondaryWindow are the windows' lengths.
	// (Optional) Default 5h and 168h.
	PrimaryWindow, SecondaryWindow time.Duration
	// PrimaryStart and SecondaryStart are each account's used percent when
	// a window starts for the first time. (Optional) Default 7 and 29;
	// a negative value means 0.
	PrimaryStart, SecondaryStart float64
	// PrimaryPerResponse and SecondaryPerResponse are the percent each
	// completed generating response uses. (Optional) Default 0.
	PrimaryPerResponse, SecondaryPerResponse float64
	// Plan is the reported plan_type. (Optional) Default "pro".
	Plan string
}

func (q *Quota) validate() []error {
	var errs []error
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"Quota.PrimaryWindow", q.PrimaryWindow}, {"Quota.SecondaryWindow", q.SecondaryWindow}} {
		if f.v < 0 || f.v > 366*24*time.Hour {
			errs = append(errs, fmt.Errorf("%s %v is invalid; want 0 (default) or a positive duration up to 8784h", f.name, f.v))
		}
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"Quota.PrimaryStart", q.PrimaryStart}, {"Quota.SecondaryStart", q.SecondaryStart},
		{"Quota.PrimaryPerResponse", q.PrimaryPerResponse}, {"Quota.SecondaryPerResponse", q.SecondaryPerResponse}} {
		if math.IsNaN(f.v) || f.v < -1 || f.v > 1000 {
			errs = append(errs, fmt.Errorf("%s %v is invalid; want a percent in 0..1000", f.name, f.v))
		}
	}
	if q.Plan != "" && !validCode(q.Plan) {
		errs = append(errs, fmt.Errorf("Quota.Plan %q is invalid; want a plan name such as plus or pro", clip(q.Plan, 64)))
	}
	return errs
}

func (q Quota) withDefaults() Quota {
	if q.PrimaryWindow == 0 {
		q.PrimaryWindow = DefaultPrimaryWindow
	}
	if q.SecondaryWindow == 0 {
		q.SecondaryWindow = DefaultSecondaryWindow
	}
	if q.PrimaryStart == 0 {
		q.PrimaryStart = DefaultPrimaryStart
	}
	if q.SecondaryStart == 0 {
		q.SecondaryStart = DefaultSecondaryStart
	}
	q.PrimaryStart, q.SecondaryStart = max(q.PrimaryStart, 0), max(q.SecondaryStart, 0)
	if q.Plan == "" {
		q.Plan = DefaultQuotaPlan
	}
	return q
}

// planUsage is every account's windows.
type planUsage struct {
	mu       sync.Mutex // guards accounts
	accounts map[string]*[2]window
}

// window is one account's window: used percent since start.
type window struct {
	used  float64
	start time.Time
}

// windowView is a window as reported at one instant.
type windowView struct {
	used    float64
	minutes int64
	resetAt time.Time
}

// state returns account's windows at now, starting or restarting them.
func (u *planUsage) stateLocked(account string, q Quota, now time.Time) *[2]window {
	if u.accounts == nil {
		u.accounts = map[string]*[2]window{}
	}
	w := u.accounts[account]
	if w == nil {
		w = &[2]window{{used: q.PrimaryStart, start: now}, {used: q.SecondaryStart, start: now}}
		u.accounts[account] = w
	}
	for i, length := range []time.Duration{q.PrimaryWindow, q.SecondaryWindow} {
		if elapsed := now.Sub(w[i].start); elapsed >= length {
			w[i] = window{start: w[i].start.Add(elapsed / length * length)}
		}
	}
	return w
}

// view returns account's primary and secondary windows at now.
func (u *planUsage) view(account string, q Quota, now time.Time) [2]windowView {
	u.mu.Lock()
	defer u.mu.Unlock()
	w := u.stateLocked(account, q, now)
	var out [2]windowView
	for i, length := range []time.Duration{q.PrimaryWindow, q.SecondaryWindow} {
		out[i] = windowView{used: w[i].used, minutes: int64(length / time.Minute), resetAt: w[i].start.Add(length)}
	}
	return out
}

// limit returns when account's full window resets, when one is at 100 %
// or more at now.
func (u *planUsage) limit(account string, q Quota, now time.Time) (time.Time, bool) {
	v := u.view(account, q, now)
	var reset time.Time
	for _, w := range v {
		if w.used >= 100 && w.resetAt.After(reset) {
			reset = w.resetAt
		}
	}
	return reset, !reset.IsZero()
}

// use adds one completed generating response to account's windows.
func (u *planUsage) use(account string, q Quota, now time.Time) {
	if q.PrimaryPerResponse <= 0 && q.SecondaryPerResponse <= 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	w := u.stateLocked(account, q, now)
	w[0].used += max(q.PrimaryPerResponse, 0)
	w[1].used += max(q.SecondaryPerResponse, 0)
}
