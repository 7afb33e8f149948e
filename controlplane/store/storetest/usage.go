package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/store"
)

const (
	uk1 = "acct_00000000000000b1"
	uk2 = "acct_00000000000000b2"
)

// row is a usage row at t0 plus minute minutes.
func row(minute int, member, acct, model string, turns, in, cached, out, sockets, refused int64) store.UsageRow {
	return store.UsageRow{Minute: t0.Add(time.Duration(minute) * time.Minute),
		UsageKey:    store.UsageKey{Member: member, Account: acct, Model: model},
		UsageCounts: store.UsageCounts{Turns: turns, InputTokens: in, CachedTokens: cached, OutputTokens: out, NewSockets: sockets, Refusals: refused}}
}

func putUsage(t *testing.T, s Store, b store.UsageBatch, now time.Time) bool {
	t.Helper()
	applied, err := s.PutUsage(t.Context(), b, now)
	if err != nil {
		t.Fatalf("PutUsage(%s #%d): %v", b.Agent, b.Seq, err)
	}
	return applied
}

// sums reads the rows of [since, until) summed per key (minutes dropped).
func sums(t *testing.T, s Store, since, until time.Time) map[store.UsageKey]store.UsageCounts {
	t.Helper()
	out := map[store.UsageKey]store.UsageCounts{}
	err := s.UsageRows(t.Context(), since, until, func(r store.UsageRow) {
		c := out[r.UsageKey]
		c.Add(r.UsageCounts)
		out[r.UsageKey] = c
	})
	if err != nil {
		t.Fatalf("UsageRows: %v", err)
	}
	return out
}

// A batch is applied once per (agent, seq), through any handle on the
// store; the same seq of another agent is another batch; its rows carry
// the batch's agent.
func usageOnce(t *testing.T, k Kind) {
	clk := NewClock(t0)
	a := k.Open(t, clk.Now, nil)
	b := k.Peer(t, a, clk.Now)
	now := t0.Add(90 * time.Second)
	batch := store.UsageBatch{Agent: "h1", Seq: 1, Rows: []store.UsageRow{
		row(0, "alice", uk1, "claude-sonnet-4-5", 3, 3000, 1000, 300, 1, 0),
		row(1, "bob", uk2, "gpt-5.5", 1, 500, 0, 50, 1, 1),
	}}
	if !putUsage(t, a, batch, now) {
		t.Fatal("PutUsage of a new batch: applied = false, want true")
	}
	if putUsage(t, b, batch, now.Add(time.Minute)) {
		t.Error("PutUsage of the same batch through another handle: applied = true, want false (counted once)")
	}
	other := batch
	other.Agent = "h2"
	if !putUsage(t, b, other, now) {
		t.Error("PutUsage of seq 1 of another agent: applied = false, want true")
	}
	got := sums(t, a, t0, t0.Add(time.Hour))
	want := map[store.UsageKey]store.UsageCounts{
		{Member: "alice", Agent: "h1", Account: uk1, Model: "claude-sonnet-4-5"}: {Turns: 3, InputTokens: 3000, CachedTokens: 1000, OutputTokens: 300, NewSockets: 1},
		{Member: "bob", Agent: "h1", Account: uk2, Model: "gpt-5.5"}:             {Turns: 1, InputTokens: 500, OutputTokens: 50, NewSockets: 1, Refusals: 1},
		{Member: "alice", Agent: "h2", Account: uk1, Model: "claude-sonnet-4-5"}: {Turns: 3, InputTokens: 3000, CachedTokens: 1000, OutputTokens: 300, NewSockets: 1},
		{Member: "bob", Agent: "h2", Account: uk2, Model: "gpt-5.5"}:             {Turns: 1, InputTokens: 500, OutputTokens: 50, NewSockets: 1, Refusals: 1},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("rows = %v\nwant %v", got, want)
	}
	// A row older than the retention at the batch's arrival is left out.
	late := store.UsageBatch{Agent: "h3", Seq: 1, Rows: []store.UsageRow{row(0, "carol", uk1, "m", 1, 1, 0, 1, 0, 0)}}
	putUsage(t, a, late, t0.Add(store.UsageRetention+time.Hour))
	if got := sums(t, a, t0, t0.Add(time.Hour)); len(got) != 4 {
		t.Errorf("after a batch of a row past the retention: %d rows, want the 4 before", len(got))
	}
}

// A query sums the minutes from since's through until's; rows of one
// key in several minutes and batches add up. A span over a whole hour
// reads the same sums as its minutes.
func usageMinutes(t *testing.T, k Kind) {
	clk := NewClock(t0)
	s := k.Open(t, clk.Now, nil)
	now := t0.Add(3 * time.Hour)
	var seq uint64
	put := func(rows ...store.UsageRow) {
		seq++
		putUsage(t, s, store.UsageBatch{Agent: "h1", Seq: seq, Rows: rows}, now)
	}
	// Minutes 0, 1, 59, 60, 61, 119, 120 and 150, one turn each of 10
	// input tokens, in three batches; minute 1 twice.
	put(row(0, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(1, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(59, "m", uk1, "x", 1, 10, 0, 1, 0, 0))
	put(row(60, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(61, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(119, "m", uk1, "x", 1, 10, 0, 1, 0, 0))
	put(row(120, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(150, "m", uk1, "x", 1, 10, 0, 1, 0, 0), row(1, "m", uk1, "x", 1, 10, 0, 1, 0, 0))
	key := store.UsageKey{Member: "m", Agent: "h1", Account: uk1, Model: "x"}
	for _, tt := range []struct {
		name         string
		since, until time.Duration
		turns        int64
	}{
		{"everything", 0, 3 * time.Hour, 9},
		{"minute 1 alone", time.Minute, 90 * time.Second, 2},
		{"until inside minute 1 includes it", 30 * time.Second, 90 * time.Second, 3},
		{"since inside minute 0 includes it", 30 * time.Second, 59 * time.Second, 1},
		{"the second hour, whole", time.Hour, 119*time.Minute + 59*time.Second, 3},
		{"minute 59 to 61", 59 * time.Minute, 61 * time.Minute, 3},
		{"from the second hour on", time.Hour, 3 * time.Hour, 5},
		{"nothing after minute 150", 151 * time.Minute, 3 * time.Hour, 0},
	} {
		got := sums(t, s, t0.Add(tt.since), t0.Add(tt.until))
		if c := got[key]; c.Turns != tt.turns || c.InputTokens != 10*tt.turns || len(got) > 1 {
			t.Errorf("%s: %v, want %d turns of 10 input tokens each, one key", tt.name, got, tt.turns)
		}
	}
}

// A minute keeps UsageRowsPerMinute distinct rows; the usage of any
// further key that minute is added to the row whose keys are all
// UsageOther, so the minute's totals stay whole. Another minute has its
// own cap.
func usageCap(t *testing.T, k Kind) {
	clk := NewClock(t0)
	s := k.Open(t, clk.Now, nil)
	now := t0.Add(time.Minute)
	const extra = 7
	var seq uint64
	var rows []store.UsageRow
	flush := func() {
		seq++
		putUsage(t, s, store.UsageBatch{Agent: "h1", Seq: seq, Rows: rows}, now)
		rows = nil
	}
	for i := range store.UsageRowsPerMinute + extra {
		rows = append(rows, row(0, fmt.Sprintf("member-%04d", i), uk1, "x", 1, 100, 0, 10, 0, 0))
		if len(rows) == 200 {
			flush()
		}
	}
	rows = append(rows, row(1, "member-9999", uk1, "x", 1, 100, 0, 10, 0, 0)) // the next minute
	flush()
	got := sums(t, s, t0, t0.Add(59*time.Second))
	other := got[store.UsageKey{Member: store.UsageOther, Agent: store.UsageOther, Account: store.UsageOther, Model: store.UsageOther}]
	var total store.UsageCounts
	for _, c := range got {
		total.Add(c)
	}
	if len(got) != store.UsageRowsPerMinute+1 || other.Turns != extra || other.InputTokens != 100*extra {
		t.Errorf("a minute of %d keys: %d rows, other = %+v; want %d rows and other holding the %d past the cap",
			store.UsageRowsPerMinute+extra, len(got), other, store.UsageRowsPerMinute+1, extra)
	}
	if total.Turns != store.UsageRowsPerMinute+extra || total.OutputTokens != 10*(store.UsageRowsPerMinute+extra) {
		t.Errorf("the minute's totals = %+v, want %d turns (whole)", total, store.UsageRowsPerMinute+extra)
	}
	if next := sums(t, s, t0.Add(time.Minute), t0.Add(119*time.Second)); len(next) != 1 {
		t.Errorf("the next minute: %v, want its one row", next)
	}
}
