package console

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// What the console reads of people: the members (ListMembers) and the
// usage ledger (GetUsage), the same calls clodexctl member list and
// clodexctl usage make. The last 24 hours' usage is summed by member, by
// agent and by account at every sample; each account's usage per hour,
// for its chart, is read once per hour of the last 24 and again while the
// hour may still change (the current one, and the one before it, whose
// turns a data plane may still be sending).
const (
	usageWindow  = 24 * time.Hour
	maxMembers   = 1000
	hourSettles  = time.Hour + 5*time.Minute // after its end an hour's usage no longer changes
	maxUsageRows = 200                       // rows shown per table; the rest are summed in one
)

// people is the members and the last 24 hours' usage, as one sample read
// them.
type people struct {
	members    []*controlplanev1.Member
	membersErr error // FailedPrecondition and the like: shown in place of the table
	byMember   []*controlplanev1.UsageTotals
	byAgent    []*controlplanev1.UsageTotals
	byAccount  []*controlplanev1.UsageTotals
	usageErr   error
}

// hourly is each account's usage per hour: hour start (Unix ms) ->
// account key -> totals, and when each hour was read.
type hourly map[int64]hourUsage

type hourUsage struct {
	read     time.Time
	accounts map[string]*controlplanev1.UsageTotals
}

// readPeople reads the members and the usage tables, and brings the
// hourly usage up to date.
func (s *sampler) readPeople(ctx context.Context, now time.Time) people {
	var p people
	token := ""
	for {
		resp, err := s.admin.ListMembers(ctx, &controlplanev1.ListMembersRequest{PageSize: 100, PageToken: token})
		if err != nil {
			p.membersErr = err
			break
		}
		p.members = append(p.members, resp.GetMembers()...)
		if token = resp.GetNextPageToken(); token == "" || len(p.members) >= maxMembers {
			break
		}
	}
	since := now.Add(-usageWindow).UnixMilli()
	for _, t := range []struct {
		by  string
		dst *[]*controlplanev1.UsageTotals
	}{{"member", &p.byMember}, {"agent", &p.byAgent}, {"account", &p.byAccount}} {
		resp, err := s.admin.GetUsage(ctx, &controlplanev1.GetUsageRequest{GroupBy: []string{t.by}, SinceUnixMs: since})
		if err != nil {
			p.usageErr = err
			break
		}
		*t.dst = biggestFirst(resp.GetRows())
	}
	if p.usageErr == nil {
		s.readHours(ctx, now)
	}
	return p
}

// readHours reads each account's usage of every hour of the last 24 not
// read since it settled, and forgets older hours.
func (s *sampler) readHours(ctx context.Context, now time.Time) {
	first := now.Add(-usageWindow).Truncate(time.Hour)
	s.mu.Lock()
	var due []time.Time
	for h := first; !h.After(now); h = h.Add(time.Hour) {
		got, ok := s.hours[h.UnixMilli()]
		if !ok || got.read.Before(h.Add(hourSettles)) {
			due = append(due, h)
		}
	}
	for h := range s.hours {
		if h < first.UnixMilli() {
			delete(s.hours, h)
		}
	}
	s.mu.Unlock()
	for _, h := range due {
		until := h.Add(time.Hour - time.Minute)
		resp, err := s.admin.GetUsage(ctx, &controlplanev1.GetUsageRequest{GroupBy: []string{"account"},
			SinceUnixMs: h.UnixMilli(), UntilUnixMs: min(until.UnixMilli(), now.UnixMilli())})
		if err != nil {
			return // the next sample asks again
		}
		u := hourUsage{read: now, accounts: map[string]*controlplanev1.UsageTotals{}}
		for _, r := range resp.GetRows() {
			u.accounts[r.GetAccount()] = r
		}
		s.mu.Lock()
		s.hours[h.UnixMilli()] = u
		s.mu.Unlock()
	}
}

// hoursOf returns an account's usage per hour over the last 24 hours,
// oldest first (a zero row for an hour without any).
func (s *sampler) hoursOf(key string, now time.Time) []hourPoint {
	first := now.Add(-usageWindow).Truncate(time.Hour)
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []hourPoint
	for h := first; !h.After(now); h = h.Add(time.Hour) {
		p := hourPoint{At: h}
		if u, ok := s.hours[h.UnixMilli()]; ok {
			if t := u.accounts[key]; t != nil {
				p.Input, p.Cached, p.Output, p.Turns = t.GetInputTokens()-t.GetCachedTokens(), t.GetCachedTokens(), t.GetOutputTokens(), t.GetTurns()
			}
		}
		out = append(out, p)
	}
	return out
}

// hourPoint is one hour of an account's usage: input tokens not cached,
// cached ones, output tokens and turns.
type hourPoint struct {
	At                    time.Time
	Input, Cached, Output int64
	Turns                 int64
}

// biggestFirst orders usage rows by tokens, most first, and keeps at
// most maxUsageRows (the rest summed in a row named "other").
func biggestFirst(rows []*controlplanev1.UsageTotals) []*controlplanev1.UsageTotals {
	rows = slices.Clone(rows)
	tokens := func(r *controlplanev1.UsageTotals) int64 { return r.GetInputTokens() + r.GetOutputTokens() }
	slices.SortStableFunc(rows, func(a, b *controlplanev1.UsageTotals) int {
		switch ta, tb := tokens(a), tokens(b); {
		case ta > tb:
			return -1
		case ta < tb:
			return 1
		}
		return 0
	})
	if len(rows) <= maxUsageRows {
		return rows
	}
	other := &controlplanev1.UsageTotals{Member: "other", Agent: "other", Account: "other", Model: "other"}
	for _, r := range rows[maxUsageRows-1:] {
		other.Turns += r.GetTurns()
		other.InputTokens += r.GetInputTokens()
		other.CachedTokens += r.GetCachedTokens()
		other.OutputTokens += r.GetOutputTokens()
		other.NewSockets += r.GetNewSockets()
		other.Refusals += r.GetRefusals()
	}
	return append(rows[:maxUsageRows-1], other)
}

// memberRow is one member as the fleet page shows it.
type memberRow struct {
	Name     string
	Accounts []string // empty: every account
	Pin      string
	Rate     int32 // 0: no cap
	Created  string
	Bad      string // the record does not decode: why
}

// usageRow is one line of a usage table.
type usageRow struct {
	Who                          string
	Turns, Input, Cached, Output int64
	NewSockets, Refusals         int64
}

func memberRows(ms []*controlplanev1.Member) []memberRow {
	out := make([]memberRow, 0, len(ms))
	for _, m := range ms {
		out = append(out, memberRow{Name: m.GetName(), Accounts: m.GetAccounts(), Pin: m.GetPin(), Rate: m.GetRatePerMinute(),
			Created: time.UnixMilli(m.GetCreatedUnixMs()).UTC().Format(time.RFC3339), Bad: m.GetUnreadable()})
	}
	return out
}

func usageRows(rows []*controlplanev1.UsageTotals, who func(*controlplanev1.UsageTotals) string) []usageRow {
	out := make([]usageRow, 0, len(rows))
	for _, r := range rows {
		name := who(r)
		if name == "" {
			name = "-"
		}
		out = append(out, usageRow{Who: name, Turns: r.GetTurns(), Input: r.GetInputTokens(), Cached: r.GetCachedTokens(),
			Output: r.GetOutputTokens(), NewSockets: r.GetNewSockets(), Refusals: r.GetRefusals()})
	}
	return out
}

// errNote is what a page says in place of a table the admin API did not
// answer for (the control plane runs no such store, or the store is away).
func errNote(what string, err error) string {
	if err == nil {
		return ""
	}
	return fmt.Sprintf("%s: %s", what, status.Convert(err).Message())
}
