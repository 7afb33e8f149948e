package store

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
)

// Member is a member of the team: a person with an API key of their own
// (only its digest is stored), the accounts they may use, an optional pin
// and an optional cap of new upstream sockets a minute.
type Member struct {
	// Name is the operator's name for the person (the record's name).
	Name string `json:"-"`
	// Digest is the SHA-256 of the member's API key.
	Digest []byte `json:"sha256"`
	// Accounts are the account keys the member may use, sorted; empty:
	// every account.
	Accounts []string `json:"accounts,omitempty"`
	// Pin is the account every turn of the member runs on; "" for none.
	Pin string `json:"pin,omitempty"`
	// RatePerMinute is the member's cap (new sockets a minute, burst the
	// same); 0: none.
	RatePerMinute int `json:"rate_per_minute,omitempty"`
	// Created is when it was created.
	Created time.Time `json:"created"`
	// Version counts the member's writes (Redis; 0 in the data dir's
	// logins.json): a restore keeps the newer of two copies.
	Version int64 `json:"version,omitempty"`
	// Unreadable, when set, says the stored record does not decode (the
	// other fields are the last good copy, if any). Never stored.
	Unreadable string `json:"-"`
}

// Limits of a member record.
const (
	// MaxMemberAccounts bounds the accounts one member names.
	MaxMemberAccounts = 100
	// MaxMembers bounds the members of a team: the whole list travels to
	// every data plane in one push.
	MaxMembers = 1000
)

var memberNamePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// ValidateMemberName checks a member's name: 1..64 letters, digits, '.',
// '_' or '-', starting with a letter or digit.
func ValidateMemberName(name string) error {
	if !memberNamePattern.MatchString(name) {
		return fmt.Errorf("member name %q is invalid; want 1..64 letters, digits, '.', '_' or '-', starting with a letter or digit", name)
	}
	return nil
}

// Validate checks m is a record a store may keep: a valid name, a 32-byte
// digest, at most MaxMemberAccounts account keys, a pin that is an
// account key (one of Accounts when it names any) and a rate in 0..600.
// Every problem is reported. It sorts Accounts and drops duplicates.
func (m *Member) Validate() error {
	var errs []error
	if err := ValidateMemberName(m.Name); err != nil {
		errs = append(errs, err)
	}
	if len(m.Digest) != sha256.Size {
		errs = append(errs, fmt.Errorf("the key digest is %d bytes; want %d (the SHA-256 of the member's key)", len(m.Digest), sha256.Size))
	}
	if len(m.Accounts) > MaxMemberAccounts {
		errs = append(errs, fmt.Errorf("accounts lists %d keys; allowed at most %d", len(m.Accounts), MaxMemberAccounts))
	}
	for i, k := range m.Accounts {
		if !account.IsKey(k) {
			errs = append(errs, fmt.Errorf("accounts[%d] %q is not an account key; want acct_ followed by 16 lowercase hex digits", i, k))
		}
	}
	m.Accounts = slices.Compact(slices.Sorted(slices.Values(m.Accounts)))
	if m.Pin != "" {
		switch _, in := slices.BinarySearch(m.Accounts, m.Pin); {
		case !account.IsKey(m.Pin):
			errs = append(errs, fmt.Errorf("pin %q is not an account key; want acct_ followed by 16 lowercase hex digits", m.Pin))
		case len(m.Accounts) > 0 && !in:
			errs = append(errs, fmt.Errorf("pin %s is not one of the member's accounts %v; a member is pinned to an account it may use", m.Pin, m.Accounts))
		}
	}
	if err := pacing.ValidateRate(m.RatePerMinute); err != nil {
		errs = append(errs, fmt.Errorf("the member's cap: %w", err))
	}
	return errors.Join(errs...)
}

// SortMembers orders ms by name.
func SortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int { return cmp.Compare(a.Name, b.Name) })
}

// PutMember stores m in the logins file, replacing a member of the same
// name. Past MaxMembers a new name is refused.
func (f *LoginFile) PutMember(ctx context.Context, m Member) error {
	if err := m.Validate(); err != nil {
		return fmt.Errorf("put member: %w", err)
	}
	m.Version, m.Unreadable = 0, ""
	return f.update(ctx, func(d *loginsDoc) error {
		if d.Members == nil {
			d.Members = map[string]Member{}
		}
		if _, ok := d.Members[m.Name]; !ok && len(d.Members) >= MaxMembers {
			return fmt.Errorf("put member %s: %w", m.Name, ErrTooManyMembers)
		}
		d.Members[m.Name] = m
		return nil
	})
}

// ErrTooManyMembers refuses a member past MaxMembers.
var ErrTooManyMembers = fmt.Errorf("a team has at most %d members; remove one first (clodexctl member remove NAME)", MaxMembers)

// Members returns the members in the logins file, ordered by name.
func (f *LoginFile) Members(context.Context) ([]Member, error) {
	d, err := f.read()
	if err != nil {
		return nil, err
	}
	out := listNamed(d.Members, func(m *Member, name string) { m.Name = name })
	SortMembers(out)
	return out, nil
}

// RemoveMember deletes a member from the logins file, or returns
// ErrNotFound.
func (f *LoginFile) RemoveMember(ctx context.Context, name string) error {
	return f.update(ctx, func(d *loginsDoc) error { return removeNamed(d.Members, name) })
}
