package controlplane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Members: the people of a team, each with an API key of their own (the
// control plane keeps its SHA-256 only), the accounts they may use, an
// optional pin and an optional cap. The server holds the list loaded from
// Options.Members and pushes it whole to every agent that announced
// CAPABILITY_VERSION_MEMBERS: after its hello, and whenever a reload finds
// it changed. It reloads when a member is created or removed here, when
// another replica says it changed one (the store's notice,
// Options.AgentCredChanges, which members share with the scoped agent
// credentials), and every fleet tick. A data plane started with
// --member-keys checks every key against the list it was pushed, so a
// removal reaches every data plane within a notice and a push. A member's
// cap is its bucket in Options.MemberBuckets, taken before the account's
// (admission.go).

// MemberStore keeps the team's members (Options.Members).
// *store.LoginFile (the data directory) and *redisstore.Store (Redis)
// implement it.
type MemberStore interface {
	// PutMember creates or replaces the member named m.Name.
	PutMember(ctx context.Context, m store.Member) error
	// Members returns every member, ordered by name.
	Members(ctx context.Context) ([]store.Member, error)
	// RemoveMember deletes the member name, or returns store.ErrNotFound.
	RemoveMember(ctx context.Context, name string) error
}

// MemberBuckets holds each member's cap (Options.MemberBuckets):
// *store.Memory and *redisstore.Store implement it.
type MemberBuckets interface {
	// AdmitMember runs the member's bucket once under p
	// (store.MemberPolicy).
	AdmitMember(ctx context.Context, member string, p pacing.Policy, now time.Time) (pacing.Decision, error)
	// RefundMember gives back the token of a debited decision's id.
	RefundMember(ctx context.Context, member string, id uint64, now time.Time) error
}

// memberSet is the members as the server last loaded them, and the push
// that carries them.
type memberSet struct {
	store MemberStore // nil: no members

	mu     sync.Mutex // guards the following fields
	byName map[string]store.Member
	push   *controlplanev1.MemberPush
	sum    [sha256.Size]byte // of push's content: a reload that changes nothing pushes nothing
	loaded bool
}

// get returns the loaded member named name.
func (ms *memberSet) get(name string) (store.Member, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m, ok := ms.byName[name]
	return m, ok
}

// current returns the push of the loaded members (nil before the first
// load).
func (ms *memberSet) current() *controlplanev1.MemberPush {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.push
}

// load reads the members from the store and reports whether they changed
// since the last load. A member whose record does not decode keeps the
// copy loaded before, if any. A failure keeps the members loaded before.
func (ms *memberSet) load(ctx context.Context) (bool, error) {
	if ms.store == nil {
		return false, nil
	}
	list, err := ms.store.Members(ctx)
	if err != nil {
		return false, fmt.Errorf("load members: %w", err)
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	byName := make(map[string]store.Member, len(list))
	for _, m := range list {
		if len(m.Digest) != sha256.Size {
			if old, ok := ms.byName[m.Name]; ok {
				byName[m.Name] = old
			}
			continue
		}
		byName[m.Name] = m
	}
	push := &controlplanev1.MemberPush{}
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		m := byName[name]
		push.Members = append(push.Members, &controlplanev1.PushedMember{
			Name: m.Name, KeySha256: slices.Clone(m.Digest), Accounts: slices.Clone(m.Accounts), Pin: m.Pin, RatePerMinute: int32(m.RatePerMinute),
		})
		fmt.Fprintf(h, "%q %x %q %q %d\n", m.Name, m.Digest, m.Accounts, m.Pin, m.RatePerMinute)
	}
	sum := [sha256.Size]byte(h.Sum(nil))
	changed := !ms.loaded || sum != ms.sum
	ms.byName, ms.push, ms.sum, ms.loaded = byName, push, sum, true
	return changed, nil
}

// reloadMembers reads the members and, when they changed, pushes them to
// every agent that takes them. A failure keeps the members loaded before.
func (s *Server) reloadMembers(ctx context.Context) error {
	changed, err := s.members.load(ctx)
	if err != nil {
		return err
	}
	if changed {
		s.agents.pushMembers()
	}
	return nil
}

// takesMembers reports whether an agent of capability gets member pushes.
func (s *Server) takesMembers(capability int) bool {
	return s.opts.Members != nil && capability >= int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_MEMBERS)
}

// errNoMembers answers the member RPCs without a store.
var errNoMembers = status.Error(codes.FailedPrecondition, "this control plane keeps no members")

// Page sizes of ListMembers: a member names up to 100 accounts (about
// 2.5 KB), so a page of 1000 stays under a client's 4 MB receive limit.
const (
	DefaultMembersPage = 100
	MaxMembersPage     = 1000
)

func (a *adminService) CreateMember(ctx context.Context, req *controlplanev1.CreateMemberRequest) (*controlplanev1.CreateMemberResponse, error) {
	s := a.s
	if s.opts.Members == nil {
		return nil, errNoMembers
	}
	m := store.Member{Name: req.GetName(), Digest: req.GetKeySha256(), Accounts: req.GetAccounts(), Pin: req.GetPin(),
		RatePerMinute: int(req.GetRatePerMinute()), Created: s.now()}
	if err := m.Validate(); err != nil {
		return nil, s.toStatus(ctx, "CreateMember", invalidf("%v", err))
	}
	if s.auth.isFleetToken([sha256.Size]byte(m.Digest)) {
		return nil, s.toStatus(ctx, "CreateMember", invalidf("the key is the admin or the fleet's agent token; a member needs a key of its own"))
	}
	list, err := s.opts.Members.Members(ctx)
	if err != nil {
		return nil, s.storeStatus(ctx, "CreateMember", err)
	}
	known := false
	for _, o := range list {
		if o.Name == m.Name {
			known = true
		} else if bytes.Equal(o.Digest, m.Digest) {
			return nil, s.toStatus(ctx, "CreateMember", invalidf("the key is member %q's; every member needs a key of its own", o.Name))
		}
	}
	if !known && len(list) >= store.MaxMembers {
		return nil, status.Error(codes.ResourceExhausted, store.ErrTooManyMembers.Error())
	}
	if err := s.opts.Members.PutMember(ctx, m); err != nil {
		if errors.Is(err, store.ErrTooManyMembers) {
			return nil, status.Error(codes.ResourceExhausted, err.Error())
		}
		return nil, s.storeStatus(ctx, "CreateMember", err)
	}
	if err := s.reloadMembers(ctx); err != nil {
		s.log.WarnContext(ctx, "reload members", "err", err)
	}
	s.log.InfoContext(ctx, "member created", "member", m.Name, "accounts", m.Accounts, "pin", m.Pin,
		"rate_per_minute", m.RatePerMinute, "replaced", known)
	return &controlplanev1.CreateMemberResponse{Member: memberProto(m)}, nil
}

func memberProto(m store.Member) *controlplanev1.Member {
	p := &controlplanev1.Member{Name: m.Name, Accounts: slices.Clone(m.Accounts), Pin: m.Pin,
		RatePerMinute: int32(m.RatePerMinute), Unreadable: m.Unreadable}
	if !m.Created.IsZero() {
		p.CreatedUnixMs = m.Created.UnixMilli()
	}
	return p
}

func (a *adminService) ListMembers(ctx context.Context, req *controlplanev1.ListMembersRequest) (*controlplanev1.ListMembersResponse, error) {
	s := a.s
	if s.opts.Members == nil {
		return nil, errNoMembers
	}
	pg, next, err := listPage(ctx, s, "ListMembers", req, DefaultMembersPage, MaxMembersPage,
		s.opts.Members.Members, s.storeStatus, memberProto, (*controlplanev1.Member).GetName)
	if err != nil {
		return nil, err
	}
	return &controlplanev1.ListMembersResponse{Members: pg, NextPageToken: next}, nil
}

func (a *adminService) RemoveMember(ctx context.Context, req *controlplanev1.RemoveMemberRequest) (*controlplanev1.RemoveMemberResponse, error) {
	s := a.s
	if s.opts.Members == nil {
		return nil, errNoMembers
	}
	if err := store.ValidateMemberName(req.GetName()); err != nil {
		return nil, s.toStatus(ctx, "RemoveMember", invalidf("%v", err))
	}
	if err := s.opts.Members.RemoveMember(ctx, req.GetName()); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, status.Errorf(codes.NotFound, "no member is named %s", req.GetName())
		}
		return nil, s.storeStatus(ctx, "RemoveMember", err)
	}
	if err := s.reloadMembers(ctx); err != nil {
		s.log.WarnContext(ctx, "reload members", "err", err)
	}
	s.log.InfoContext(ctx, "member removed", "member", req.GetName())
	return &controlplanev1.RemoveMemberResponse{}, nil
}

// memberCap runs the member's bucket for an Admit, before the account's:
// ok is false when the member has no cap (no name, a name the server does
// not know, a rate of 0, or no buckets), and the decision is then the
// account's alone.
func (s *Server) memberCap(ctx context.Context, name string, now time.Time) (d pacing.Decision, ok bool, err error) {
	if name == "" || s.opts.MemberBuckets == nil {
		return pacing.Decision{}, false, nil
	}
	m, known := s.members.get(name)
	if !known || m.RatePerMinute <= 0 {
		return pacing.Decision{}, false, nil
	}
	p := store.MemberPolicy(m.RatePerMinute, s.opts.Policies.Defaults().Budget)
	d, err = s.opts.MemberBuckets.AdmitMember(ctx, name, p, now)
	if err != nil {
		return pacing.Decision{}, false, err
	}
	return d, true, nil
}
