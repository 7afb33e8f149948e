package codexsim

import (
	"sync"
	"time"
)

// throttle is the per-account upgrade limiter: a sliding window of upgrade
// times per account, plus optional instantaneous and open-socket limits.
type throttle struct {
	mu       sync.Mutex // guards the following fields
	accounts map[string]*accountWindow
}

type accountWindow struct {
	counted     []time.Time // attempts that count toward the window, oldest first
	accepted    []time.Time // accepted upgrades in the window, oldest first
	open        int         // open sockets
	maxAccepted int         // most accepted upgrades ever seen in one window
}

// limits are the throttle knobs read at each attempt.
type limits struct {
	upgradeLimit   int
	window         time.Duration
	countRejected  bool
	instantLimit   int
	maxOpenSockets int
}

// rejection names why admit refused an upgrade.
type rejection string

const (
	rejectNone    rejection = ""
	rejectWindow  rejection = "window"
	rejectInstant rejection = "instant"
	rejectSockets rejection = "open_sockets"
)

func newThrottle() *throttle {
	return &throttle{accounts: make(map[string]*accountWindow)}
}

// prune drops times at or before now-window from the front of ts.
func prune(ts []time.Time, now time.Time, window time.Duration) []time.Time {
	i := 0
	for i < len(ts) && now.Sub(ts[i]) >= window {
		i++
	}
	if i == 0 {
		return ts
	}
	return append(ts[:0], ts[i:]...)
}

// admit decides one upgrade attempt for account at now and records it.
func (t *throttle) admit(account string, now time.Time, l limits) rejection {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.accounts[account]
	if w == nil {
		w = &accountWindow{}
		t.accounts[account] = w
	}
	w.counted = prune(w.counted, now, l.window)
	w.accepted = prune(w.accepted, now, l.window)
	reason := rejectNone
	switch {
	case len(w.counted) >= l.upgradeLimit:
		reason = rejectWindow
	case l.instantLimit > 0 && countSince(w.counted, now, time.Second) >= l.instantLimit:
		reason = rejectInstant
	case l.maxOpenSockets > 0 && w.open >= l.maxOpenSockets:
		reason = rejectSockets
	}
	if reason != rejectNone {
		if l.countRejected {
			w.counted = append(w.counted, now)
		}
		return reason
	}
	w.counted = append(w.counted, now)
	w.accepted = append(w.accepted, now)
	w.open++
	w.maxAccepted = max(w.maxAccepted, len(w.accepted))
	return rejectNone
}

// countSince counts the times in ts within d before now.
func countSince(ts []time.Time, now time.Time, d time.Duration) int {
	n := 0
	for i := len(ts) - 1; i >= 0 && now.Sub(ts[i]) < d; i-- {
		n++
	}
	return n
}

// release records that a socket admitted for account has closed.
func (t *throttle) release(account string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.accounts[account]; w != nil && w.open > 0 {
		w.open--
	}
}

// maxPerWindow returns the most accepted upgrades seen in one window, by account.
func (t *throttle) maxPerWindow() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	m := make(map[string]int, len(t.accounts))
	for a, w := range t.accounts {
		if w.maxAccepted > 0 {
			m[a] = w.maxAccepted
		}
	}
	return m
}
