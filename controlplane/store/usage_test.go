package store

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func usageRow(at time.Time, member, acct string, turns, in int64) UsageRow {
	return UsageRow{Minute: at.Truncate(time.Minute), UsageKey: UsageKey{Member: member, Account: acct, Model: "claude-sonnet-4-5"},
		UsageCounts: UsageCounts{Turns: turns, InputTokens: in, CachedTokens: in / 2, OutputTokens: turns * 7, NewSockets: 1}}
}

// totals sums every row of the ledger from t0-31d to t0+31d.
func totals(t *testing.T, m *Memory) (UsageCounts, int) {
	t.Helper()
	var c UsageCounts
	n := 0
	err := m.UsageRows(t.Context(), t0.Add(-31*24*time.Hour), t0.Add(31*24*time.Hour), func(r UsageRow) {
		c.Add(r.UsageCounts)
		n++
	})
	if err != nil {
		t.Fatal(err)
	}
	return c, n
}

func openUsage(t *testing.T, dir string, now time.Time, log *slog.Logger) *Memory {
	t.Helper()
	m, err := Open(Options{Dir: dir, Now: func() time.Time { return now }, Logger: log})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return m
}

func mustPut(t *testing.T, m *Memory, b UsageBatch, now time.Time) bool {
	t.Helper()
	applied, err := m.PutUsage(t.Context(), b, now)
	if err != nil {
		t.Fatalf("PutUsage(%s #%d): %v", b.Agent, b.Seq, err)
	}
	return applied
}

// The ledger in a data dir survives a restart: the batches are replayed
// and a batch applied before the restart is still applied only once.
func TestUsageSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	m := openUsage(t, dir, t0, nil)
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 1, Rows: []UsageRow{usageRow(t0, "alice", key, 2, 100)}}, t0)
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 2, Rows: []UsageRow{usageRow(t0, "alice", key, 1, 50), usageRow(t0, "bob", key2, 4, 10)}}, t0.Add(time.Second))
	before, rows := totals(t, m)

	m2 := openUsage(t, dir, t0.Add(time.Minute), nil)
	after, rows2 := totals(t, m2)
	if after != before || rows2 != rows || before.Turns != 7 || before.InputTokens != 160 {
		t.Errorf("after a restart: %+v in %d rows, want %+v in %d rows (7 turns, 160 input tokens)", after, rows2, before, rows)
	}
	if mustPut(t, m2, UsageBatch{Agent: "h1", Seq: 2, Rows: []UsageRow{usageRow(t0, "alice", key, 1, 50)}}, t0.Add(2*time.Minute)) {
		t.Error("a batch applied before the restart, sent again: applied = true, want false")
	}
	if got, _ := totals(t, m2); got != before {
		t.Errorf("after the resend: %+v, want %+v", got, before)
	}
}

// A journal's torn last line (a crash mid-write: never acknowledged) is
// cut off at start and the data plane's resend applies it; a line in the
// middle that does not decode affects only itself and is logged.
func TestUsageJournalDamage(t *testing.T) {
	dir := t.TempDir()
	m := openUsage(t, dir, t0, nil)
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 1, Rows: []UsageRow{usageRow(t0, "alice", key, 1, 10)}}, t0)
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 2, Rows: []UsageRow{usageRow(t0, "alice", key, 2, 20)}}, t0)
	log := filepath.Join(dir, UsageDir, "usage-"+dayOf(t0)+".log")
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	// garbage between the two lines, and half a third line at the end
	damaged := slices.Concat(lines[0], []byte("{not json\n"), lines[1], lines[1][:len(lines[1])/2])
	if err := os.WriteFile(log, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	m2 := openUsage(t, dir, t0.Add(time.Minute), slog.New(slog.NewTextHandler(&logs, nil)))
	if got, _ := totals(t, m2); got.Turns != 3 || got.InputTokens != 30 {
		t.Errorf("after damage: %+v, want the two whole batches (3 turns, 30 input tokens)", got)
	}
	if fi, _ := os.Stat(log); fi.Size() != int64(len(damaged)-len(lines[1])/2) {
		t.Errorf("journal is %d bytes, want %d (the torn line cut off)", fi.Size(), len(damaged)-len(lines[1])/2)
	}
	for _, want := range []string{"cut a torn last line", "journal lines do not decode"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs.String())
		}
	}
	// The next batch goes on a line of its own.
	mustPut(t, m2, UsageBatch{Agent: "h1", Seq: 3, Rows: []UsageRow{usageRow(t0, "alice", key, 4, 40)}}, t0.Add(time.Minute))
	m3 := openUsage(t, dir, t0.Add(2*time.Minute), nil)
	if got, _ := totals(t, m3); got.Turns != 7 {
		t.Errorf("after another restart: %d turns, want 7", got.Turns)
	}
}

// A batch the data dir cannot hold is an error naming the dir, and
// nothing of it is applied: the data plane sends it again, and then it
// counts once.
func TestUsageWriteFailure(t *testing.T) {
	dir := t.TempDir()
	m := openUsage(t, dir, t0, nil)
	// A file where the ledger's directory goes: every write fails.
	if err := os.WriteFile(filepath.Join(dir, UsageDir), []byte("in the way"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := UsageBatch{Agent: "h1", Seq: 1, Rows: []UsageRow{usageRow(t0, "alice", key, 2, 20)}}
	_, err := m.PutUsage(t.Context(), b, t0)
	var we *WriteError
	if !errors.As(err, &we) || we.Dir != dir {
		t.Fatalf("PutUsage into a data dir that cannot hold it = %v, want a *WriteError naming %s", err, dir)
	}
	if got, _ := totals(t, m); got.Turns != 0 {
		t.Errorf("after a failed write: %d turns, want 0", got.Turns)
	}
	if err := os.Remove(filepath.Join(dir, UsageDir)); err != nil {
		t.Fatal(err)
	}
	if !mustPut(t, m, b, t0.Add(30*time.Second)) {
		t.Error("the batch sent again: applied = false, want true")
	}
	if got, _ := totals(t, m); got.Turns != 2 {
		t.Errorf("after the resend: %d turns, want 2", got.Turns)
	}
}

// Minutes older than UsageRetention are forgotten by the sweep, in
// memory and on disk: a day's journal is compacted once it is older than
// yesterday (same totals after a restart) and deleted past the
// retention; a batch is forgotten after UsageDedupWindow.
func TestUsageRetention(t *testing.T) {
	dir := t.TempDir()
	m := openUsage(t, dir, t0, nil)
	day := 24 * time.Hour
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 1, Rows: []UsageRow{usageRow(t0, "alice", key, 1, 10)}}, t0)
	mustPut(t, m, UsageBatch{Agent: "h1", Seq: 2, Rows: []UsageRow{usageRow(t0.Add(2*day), "alice", key, 2, 20)}}, t0.Add(2*day))

	m.sweepUsage(t0.Add(3*day), slog.New(slog.DiscardHandler))
	files := func() []string {
		ents, _ := os.ReadDir(filepath.Join(dir, UsageDir))
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		return out
	}
	want := []string{"usage-" + dayOf(t0) + ".json", "usage-" + dayOf(t0.Add(2*day)) + ".log"}
	if got := files(); !slices.Equal(got, want) {
		t.Errorf("after the sweep on day 3: files %v, want %v (day 0 compacted, day 2 a journal)", got, want)
	}
	r := openUsage(t, dir, t0.Add(3*day), nil)
	if got, _ := totals(t, r); got.Turns != 3 || got.InputTokens != 30 {
		t.Errorf("reopened after compaction: %+v, want 3 turns, 30 input tokens", got)
	}

	// Day 0's minute: kept until 30 days after it, then gone from memory;
	// its file goes a day later.
	m.sweepUsage(t0.Add(UsageRetention-time.Minute), slog.New(slog.DiscardHandler))
	if got, _ := totals(t, m); got.Turns != 3 {
		t.Errorf("a minute before day 0's 30 days end: %d turns, want 3", got.Turns)
	}
	m.sweepUsage(t0.Add(UsageRetention+time.Minute), slog.New(slog.DiscardHandler))
	if got, _ := totals(t, m); got.Turns != 2 {
		t.Errorf("a minute after day 0's 30 days: %d turns, want day 2's 2", got.Turns)
	}
	m.sweepUsage(t0.Add(UsageRetention+12*time.Hour), slog.New(slog.DiscardHandler))
	if got := files(); !slices.Contains(got, "usage-"+dayOf(t0)+".json") {
		t.Errorf("30 days and 12 hours after day 0's noon: files %v, want its file kept (it could hold the day's last hour)", got)
	}
	m.sweepUsage(t0.Add(UsageRetention+day+time.Hour), slog.New(slog.DiscardHandler))
	if got := files(); slices.Contains(got, "usage-"+dayOf(t0)+".json") {
		t.Errorf("31 days and an hour after day 0's noon: files %v, want its file deleted", got)
	}
	r2 := openUsage(t, dir, t0.Add(UsageRetention+day+time.Hour), nil)
	if got, _ := totals(t, r2); got.Turns != 2 {
		t.Errorf("reopened 31 days later: %d turns, want day 2's 2", got.Turns)
	}
}

// A batch is applied once within UsageDedupWindow of its application,
// across a restart too; past the window it is forgotten (data planes
// drop what waited an hour, so none is sent that late).
func TestUsageDedupWindow(t *testing.T) {
	dir := t.TempDir()
	m := openUsage(t, dir, t0, nil)
	b := UsageBatch{Agent: "h1", Seq: 1, Rows: []UsageRow{usageRow(t0, "alice", key, 1, 10)}}
	mustPut(t, m, b, t0)
	if mustPut(t, m, b, t0.Add(UsageDedupWindow-time.Second)) {
		t.Error("a resend just within the window was applied")
	}
	r := openUsage(t, dir, t0.Add(UsageDedupWindow-2*time.Second), nil)
	if mustPut(t, r, b, t0.Add(UsageDedupWindow-time.Second)) {
		t.Error("after a restart, a resend within the window was applied")
	}
	m.sweepUsage(t0.Add(UsageDedupWindow), slog.New(slog.DiscardHandler))
	if !mustPut(t, m, b, t0.Add(UsageDedupWindow)) {
		t.Error("a batch sent again past the window was not applied")
	}
}
