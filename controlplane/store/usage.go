package store

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// The usage ledger: what every turn of the fleet used, per minute and per
// (member, agent, account, model), as data planes report it in batches
// (docs/operations.md §16). It is history, not durable state in the sense
// of docs/operations.md §8: it is not in backups, and a store that loses
// it starts it again empty.
const (
	// UsageRetention is how long the ledger keeps a minute.
	UsageRetention = 30 * 24 * time.Hour
	// UsageRowsPerMinute caps the distinct rows of one minute: the usage
	// of any further (member, agent, account, model) of that minute is
	// added to the row whose keys are all UsageOther.
	UsageRowsPerMinute = 1000
	// UsageOther is every key of the row a minute's rows past
	// UsageRowsPerMinute fold into.
	UsageOther = "other"
	// UsageDedupWindow is how long the ledger remembers a batch it
	// applied, by (agent, seq): a batch sent again within it is not
	// counted twice. Data planes keep an unacknowledged batch for an hour.
	UsageDedupWindow = 2 * time.Hour
)

// UsageKey is what a ledger row is about.
type UsageKey struct {
	Member, Agent, Account, Model string
}

// usageOther is the key of the folded row.
var usageOther = UsageKey{Member: UsageOther, Agent: UsageOther, Account: UsageOther, Model: UsageOther}

// UsageCounts are a row's counts: turns (every outcome), the backend's
// token figures (input_tokens includes the cached ones), the new upstream
// sockets the turns opened and the turns admission refused.
type UsageCounts struct {
	Turns, InputTokens, CachedTokens, OutputTokens, NewSockets, Refusals int64
}

// Add adds o to c.
func (c *UsageCounts) Add(o UsageCounts) {
	c.Turns += o.Turns
	c.InputTokens += o.InputTokens
	c.CachedTokens += o.CachedTokens
	c.OutputTokens += o.OutputTokens
	c.NewSockets += o.NewSockets
	c.Refusals += o.Refusals
}

// UsageRow is one minute's usage of one key.
type UsageRow struct {
	// Minute is the minute's start (UTC, whole minutes).
	Minute time.Time
	UsageKey
	UsageCounts
}

// UsageBatch is one report of an agent: its rows carry the agent's id.
type UsageBatch struct {
	Agent string
	Seq   uint64
	Rows  []UsageRow
}

// usageBatchID names a batch for deduplication.
type usageBatchID struct {
	agent string
	seq   uint64
}

// usageLedger is Memory's ledger: minutes (Unix minutes) to rows, the
// batches applied within UsageDedupWindow, and, with a data dir, the
// journal it is replayed from at start.
type usageLedger struct {
	mu      sync.Mutex // guards the following fields; held across a journal write
	minutes map[int64]map[UsageKey]*UsageCounts
	seen    map[usageBatchID]time.Time // when each batch was applied
	journal *usageJournal              // nil without a data dir
}

// unixMinute is t's minute, in minutes since the Unix epoch.
func unixMinute(t time.Time) int64 { return t.Unix() / 60 }

// addLocked adds one row, folding it into the other row when its minute
// is full.
func (l *usageLedger) addLocked(r UsageRow) {
	if l.minutes == nil {
		l.minutes = map[int64]map[UsageKey]*UsageCounts{}
	}
	m := unixMinute(r.Minute)
	rows := l.minutes[m]
	if rows == nil {
		rows = map[UsageKey]*UsageCounts{}
		l.minutes[m] = rows
	}
	c := rows[r.UsageKey]
	if c == nil {
		k := r.UsageKey
		if len(rows) >= UsageRowsPerMinute {
			k = usageOther
			c = rows[k]
		}
		if c == nil {
			c = &UsageCounts{}
			rows[k] = c
		}
	}
	c.Add(r.UsageCounts)
}

// PutUsage applies batch b, received at now, unless a batch with its
// agent and sequence number was applied within UsageDedupWindow (applied
// is then false). With a data dir the batch is in the journal, synced,
// before PutUsage returns; a write that fails is an error (a *WriteError)
// and applies nothing, so the data plane sends the batch again. Rows
// older than UsageRetention are left out.
func (m *Memory) PutUsage(_ context.Context, b UsageBatch, now time.Time) (applied bool, err error) {
	l := &m.usage
	l.mu.Lock()
	defer l.mu.Unlock()
	id := usageBatchID{b.Agent, b.Seq}
	if at, ok := l.seen[id]; ok && now.Sub(at) < UsageDedupWindow {
		return false, nil
	}
	if l.journal != nil {
		if err := l.journal.append(b, now); err != nil {
			return false, err
		}
	}
	l.applyLocked(b, now)
	return true, nil
}

// applyLocked adds b's rows that are within the retention at now and
// remembers b.
func (l *usageLedger) applyLocked(b UsageBatch, now time.Time) {
	if l.seen == nil {
		l.seen = map[usageBatchID]time.Time{}
	}
	l.seen[usageBatchID{b.Agent, b.Seq}] = now
	oldest := now.Add(-UsageRetention)
	for _, r := range b.Rows {
		if r.Minute.Before(oldest) {
			continue
		}
		r.Agent = b.Agent
		l.addLocked(r)
	}
}

// UsageMinutes returns the minutes a query from since to until sums, in
// Unix minutes [from, to): since's minute through until's (so until =
// now includes the current minute).
func UsageMinutes(since, until time.Time) (from, to int64) {
	return unixMinute(since), unixMinute(until) + 1
}

// UsageRows calls fn with every ledger row of the minutes UsageMinutes
// names, under the ledger's lock: fn must not call the store.
func (m *Memory) UsageRows(_ context.Context, since, until time.Time, fn func(UsageRow)) error {
	l := &m.usage
	l.mu.Lock()
	defer l.mu.Unlock()
	from, to := UsageMinutes(since, until)
	if to-from < int64(len(l.minutes)) {
		for mi := from; mi < to; mi++ {
			l.eachRowLocked(mi, fn)
		}
		return nil
	}
	for mi := range l.minutes {
		if mi >= from && mi < to {
			l.eachRowLocked(mi, fn)
		}
	}
	return nil
}

func (l *usageLedger) eachRowLocked(mi int64, fn func(UsageRow)) {
	at := time.Unix(mi*60, 0).UTC()
	for k, c := range l.minutes[mi] {
		fn(UsageRow{Minute: at, UsageKey: k, UsageCounts: *c})
	}
}

// sweepUsage forgets the minutes past UsageRetention and the batches past
// UsageDedupWindow at now, and tidies the journal (compaction, expired
// days), logging what it cannot.
func (m *Memory) sweepUsage(now time.Time, log *slog.Logger) {
	l := &m.usage
	l.mu.Lock()
	defer l.mu.Unlock()
	oldest := unixMinute(now.Add(-UsageRetention))
	for mi := range l.minutes {
		if mi < oldest {
			delete(l.minutes, mi)
		}
	}
	for id, at := range l.seen {
		if now.Sub(at) >= UsageDedupWindow {
			delete(l.seen, id)
		}
	}
	if l.journal != nil {
		if err := l.journal.tidy(now); err != nil {
			log.Warn("usage ledger: tidying its files", "dir", l.journal.dir, "err", err)
		}
	}
}
