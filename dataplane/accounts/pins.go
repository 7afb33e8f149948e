package accounts

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/clodex/clodex/dataplane/pool"
)

// A turn's member and request narrow the router's choice (docs/credentials.md
// §10): a member with accounts uses only those (the ones this data plane
// serves); a request naming an account (X-Clodex-Account) runs on it, when
// its member may use it and this data plane serves it; otherwise a pinned
// member's turns run on the pin. An account chosen so is never swapped for
// another: while it is at its usage limit the turn is refused, naming it
// and its reset.

// HeaderAccount is the request header that asks for one account.
const HeaderAccount = "X-Clodex-Account"

// NotAllowedError is a turn whose member or request names an account it
// may not run on here: one its member may not use, one this data plane
// does not serve, or a member none of whose accounts it serves.
type NotAllowedError struct {
	// Member is the turn's member ("" without one).
	Member string
	// Account is the account asked for or pinned; "" when the member's
	// accounts include none this data plane serves.
	Account string
	// Pinned says Account is the member's pin (not asked for).
	Pinned bool
	// Served is whether this data plane serves Account.
	Served bool
	// Allowed are the accounts the turn may use here, sorted.
	Allowed []string
	// Mine are the member's own accounts (when Account is "").
	Mine []string
}

func (e *NotAllowedError) Error() string { return e.NotAllowed() }

// NotAllowed returns what the client is told: what it may not use and
// what it may.
func (e *NotAllowedError) NotAllowed() string {
	here := "none"
	if len(e.Allowed) > 0 {
		here = strings.Join(e.Allowed, ", ")
	}
	switch {
	case e.Account == "":
		return fmt.Sprintf("This data plane serves none of member %s's accounts (%s); an operator must give the member an account it serves (clodexctl member create %s --accounts ...) or run the member on a data plane that serves theirs",
			e.Member, strings.Join(e.Mine, ", "), e.Member)
	case e.Pinned:
		return fmt.Sprintf("Member %s is pinned to account %s, which this data plane does not serve; an operator must pin the member to an account it serves (clodexctl member create %s --pin ACCOUNT) or run the member on a data plane that serves it",
			e.Member, e.Account, e.Member)
	case !e.Served:
		return fmt.Sprintf("Account %s, which this request asks for (%s), is not served by this data plane; the accounts it may ask for here are: %s", e.Account, HeaderAccount, here)
	}
	return fmt.Sprintf("Member %s may not use account %s, which this request asks for (%s); the accounts it may ask for here are: %s", e.Member, e.Account, HeaderAccount, here)
}

// ChosenLimitedError is a turn whose account was chosen for it (its
// member's pin, or its request's X-Clodex-Account) while that account is
// at its usage limit: it is refused rather than run on another account.
type ChosenLimitedError struct {
	Member  string // "" without one
	Account string
	Pinned  bool // the member's pin (else the request asked for it)
	// ResetsAt is when the account's limit resets; ResetsIn is ResetsAt
	// less the router's clock at the Route.
	ResetsAt time.Time
	ResetsIn time.Duration
}

func (e *ChosenLimitedError) Error() string {
	msg, _, _ := e.Limited()
	return msg
}

// Limited returns the client's words, the reset and the time to it.
func (e *ChosenLimitedError) Limited() (message string, resetsAt time.Time, resetsIn time.Duration) {
	in := max(e.ResetsIn, time.Second)
	when := fmt.Sprintf("it resets at %s (in %s)", e.ResetsAt.UTC().Format(time.RFC3339), formatIn(in))
	if e.Pinned {
		return fmt.Sprintf("Member %s is pinned to account %s, which is at its usage limit; %s. The member's turns stay on that account rather than move to another (clodexctl member create --pin)",
			e.Member, e.Account, when), e.ResetsAt, in
	}
	return fmt.Sprintf("Account %s, which this request asks for (%s), is at its usage limit; %s", e.Account, HeaderAccount, when), e.ResetsAt, in
}

// formatIn renders a wait as the failure table does ("42s", "2h16m").
func formatIn(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%ds", s/60, s%60)
	}
	m := (s + 59) / 60
	return fmt.Sprintf("%dh%dm", m/60, m%60)
}

// narrow applies the turn's member and request to keys (the accounts the
// data plane serves): it returns the keys the turn may choose among, and
// the account it must run on ("" when the router chooses).
func narrow(ctx context.Context, keys []string) (allowed []string, forced string, pinned bool, err error) {
	m, want := MemberFrom(ctx), AccountFrom(ctx)
	allowed = keys
	if m != nil && len(m.Accounts) > 0 {
		allowed = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return !m.allows(k) })
	}
	sorted := slices.Sorted(slices.Values(allowed))
	name := ""
	if m != nil {
		name = m.Name
	}
	switch {
	case want != "":
		served := slices.Contains(keys, want)
		if (m != nil && !m.allows(want)) || !served {
			return nil, "", false, &NotAllowedError{Member: name, Account: want, Served: served, Allowed: sorted}
		}
		return allowed, want, false, nil
	case m != nil && m.Pin != "":
		if !slices.Contains(keys, m.Pin) {
			return nil, "", false, &NotAllowedError{Member: name, Account: m.Pin, Pinned: true, Allowed: sorted}
		}
		return allowed, m.Pin, true, nil
	case len(allowed) == 0 && len(keys) > 0:
		return nil, "", false, &NotAllowedError{Member: name, Mine: m.Accounts}
	}
	return allowed, "", false, nil
}

// routeForced returns forced, the account chosen for the turn, unless it
// is at its usage limit (a *ChosenLimitedError). A conversation whose idle
// head lives on another account moves to it (the head is dropped, the
// conversation resent once), as a move off a limited account does.
func (r *Router) routeForced(ctx context.Context, heads Heads, part pool.Partition, items [][]byte, keys []string, forced string, pinned bool) (string, error) {
	if until, limited := r.LimitedUntil(forced); limited {
		e := &ChosenLimitedError{Account: forced, Pinned: pinned, ResetsAt: until, ResetsIn: until.Sub(r.now())}
		if m := MemberFrom(ctx); m != nil {
			e.Member = m.Name
		}
		return "", e
	}
	if len(keys) > 1 {
		if holder, held := heads.Holder(part, items, keys); held && holder != forced {
			old := part
			old.Account = holder
			heads.Forget(old, items)
			r.moves.Inc()
			r.log.InfoContext(ctx, "conversation moves to the account chosen for it (its member's pin or X-Clodex-Account); the whole conversation is resent",
				"from", holder, "to", forced, "items", len(items))
		}
	}
	return forced, nil
}
