package accounts

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"slices"
	"sync/atomic"
)

// Member is a member of the team as a data plane serving member keys
// (--member-keys) knows it from the control plane's pushes: the accounts
// the member may use (empty: every account the data plane serves), the
// account every turn of the member runs on (Pin, "" for none) and the
// member's cap of new upstream sockets a minute (0: none).
type Member struct {
	Name          string
	Accounts      []string // sorted
	Pin           string
	RatePerMinute int
}

// allows reports whether the member may use the account with key.
func (m *Member) allows(key string) bool {
	if len(m.Accounts) == 0 {
		return true
	}
	_, ok := slices.BinarySearch(m.Accounts, key)
	return ok
}

// MemberKey is a member with the SHA-256 of its API key, as the control
// plane pushes it.
type MemberKey struct {
	Member
	Digest [sha256.Size]byte
}

// Members is the member list of a data plane serving member keys,
// replaced whole by each push (Set). Lookups take no lock: a presented key
// costs one SHA-256, one map read and a constant-time compare of the
// digests. It is safe for concurrent use.
type Members struct {
	idx atomic.Pointer[memberIndex]
}

// memberIndex is one push's members, by the first 8 bytes of the key
// digest (the whole digest is compared in constant time) and by name.
type memberIndex struct {
	byPrefix map[uint64][]MemberKey
	byName   map[string]*Member
}

// NewMembers returns an empty list that is not Ready until its first Set.
func NewMembers() *Members { return &Members{} }

// Set replaces the list with ms.
func (l *Members) Set(ms []MemberKey) {
	idx := &memberIndex{byPrefix: make(map[uint64][]MemberKey, len(ms)), byName: make(map[string]*Member, len(ms))}
	for _, m := range ms {
		p := binary.BigEndian.Uint64(m.Digest[:8])
		idx.byPrefix[p] = append(idx.byPrefix[p], m)
		mm := m.Member
		idx.byName[m.Name] = &mm
	}
	l.idx.Store(idx)
}

// Ready reports whether a list arrived (Set was called).
func (l *Members) Ready() bool { return l.idx.Load() != nil }

// Len returns the number of members.
func (l *Members) Len() int {
	if idx := l.idx.Load(); idx != nil {
		return len(idx.byName)
	}
	return 0
}

// Lookup returns the member whose key is key. ready is false before the
// first list arrived (no key can be checked yet); m is nil for a key no
// member holds.
func (l *Members) Lookup(key string) (m *Member, ready bool) {
	idx := l.idx.Load()
	if idx == nil {
		return nil, false
	}
	sum := sha256.Sum256([]byte(key))
	for _, c := range idx.byPrefix[binary.BigEndian.Uint64(sum[:8])] {
		if subtle.ConstantTimeCompare(c.Digest[:], sum[:]) == 1 {
			return idx.byName[c.Name], true
		}
	}
	return nil, true
}

// Context values of a turn: its member (the gateway verified the key) and
// the account its request asks for (X-Clodex-Account).
type (
	memberKey  struct{}
	accountKey struct{}
)

// WithMember returns ctx carrying the turn's member.
func WithMember(ctx context.Context, m *Member) context.Context {
	return context.WithValue(ctx, memberKey{}, m)
}

// MemberFrom returns the turn's member, or nil.
func MemberFrom(ctx context.Context) *Member {
	m, _ := ctx.Value(memberKey{}).(*Member)
	return m
}

// WithAccount returns ctx carrying the key of the account the turn's
// request asks for.
func WithAccount(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, accountKey{}, key)
}

// AccountFrom returns the key of the account the turn's request asks for,
// or "".
func AccountFrom(ctx context.Context) string {
	k, _ := ctx.Value(accountKey{}).(string)
	return k
}
