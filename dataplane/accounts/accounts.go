// Package accounts chooses the upstream account of each new conversation
// when a data plane serves several ChatGPT accounts.
//
//	set := accounts.New(time.Now)
//	set.Add(id1); set.Add(id2)
//	set.ObserveRateLimits(id1, rl)      // every codex.rate_limits seen on id1
//	set.Limited(id2, resetsAt)          // id2 answered usage_limit_reached
//	id, err := set.Pick()               // the account of a new conversation
//
// Pick returns the account with the most headroom in its tightest window
// (translate.RateLimits.Headroom of the latest rate limits seen for it;
// an account never reported counts as full, 100), skipping accounts at a
// usage limit until their reset. Ties go round robin, so equal accounts
// share the load. When every account is at its limit Pick returns an
// *AllLimitedError naming the account whose reset comes first.
//
// Accounts are the raw ChatGPT account ids of the credentials (the pool's
// Partition.Account); they never reach logs from here.
package accounts

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/account"
)

// ErrNone is returned by Pick on a Set without accounts.
var ErrNone = errors.New("no upstream account is known yet")

// ErrAllDown is returned by Pick when no account is at its usage limit
// but every one is marked Down: none has a usable sign-in.
var ErrAllDown = errors.New("no upstream account has a usable sign-in")

// AllLimitedError is Pick's answer when every account is at its usage
// limit: Account (a raw id) resets first, at ResetsAt.
type AllLimitedError struct {
	Account  string
	ResetsAt time.Time
	// ResetsIn is ResetsAt less the Set's clock at the Pick.
	ResetsIn time.Duration
}

func (e *AllLimitedError) Error() string {
	return fmt.Sprintf("every upstream account is at its usage limit; the first reset is %s's at %s",
		account.Key(e.Account), e.ResetsAt.UTC().Format(time.RFC3339))
}

// state is what the Set knows of one account.
type state struct {
	limits       translate.RateLimits
	limitedUntil time.Time // at its usage limit until then; zero: not known limited
	downUntil    time.Time // its sign-in is unusable until then (Down)
}

// Set is the accounts a data plane serves and what it knows of their
// limits. It is safe for concurrent use.
type Set struct {
	now func() time.Time

	mu    sync.Mutex // guards the following fields
	order []string   // in the order added
	state map[string]*state
	next  int // round-robin cursor into order
}

// New returns an empty Set reading time from now (time.Now when nil).
func New(now func() time.Time) *Set {
	if now == nil {
		now = time.Now
	}
	return &Set{now: now, state: map[string]*state{}}
}

// Add makes id servable; adding it again changes nothing. An empty id is
// ignored.
func (s *Set) Add(id string) {
	if id == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.state[id]; !ok {
		s.state[id] = &state{}
		s.order = append(s.order, id)
	}
}

// Accounts returns the accounts in the order they were added.
func (s *Set) Accounts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.order)
}

// Len is the number of accounts.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.order)
}

// ObserveRateLimits records the latest plan usage seen for id (adding id
// when new). Rate limits that say the limit is reached mark id limited
// until the latest reset among its exhausted windows, when one is known.
func (s *Set) ObserveRateLimits(id string, rl translate.RateLimits) {
	if id == "" {
		return
	}
	s.Add(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.state[id]
	st.limits = rl
	if rl.LimitReached {
		var until time.Time
		for _, w := range rl.Windows {
			if w.UsedPercent >= 100 && w.ResetsAt.After(until) {
				until = w.ResetsAt
			}
		}
		if until.After(st.limitedUntil) {
			st.limitedUntil = until
		}
	}
}

// Limited marks id at its usage limit until resetsAt (adding id when new).
// A later reset already known is kept.
func (s *Set) Limited(id string, resetsAt time.Time) {
	if id == "" {
		return
	}
	s.Add(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.state[id]; resetsAt.After(st.limitedUntil) {
		st.limitedUntil = resetsAt
	}
}

// Down marks id's sign-in unusable for d (a credential that needs an
// operator's login): Pick skips it meanwhile, without counting it as
// limited.
func (s *Set) Down(id string, d time.Duration) {
	if id == "" {
		return
	}
	until := s.now().Add(d)
	s.Add(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.state[id]; until.After(st.downUntil) {
		st.downUntil = until
	}
}

// LimitedUntil reports whether id is known to be at its usage limit now,
// and until when.
func (s *Set) LimitedUntil(id string) (time.Time, bool) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.state[id]
	if !ok || !now.Before(st.limitedUntil) {
		return time.Time{}, false
	}
	return st.limitedUntil, true
}

// Pick returns the account for a new conversation: among the accounts not
// at their usage limit, one with the most headroom; ties are broken round
// robin; accounts marked Down are skipped. It returns ErrNone without
// accounts, an *AllLimitedError when none is usable and some are at their
// limit, else ErrAllDown.
func (s *Set) Pick() (string, error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.order)
	if n == 0 {
		return "", ErrNone
	}
	best, bestHead := -1, -1.0
	var first *AllLimitedError
	for i := range n {
		j := (s.next + i) % n
		id := s.order[j]
		st := s.state[id]
		if now.Before(st.limitedUntil) {
			if first == nil || st.limitedUntil.Before(first.ResetsAt) {
				first = &AllLimitedError{Account: id, ResetsAt: st.limitedUntil, ResetsIn: st.limitedUntil.Sub(now)}
			}
			continue
		}
		if now.Before(st.downUntil) {
			continue
		}
		if h := st.limits.Headroom(now); h > bestHead {
			best, bestHead = j, h
		}
	}
	if best < 0 {
		if first == nil {
			return "", ErrAllDown
		}
		return "", first
	}
	s.next = (best + 1) % n
	return s.order[best], nil
}
