package store

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
)

// UsageDir is the usage ledger's directory inside the data directory.
//
// Each batch the control plane applies is appended to the journal of the
// day it arrived (usage-YYYY-MM-DD.log, one JSON line per batch) and
// synced before it is acknowledged; a restart replays the journals. A
// day's journal older than yesterday is compacted into its rows
// (usage-YYYY-MM-DD.json, written atomically, naming how many bytes of
// the journal it holds) and removed; the days past UsageRetention are
// deleted. A torn last line (a crash mid-write, never acknowledged) is cut
// off at start; any other line or file that does not decode affects only
// itself: it is skipped (a file set aside as FILE.corrupt-TIME) and
// logged.
const UsageDir = "usage"

const usageFileFormat = 1

// usageJournal is the ledger's files.
type usageJournal struct {
	dir  string
	log  *slog.Logger
	made bool // dir exists; guarded by the ledger's lock
}

// journalLine is one batch in a journal.
type journalLine struct {
	Agent string       `json:"agent"`
	Seq   uint64       `json:"seq"`
	AtMs  int64        `json:"at_ms"` // when it was applied
	Rows  []journalRow `json:"rows"`
}

// journalRow is one row in a journal line or a compacted day.
type journalRow struct {
	Minute  int64  `json:"minute"` // Unix minutes
	Member  string `json:"member,omitempty"`
	Agent   string `json:"agent,omitempty"` // compacted days only (a line's rows are its agent's)
	Account string `json:"account"`
	Model   string `json:"model"`
	Turns   int64  `json:"turns,omitempty"`
	Input   int64  `json:"input,omitempty"`
	Cached  int64  `json:"cached,omitempty"`
	Output  int64  `json:"output,omitempty"`
	Sockets int64  `json:"sockets,omitempty"`
	Refused int64  `json:"refused,omitempty"`
}

func (r journalRow) row() UsageRow {
	return UsageRow{Minute: time.Unix(r.Minute*60, 0).UTC(),
		UsageKey:    UsageKey{Member: r.Member, Agent: r.Agent, Account: r.Account, Model: r.Model},
		UsageCounts: UsageCounts{Turns: r.Turns, InputTokens: r.Input, CachedTokens: r.Cached, OutputTokens: r.Output, NewSockets: r.Sockets, Refusals: r.Refused}}
}

func toJournalRow(r UsageRow) journalRow {
	return journalRow{Minute: unixMinute(r.Minute), Member: r.Member, Agent: r.Agent, Account: r.Account, Model: r.Model,
		Turns: r.Turns, Input: r.InputTokens, Cached: r.CachedTokens, Output: r.OutputTokens, Sockets: r.NewSockets, Refused: r.Refusals}
}

// compactDay is a compacted day: its rows, and how much of its journal
// they hold (a journal of that day appended to later holds more).
type compactDay struct {
	Format   int          `json:"format"`
	LogBytes int64        `json:"log_bytes"`
	Rows     []journalRow `json:"rows"`
}

func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

func (j *usageJournal) logPath(day string) string {
	return filepath.Join(j.dir, "usage-"+day+".log")
}

func (j *usageJournal) dayPath(day string) string {
	return filepath.Join(j.dir, "usage-"+day+".json")
}

// openUsageJournal opens (creating it) the ledger's directory in dataDir
// and replays it into l at now.
func openUsageJournal(dataDir string, log *slog.Logger, now time.Time, l *usageLedger) (*usageJournal, error) {
	j := &usageJournal{dir: filepath.Join(dataDir, UsageDir), log: log}
	if _, err := os.Stat(j.dir); errors.Is(err, os.ErrNotExist) {
		return j, nil // made by the first batch
	}
	j.made = true
	days, err := j.days()
	if err != nil {
		return nil, err
	}
	for _, day := range days {
		j.load(day, now, l)
	}
	return j, nil
}

// days lists the days that have a journal or a compacted file, in order.
func (j *usageJournal) days() ([]string, error) {
	ents, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("usage ledger: read %s: %w", j.dir, err)
	}
	var days []string
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "usage-") {
			continue
		}
		day, ok := strings.CutSuffix(strings.TrimPrefix(name, "usage-"), ".log")
		if !ok {
			day, ok = strings.CutSuffix(strings.TrimPrefix(name, "usage-"), ".json")
		}
		if _, err := time.Parse(time.DateOnly, day); ok && err == nil {
			days = append(days, day)
		}
	}
	slices.Sort(days)
	return slices.Compact(days), nil
}

// load replays one day into l: its compacted rows, then the journal's
// lines past them.
func (j *usageJournal) load(day string, now time.Time, l *usageLedger) {
	cd, err := j.readDay(day)
	if err != nil {
		j.setAside(j.dayPath(day), err)
	}
	oldest := now.Add(-UsageRetention)
	for _, r := range cd.Rows {
		if row := r.row(); !row.Minute.Before(oldest) {
			l.addLocked(row)
		}
	}
	lines, err := j.readLog(day, cd.LogBytes, true)
	if err != nil {
		j.log.Error("usage ledger: a journal cannot be read; its batches are left out", "file", j.logPath(day), "err", err)
		return
	}
	for _, ln := range lines {
		b := UsageBatch{Agent: ln.Agent, Seq: ln.Seq}
		for _, r := range ln.Rows {
			b.Rows = append(b.Rows, r.row())
		}
		at := time.UnixMilli(ln.AtMs)
		l.applyLocked(b, now)
		if now.Sub(at) < UsageDedupWindow {
			l.seen[usageBatchID{b.Agent, b.Seq}] = at
		} else {
			delete(l.seen, usageBatchID{b.Agent, b.Seq})
		}
	}
}

// readDay reads a compacted day; a missing one is empty.
func (j *usageJournal) readDay(day string) (compactDay, error) {
	b, err := os.ReadFile(j.dayPath(day))
	if errors.Is(err, os.ErrNotExist) {
		return compactDay{}, nil
	}
	if err != nil {
		return compactDay{}, err
	}
	var cd compactDay
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cd); err != nil {
		return compactDay{}, fmt.Errorf("not the expected JSON: %w", err)
	}
	if cd.Format != usageFileFormat {
		return compactDay{}, fmt.Errorf("format %d; this control plane reads %d", cd.Format, usageFileFormat)
	}
	return cd, nil
}

// setAside renames an unreadable file to FILE.corrupt-TIME and says so.
func (j *usageJournal) setAside(path string, cause error) {
	aside := path + ".corrupt-" + time.Now().UTC().Format("20060102T150405Z")
	if err := os.Rename(path, aside); err != nil {
		j.log.Error("usage ledger: a file does not decode and cannot be set aside; its rows are left out", "file", path, "err", cause, "rename_err", err)
		return
	}
	j.log.Error("usage ledger: a file does not decode; it was set aside and its rows are left out", "file", path, "set_aside", aside, "err", cause)
}

// readLog returns the journal's lines from offset on. With repair, a torn
// last line (no newline: a write a crash cut, never acknowledged) is cut
// off the file. A line that does not decode is skipped and logged.
func (j *usageJournal) readLog(day string, offset int64, repair bool) ([]journalLine, error) {
	path := j.logPath(day)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if offset > int64(len(b)) {
		offset = int64(len(b))
	}
	whole := int64(bytes.LastIndexByte(b, '\n') + 1)
	if whole < int64(len(b)) && repair {
		if err := os.Truncate(path, whole); err != nil {
			return nil, fmt.Errorf("cut its torn last line: %w", err)
		}
		j.log.Warn("usage ledger: cut a torn last line off a journal (a batch a crash interrupted; it was not acknowledged and is sent again)",
			"file", path, "bytes", int64(len(b))-whole)
	}
	var out []journalLine
	bad := 0
	sc := bufio.NewScanner(bytes.NewReader(b[min(offset, whole):whole]))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ln journalLine
		if err := json.Unmarshal(sc.Bytes(), &ln); err != nil || ln.Agent == "" || ln.Seq == 0 {
			bad++
			continue
		}
		out = append(out, ln)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return out, err
	}
	if bad > 0 {
		j.log.Error("usage ledger: journal lines do not decode; they are left out", "file", path, "lines", bad)
	}
	return out, nil
}

// append writes batch b, applied at now, to today's journal and syncs it.
func (j *usageJournal) append(b UsageBatch, now time.Time) error {
	ln := journalLine{Agent: b.Agent, Seq: b.Seq, AtMs: now.UnixMilli(), Rows: make([]journalRow, len(b.Rows))}
	for i, r := range b.Rows {
		jr := toJournalRow(r)
		jr.Agent = ""
		ln.Rows[i] = jr
	}
	data, err := json.Marshal(ln)
	if err != nil {
		return fmt.Errorf("usage ledger: encode a batch: %w", err)
	}
	data = append(data, '\n')
	if !j.made {
		if err := os.MkdirAll(j.dir, 0o700); err != nil {
			return &WriteError{Dir: filepath.Dir(j.dir), Err: err}
		}
		j.made = true
	}
	f, err := os.OpenFile(j.logPath(dayOf(now)), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return &WriteError{Dir: j.dir, Err: err}
	}
	_, werr := f.Write(data)
	if werr == nil {
		werr = f.Sync()
	}
	if err := errors.Join(werr, f.Close()); err != nil {
		return &WriteError{Dir: j.dir, Err: err}
	}
	return nil
}

// tidy compacts the journals of the days before yesterday and deletes the
// days past the retention, at now.
func (j *usageJournal) tidy(now time.Time) error {
	if !j.made {
		return nil
	}
	days, err := j.days()
	if err != nil {
		return err
	}
	yesterday := dayOf(now.Add(-24 * time.Hour))
	var errs []error
	for _, day := range days {
		start, _ := time.Parse(time.DateOnly, day)
		switch {
		case !start.Add(UsageRetention + 25*time.Hour).After(now):
			// Its minutes (the day's, and at most an hour past it from a
			// data plane's clock ahead) are all past the retention.
			for _, p := range []string{j.logPath(day), j.dayPath(day)} {
				if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
					errs = append(errs, err)
				}
			}
		case day < yesterday:
			if err := j.compact(day); err != nil {
				errs = append(errs, fmt.Errorf("compact %s: %w", day, err))
			}
		}
	}
	return errors.Join(errs...)
}

// compact folds a day's journal into its compacted file and removes the
// journal.
func (j *usageJournal) compact(day string) error {
	fi, err := os.Stat(j.logPath(day))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	cd, err := j.readDay(day)
	if err != nil {
		j.setAside(j.dayPath(day), err)
		cd = compactDay{}
	}
	lines, err := j.readLog(day, cd.LogBytes, false)
	if err != nil {
		return err
	}
	rows := map[UsageKey]map[int64]*UsageCounts{}
	add := func(r UsageRow) {
		byMinute := rows[r.UsageKey]
		if byMinute == nil {
			byMinute = map[int64]*UsageCounts{}
			rows[r.UsageKey] = byMinute
		}
		c := byMinute[unixMinute(r.Minute)]
		if c == nil {
			c = &UsageCounts{}
			byMinute[unixMinute(r.Minute)] = c
		}
		c.Add(r.UsageCounts)
	}
	for _, r := range cd.Rows {
		add(r.row())
	}
	for _, ln := range lines {
		for _, r := range ln.Rows {
			row := r.row()
			row.Agent = ln.Agent
			add(row)
		}
	}
	out := compactDay{Format: usageFileFormat, LogBytes: fi.Size(), Rows: []journalRow{}}
	for k, byMinute := range rows {
		for mi, c := range byMinute {
			out.Rows = append(out.Rows, toJournalRow(UsageRow{Minute: time.Unix(mi*60, 0), UsageKey: k, UsageCounts: *c}))
		}
	}
	slices.SortFunc(out.Rows, func(a, b journalRow) int {
		if a.Minute != b.Minute {
			return int(a.Minute - b.Minute)
		}
		return strings.Compare(a.Member+"\x00"+a.Agent+"\x00"+a.Account+"\x00"+a.Model, b.Member+"\x00"+b.Agent+"\x00"+b.Account+"\x00"+b.Model)
	})
	data, err := json.Marshal(out)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(j.dayPath(day), data, 0o600); err != nil {
		return &WriteError{Dir: j.dir, Err: err}
	}
	if err := os.Remove(j.logPath(day)); err != nil {
		return &WriteError{Dir: j.dir, Err: err}
	}
	return nil
}
