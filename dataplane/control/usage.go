package control

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Usage reporting (docs/pacing.md §10, docs/operations.md §16): every
// turn's usage is added to a row per minute and (member, account, model);
// every Config.UsageFlush the rows recorded since go out as numbered
// batches on the agent stream. A batch is kept until the control plane
// acknowledges it: sent again on every new stream, and on the same one
// when its ack is UsageResend overdue. The control plane applies a batch
// once per (agent id, seq), so none is lost across a reconnect and none
// counts twice.
const (
	// DefaultUsageFlush is the default Config.UsageFlush.
	DefaultUsageFlush = 10 * time.Second
	// UsageKeep bounds how long usage waits for the control plane:
	// rows and batches of a minute older than this are dropped and their
	// turns counted (clodex_dataplane_usage_dropped_turns_total).
	UsageKeep = time.Hour
	// UsageResend is how long a batch sent on the current stream waits
	// for its ack before it is sent again (the control plane's store may
	// have failed to keep it).
	UsageResend = 30 * time.Second
	// maxUsageBatchRows and maxUsageBatchBytes bound one batch: the
	// control plane reads at most 200 rows, and at most 32 KiB per agent
	// stream message.
	maxUsageBatchRows  = 200
	maxUsageBatchBytes = 30 << 10
	// maxUsageBatches bounds the batches waiting for an ack: the oldest
	// beyond it is dropped (its turns counted).
	maxUsageBatches = 1000
	// usageRowsPerMinute caps one minute's distinct rows; further ones
	// fold into the row of member, account and model "other" (the
	// ledger's rule).
	usageRowsPerMinute = 1000
	// maxUsageName bounds a member's and a model's name.
	maxUsageName = 64
	// usageOther names the folded row.
	usageOther = "other"
	// capabilityHeader is the control plane's header naming its
	// capability version (controlplane.CapabilityHeader).
	capabilityHeader = "clodex-capability-version"
	// maxFleetQuotas bounds the accounts of the fleet's quota view kept.
	maxFleetQuotas = 10000
)

// usageKey is what a row is about.
type usageKey struct {
	minute                 int64 // Unix ms of the minute's start
	member, account, model string
}

// usageBatch is a batch waiting for its ack.
type usageBatch struct {
	report  *controlplanev1.UsageReport
	oldest  time.Time // its oldest minute
	turns   int64
	session uint64    // the stream it was last sent on; 0: not yet
	sentAt  time.Time // when it was last sent
}

// UsageStats are the usage queue's counters.
type UsageStats struct {
	// Rows are recorded rows not yet in a batch; Batches the batches
	// waiting for an ack.
	Rows, Batches int
	// Acked counts the batches the control plane acknowledged, Resent the
	// sends of a batch after its first.
	Acked, Resent int64
	// Dropped counts the turns of usage dropped unsent or unacknowledged
	// (older than UsageKeep, or past maxUsageBatches); Refused the turns
	// of batches the control plane refused (the reason is logged).
	Dropped, Refused int64
}

// ReportUsage adds one turn's usage (turns 1, its tokens, sockets and
// refusal) to the row of the current minute (by Config.Clock) and its
// member, account and model; it never blocks. The row's minute is set
// here. A usage of an invalid account key is dropped with a warning; a
// member or model longer than 64 bytes is cut, and a byte outside
// printable ASCII becomes '_'.
func (c *Client) ReportUsage(u *controlplanev1.UsageRow) {
	if !account.IsKey(u.GetAccount()) {
		c.log.Warn("dropping a usage report for an invalid account key; want acct_ followed by 16 lowercase hex digits")
		return
	}
	now := c.now()
	k := usageKey{minute: now.Truncate(time.Minute).UnixMilli(), member: usageName(u.GetMember()), account: u.GetAccount(), model: usageName(u.GetModel())}
	if k.model == "" {
		k.model = "unknown"
	}
	c.usageMu.Lock()
	defer c.usageMu.Unlock()
	if k.minute != c.usageMinute {
		// A new minute: what waited too long goes (a control plane that
		// has been unreachable for an hour).
		c.usageMinute = k.minute
		c.pruneUsageLocked(now)
	}
	row := c.usageRows[k]
	if row == nil {
		if c.usagePerMinute[k.minute] >= usageRowsPerMinute {
			k.member, k.account, k.model = usageOther, u.GetAccount(), usageOther
			row = c.usageRows[k]
		}
		if row == nil {
			row = &controlplanev1.UsageRow{MinuteUnixMs: k.minute, Member: k.member, Account: k.account, Model: k.model}
			c.usageRows[k] = row
			c.usagePerMinute[k.minute]++
		}
	}
	row.Turns += max(u.GetTurns(), 1)
	row.InputTokens += max(u.GetInputTokens(), 0)
	row.CachedTokens += max(u.GetCachedTokens(), 0)
	row.OutputTokens += max(u.GetOutputTokens(), 0)
	row.NewSockets += max(u.GetNewSockets(), 0)
	row.Refusals += max(u.GetRefusals(), 0)
}

// usageName bounds a member's or model's name for the ledger.
func usageName(s string) string {
	if len(s) > maxUsageName {
		s = s[:maxUsageName]
	}
	b := []byte(s)
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '_'
		}
	}
	return string(b)
}

// UsageStats returns the usage queue's counters.
func (c *Client) UsageStats() UsageStats {
	c.usageMu.Lock()
	defer c.usageMu.Unlock()
	st := c.usageStats
	st.Rows, st.Batches = len(c.usageRows), len(c.usageBatches)
	return st
}

// pruneUsageLocked drops the rows and batches of minutes older than
// UsageKeep at now.
func (c *Client) pruneUsageLocked(now time.Time) {
	oldest := now.Add(-UsageKeep)
	c.usageBatches = slices.DeleteFunc(c.usageBatches, func(b *usageBatch) bool {
		if b.oldest.Before(oldest) {
			c.dropUsageLocked(b.turns, "older than "+UsageKeep.String())
			return true
		}
		return false
	})
	for k, row := range c.usageRows {
		if time.UnixMilli(k.minute).Before(oldest) {
			c.dropUsageLocked(row.GetTurns(), "older than "+UsageKeep.String())
			delete(c.usageRows, k)
			if c.usagePerMinute[k.minute]--; c.usagePerMinute[k.minute] <= 0 {
				delete(c.usagePerMinute, k.minute)
			}
		}
	}
}

// cutUsageLocked drops what is older than UsageKeep at now and puts the
// recorded rows into batches.
func (c *Client) cutUsageLocked(now time.Time) {
	c.pruneUsageLocked(now)
	if len(c.usageRows) == 0 {
		return
	}
	keys := slices.SortedFunc(maps.Keys(c.usageRows), func(a, b usageKey) int {
		return cmp.Or(cmp.Compare(a.minute, b.minute), cmp.Compare(a.member, b.member), cmp.Compare(a.account, b.account), cmp.Compare(a.model, b.model))
	})
	var cur *usageBatch
	size := 0
	for _, k := range keys {
		row := c.usageRows[k]
		n := proto.Size(row) + 4 // the field's tag and length
		if cur == nil || len(cur.report.GetRows()) >= maxUsageBatchRows || size+n > maxUsageBatchBytes {
			c.usageSeq++
			cur = &usageBatch{report: &controlplanev1.UsageReport{Seq: c.usageSeq}, oldest: time.UnixMilli(k.minute)}
			c.usageBatches = append(c.usageBatches, cur)
			size = 16
		}
		cur.report.Rows = append(cur.report.Rows, row)
		cur.turns += row.GetTurns()
		size += n
	}
	clear(c.usageRows)
	clear(c.usagePerMinute)
	if over := len(c.usageBatches) - maxUsageBatches; over > 0 {
		for _, b := range c.usageBatches[:over] {
			c.dropUsageLocked(b.turns, "more than "+strconv.Itoa(maxUsageBatches)+" batches wait for an ack")
		}
		c.usageBatches = slices.Delete(c.usageBatches, 0, over)
	}
}

// dropUsageLocked counts turns of usage dropped, logging the first drop
// of a run of them.
func (c *Client) dropUsageLocked(turns int64, why string) {
	c.usageStats.Dropped += turns
	if c.usageDrops != nil {
		c.usageDrops.Add(float64(turns))
	}
	c.usageDropLog.Do(func() {
		c.log.Warn("dropping usage the control plane has not acknowledged; the ledger will miss these turns", "turns", turns, "why", why)
	})
}

// usageCapable reports whether the control plane of stream named a
// capability version that reads usage reports in its headers.
func usageCapable(md metadata.MD) bool {
	v := md.Get(capabilityHeader)
	if len(v) == 0 {
		return false
	}
	n, err := strconv.Atoi(v[0])
	return err == nil && n >= int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE)
}

// sendUsage cuts the rows recorded so far into batches and sends, on the
// stream of session, every batch not yet sent on it and every one whose
// ack is UsageResend overdue; with all, every batch not yet sent on it
// (the goodbye). Nothing is sent to a control plane that does not read
// usage reports.
func (c *Client) sendUsage(stream agentStream, session uint64, capable bool) error {
	now := c.now()
	c.usageMu.Lock()
	if !capable {
		c.pruneUsageLocked(now)
		c.usageMu.Unlock()
		return nil
	}
	c.cutUsageLocked(now)
	var due []*controlplanev1.UsageReport
	for _, b := range c.usageBatches {
		if b.session == session && now.Sub(b.sentAt) < UsageResend {
			continue
		}
		if b.session != 0 {
			c.usageStats.Resent++
		}
		b.session, b.sentAt = session, now
		due = append(due, b.report)
	}
	c.usageMu.Unlock()
	for _, r := range due {
		if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Usage{Usage: r}}); err != nil {
			return err
		}
	}
	return nil
}

// usageAcked forgets an acknowledged batch (refused: logged, its turns
// counted).
func (c *Client) usageAcked(ctx context.Context, a *controlplanev1.UsageAck) {
	c.usageMu.Lock()
	defer c.usageMu.Unlock()
	i := slices.IndexFunc(c.usageBatches, func(b *usageBatch) bool { return b.report.GetSeq() == a.GetSeq() })
	if i < 0 {
		return // acknowledged before (a batch sent twice)
	}
	b := c.usageBatches[i]
	c.usageBatches = slices.Delete(c.usageBatches, i, i+1)
	if r := a.GetRefused(); r != "" {
		c.usageStats.Refused += b.turns
		c.log.WarnContext(ctx, "the control plane refused a usage report; its turns are left out of the ledger", "seq", a.GetSeq(), "turns", b.turns, "reason", r)
		return
	}
	c.usageStats.Acked++
}

// unackedUsage returns the turns of the batches waiting for an ack, and
// the rows not yet in one (logged at shutdown).
func (c *Client) unackedUsage() (turns int64, rows int) {
	c.usageMu.Lock()
	defer c.usageMu.Unlock()
	for _, b := range c.usageBatches {
		turns += b.turns
	}
	for _, r := range c.usageRows {
		turns += r.GetTurns()
	}
	return turns, len(c.usageBatches) + len(c.usageRows)
}

// fleetQuotas records the fleet's plan usage the control plane pushed: per
// account the newer of what it held and the push.
func (c *Client) fleetQuotas(p *controlplanev1.QuotaPush) {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	for _, rl := range p.GetAccounts() {
		k := rl.GetAccount()
		if !account.IsKey(k) {
			continue
		}
		cur, ok := c.fleet[k]
		if !ok && len(c.fleet) >= maxFleetQuotas {
			continue
		}
		if !ok || rl.GetAtUnixMs() >= cur.GetAtUnixMs() {
			c.fleet[k] = rl
		}
	}
}

// FleetLimits returns the fleet's latest plan usage of the account with
// key, as the control plane last pushed it (any data plane's report), and
// false when it pushed none. The accounts router reads it.
func (c *Client) FleetLimits(key string) (*controlplanev1.RateLimits, bool) {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	rl, ok := c.fleet[key]
	return rl, ok
}

// registerUsageMetrics registers the usage queue's metrics.
func (c *Client) registerUsageMetrics(reg prometheus.Registerer) error {
	c.usageDrops = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "clodex_dataplane_usage_dropped_turns_total",
		Help: "Turns whose usage was dropped before the control plane acknowledged it (older than an hour, or too many batches waiting).",
	})
	unacked := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "clodex_dataplane_usage_unacked_batches",
		Help: "Usage batches waiting for the control plane's acknowledgement.",
	}, func() float64 { return float64(c.UsageStats().Batches) })
	for _, m := range []prometheus.Collector{c.usageDrops, unacked} {
		if err := reg.Register(m); err != nil {
			return err
		}
	}
	return nil
}

// logUnackedUsage says, at shutdown, how much usage the control plane did
// not acknowledge: the ledger misses it.
func (c *Client) logUnackedUsage(ctx context.Context) {
	if turns, n := c.unackedUsage(); n > 0 {
		c.log.WarnContext(ctx, "usage the control plane did not acknowledge before the data plane stopped; the ledger misses these turns",
			"turns", turns, "batches_and_rows", n)
	}
}
