package control

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"regexp"
	"slices"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// The control plane pushes the team's members on the agent stream (to a
// data plane of CAPABILITY_VERSION_MEMBERS): the whole list after the
// hello and again after every change. Each push replaces Config.Members,
// which the gateway checks member keys against; a member the push no
// longer names is refused from then on. The list outlives the stream: a
// data plane that lost its control plane keeps serving the members it was
// last told of.

// memberName is a member's name as the control plane allows it.
var memberName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// applyMembers replaces Config.Members with a push. An entry that is not
// one the control plane writes (a bad name, digest, account key or rate)
// is left out and logged: its key is refused rather than served with
// limits the data plane cannot read.
func (c *Client) applyMembers(ctx context.Context, p *controlplanev1.MemberPush) {
	if c.members == nil {
		return
	}
	list := make([]accounts.MemberKey, 0, len(p.GetMembers()))
	for _, pm := range p.GetMembers() {
		m, ok := memberOf(pm)
		if !ok {
			c.log.LogAttrs(ctx, slog.LevelWarn, "ignoring a member the control plane pushed that this data plane cannot read; its key is refused",
				slog.String("member", pm.GetName()))
			continue
		}
		list = append(list, m)
	}
	c.members.Set(list)
	c.log.LogAttrs(ctx, slog.LevelInfo, "members from the control plane", slog.Int("members", len(list)))
}

// memberOf converts one pushed member; ok is false for one the control
// plane would not have written.
func memberOf(pm *controlplanev1.PushedMember) (accounts.MemberKey, bool) {
	if !memberName.MatchString(pm.GetName()) || len(pm.GetKeySha256()) != sha256.Size ||
		pacing.ValidateRate(int(pm.GetRatePerMinute())) != nil || (pm.GetPin() != "" && !account.IsKey(pm.GetPin())) {
		return accounts.MemberKey{}, false
	}
	for _, k := range pm.GetAccounts() {
		if !account.IsKey(k) {
			return accounts.MemberKey{}, false
		}
	}
	return accounts.MemberKey{
		Member: accounts.Member{Name: pm.GetName(), Accounts: slices.Sorted(slices.Values(pm.GetAccounts())), Pin: pm.GetPin(),
			RatePerMinute: int(pm.GetRatePerMinute())},
		Digest: [sha256.Size]byte(pm.GetKeySha256()),
	}, true
}
