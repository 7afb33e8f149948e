package controlplane

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// UsageLedger keeps the usage ledger: the batches data planes report,
// applied once per (agent, seq), per minute, for store.UsageRetention
// (docs/operations.md §16). *store.Memory and *redisstore.Store
// implement it.
type UsageLedger interface {
	// PutUsage applies a batch received at now; applied is false for a
	// batch applied before. An error means nothing was stored.
	PutUsage(ctx context.Context, b store.UsageBatch, now time.Time) (applied bool, err error)
	// UsageRows calls fn with the rows of the minutes
	// store.UsageMinutes(since, until) names.
	UsageRows(ctx context.Context, since, until time.Time, fn func(store.UsageRow)) error
}

// Bounds of a usage report and of the ledger's answers.
const (
	// MaxUsageRows bounds the rows of one UsageReport.
	MaxUsageRows = 200
	// maxUsageName bounds a member's and a model's name.
	maxUsageName = 64
	// maxUsageCount bounds each count of a row (a minute of one member's
	// turns on one account and model).
	maxUsageCount = 1 << 40
	// usageAhead is how far ahead of the control plane's clock a row's
	// minute may be (a data plane's clock may run ahead).
	usageAhead = time.Hour
	// MaxUsageGroups bounds GetUsage's rows; the groups past it fold into
	// one "other" row.
	MaxUsageGroups = 10000
	// DefaultUsageSince is how far back GetUsage sums without since.
	DefaultUsageSince = 24 * time.Hour
)

// validUsage checks a report of agentID at now and converts it. A row
// outside the agent's scope is refused as the others are: the batch is
// acknowledged with the reason and never stored.
func (s *Server) validUsage(ctx context.Context, agentID string, r *controlplanev1.UsageReport, now time.Time) (store.UsageBatch, error) {
	b := store.UsageBatch{Agent: agentID, Seq: r.GetSeq()}
	if b.Seq == 0 {
		return b, invalidf("usage: seq is 0; batches are numbered from 1")
	}
	if n := len(r.GetRows()); n > MaxUsageRows {
		return b, invalidf("usage lists %d rows; allowed 0..%d", n, MaxUsageRows)
	}
	oldest, newest := now.Add(-store.UsageRetention), now.Add(usageAhead)
	type rowKey struct {
		minute                 int64
		member, account, model string
	}
	seen := map[rowKey]bool{}
	for i, row := range r.GetRows() {
		ms := row.GetMinuteUnixMs()
		minute := time.UnixMilli(ms).UTC()
		switch {
		case ms%60000 != 0:
			return b, invalidf("usage.rows[%d].minute_unix_ms %d is not a minute's start (a multiple of 60000)", i, ms)
		case minute.Before(oldest) || minute.After(newest):
			return b, invalidf("usage.rows[%d].minute_unix_ms %s is out of range; allowed the last %v up to %v ahead of the control plane's clock (%s): check the data plane's clock",
				i, minute.Format(time.RFC3339), store.UsageRetention, usageAhead, now.UTC().Format(time.RFC3339))
		}
		if !account.IsKey(row.GetAccount()) {
			return b, invalidf("usage.rows[%d].account %q is not an account key; want acct_ followed by 16 lowercase hex digits", i, row.GetAccount())
		}
		if sc := scopeFrom(ctx); sc != nil && !sc.allows(row.GetAccount()) {
			return b, invalidf("usage.rows[%d].account %s is not one this agent credential may use", i, row.GetAccount())
		}
		if err := printable(fmt.Sprintf("usage.rows[%d].member", i), row.GetMember(), 0, maxUsageName); err != nil {
			return b, err
		}
		if err := printable(fmt.Sprintf("usage.rows[%d].model", i), row.GetModel(), 1, maxUsageName); err != nil {
			return b, err
		}
		if strings.Contains(row.GetMember()+row.GetModel(), "\x1f") {
			return b, invalidf("usage.rows[%d] has a byte 0x1f; allowed printable ASCII", i)
		}
		counts := store.UsageCounts{Turns: row.GetTurns(), InputTokens: row.GetInputTokens(), CachedTokens: row.GetCachedTokens(),
			OutputTokens: row.GetOutputTokens(), NewSockets: row.GetNewSockets(), Refusals: row.GetRefusals()}
		for _, c := range []struct {
			name string
			v    int64
		}{{"turns", counts.Turns}, {"input_tokens", counts.InputTokens}, {"cached_tokens", counts.CachedTokens},
			{"output_tokens", counts.OutputTokens}, {"new_sockets", counts.NewSockets}, {"refusals", counts.Refusals}} {
			if c.v < 0 || c.v > maxUsageCount {
				return b, invalidf("usage.rows[%d].%s %d is out of range; allowed 0..%d", i, c.name, c.v, int64(maxUsageCount))
			}
		}
		k := rowKey{ms, row.GetMember(), row.GetAccount(), row.GetModel()}
		if seen[k] {
			return b, invalidf("usage.rows[%d] repeats the minute, member, account and model of an earlier row; send each once", i)
		}
		seen[k] = true
		b.Rows = append(b.Rows, store.UsageRow{Minute: minute,
			UsageKey:    store.UsageKey{Member: row.GetMember(), Agent: agentID, Account: row.GetAccount(), Model: row.GetModel()},
			UsageCounts: counts})
	}
	return b, nil
}

// usageReport stores an agent's batch and queues its ack: at once when
// it is stored (or was before) or refused; not at all when the store
// failed, so the data plane sends it again. It never ends the stream.
func (s *Server) usageReport(ctx context.Context, c *agentConn, r *controlplanev1.UsageReport) {
	now := s.now()
	b, err := s.validUsage(ctx, c.id, r, now)
	if err != nil {
		s.log.WarnContext(ctx, "usage report refused", "agent_id", c.id, "seq", r.GetSeq(), "err", err)
		s.agents.ack(c, &controlplanev1.UsageAck{Seq: r.GetSeq(), Refused: err.Error()})
		return
	}
	applied := true
	if s.opts.Usage != nil {
		applied, err = s.opts.Usage.PutUsage(ctx, b, now)
		if err != nil {
			if s.usageFailLog.Allow() {
				s.log.WarnContext(ctx, "usage report not stored; the data plane sends it again", "agent_id", c.id, "seq", b.Seq, "err", err)
			}
			return
		}
	}
	if applied {
		s.usageMetrics.add(b)
	}
	s.agents.ack(c, &controlplanev1.UsageAck{Seq: b.Seq})
}

// newUsageFailLog limits the "not stored" warnings to one a minute.
func newUsageFailLog() *rate.Limiter { return rate.NewLimiter(rate.Every(time.Minute), 1) }

// ack queues an ack for c's sending goroutine.
func (d *directory) ack(c *agentConn, a *controlplanev1.UsageAck) {
	d.mu.Lock()
	c.acks = append(c.acks, a)
	d.mu.Unlock()
	c.signal()
}

// takeAcks returns and forgets c's queued acks.
func (d *directory) takeAcks(c *agentConn) []*controlplanev1.UsageAck {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := c.acks
	c.acks = nil
	return a
}

// usageKeys are the keys GetUsage may group by, in the order rows are
// sorted.
var usageKeys = []string{"member", "agent", "account", "model"}

// GetUsage sums the ledger from since to until by the requested keys.
func (a *adminService) GetUsage(ctx context.Context, req *controlplanev1.GetUsageRequest) (*controlplanev1.GetUsageResponse, error) {
	s := a.s
	var by [4]bool
	for i, g := range req.GetGroupBy() {
		j := slices.Index(usageKeys, g)
		switch {
		case j < 0:
			return nil, s.toStatus(ctx, "GetUsage", invalidf("group_by[%d] %q is not a key; allowed %s", i, g, strings.Join(usageKeys, ", ")))
		case by[j]:
			return nil, s.toStatus(ctx, "GetUsage", invalidf("group_by names %q twice; name each key once", g))
		}
		by[j] = true
	}
	now := s.now()
	until := now
	if ms := req.GetUntilUnixMs(); ms != 0 {
		until = time.UnixMilli(ms)
	}
	since := until.Add(-DefaultUsageSince)
	if ms := req.GetSinceUnixMs(); ms != 0 {
		since = time.UnixMilli(ms)
	}
	switch {
	case req.GetUntilUnixMs() < 0 || req.GetSinceUnixMs() < 0:
		return nil, s.toStatus(ctx, "GetUsage", invalidf("since_unix_ms and until_unix_ms must not be negative; 0 takes the default"))
	case !since.Before(until):
		return nil, s.toStatus(ctx, "GetUsage", invalidf("since (%s) is not before until (%s)", since.UTC().Format(time.RFC3339), until.UTC().Format(time.RFC3339)))
	case since.Before(now.Add(-store.UsageRetention - time.Minute)):
		return nil, s.toStatus(ctx, "GetUsage", invalidf("since (%s) is more than %v back; the ledger keeps %v", since.UTC().Format(time.RFC3339), store.UsageRetention, store.UsageRetention))
	}
	if s.opts.Usage == nil {
		return nil, status.Error(codes.FailedPrecondition, "GetUsage: this control plane's store keeps no usage ledger")
	}
	groups := map[store.UsageKey]*store.UsageCounts{}
	truncated := false
	err := s.opts.Usage.UsageRows(ctx, since, until, func(r store.UsageRow) {
		k := project(r.UsageKey, by)
		c := groups[k]
		if c == nil {
			if len(groups) >= MaxUsageGroups {
				k, truncated = project(store.UsageKey{Member: store.UsageOther, Agent: store.UsageOther, Account: store.UsageOther, Model: store.UsageOther}, by), true
				c = groups[k]
			}
			if c == nil {
				c = &store.UsageCounts{}
				groups[k] = c
			}
		}
		c.Add(r.UsageCounts)
	})
	if err != nil {
		return nil, s.storeStatus(ctx, "GetUsage", err)
	}
	from, to := store.UsageMinutes(since, until)
	resp := &controlplanev1.GetUsageResponse{Truncated: truncated, SinceUnixMs: from * 60000, UntilUnixMs: to * 60000,
		Rows: make([]*controlplanev1.UsageTotals, 0, len(groups))}
	for k, c := range groups {
		resp.Rows = append(resp.Rows, &controlplanev1.UsageTotals{Member: k.Member, Agent: k.Agent, Account: k.Account, Model: k.Model,
			Turns: c.Turns, InputTokens: c.InputTokens, CachedTokens: c.CachedTokens, OutputTokens: c.OutputTokens,
			NewSockets: c.NewSockets, Refusals: c.Refusals})
	}
	slices.SortFunc(resp.Rows, func(x, y *controlplanev1.UsageTotals) int {
		return cmp.Or(cmp.Compare(x.GetMember(), y.GetMember()), cmp.Compare(x.GetAgent(), y.GetAgent()),
			cmp.Compare(x.GetAccount(), y.GetAccount()), cmp.Compare(x.GetModel(), y.GetModel()))
	})
	return resp, nil
}

// project keeps the keys grouped by.
func project(k store.UsageKey, by [4]bool) store.UsageKey {
	var out store.UsageKey
	if by[0] {
		out.Member = k.Member
	}
	if by[1] {
		out.Agent = k.Agent
	}
	if by[2] {
		out.Account = k.Account
	}
	if by[3] {
		out.Model = k.Model
	}
	return out
}
