package store

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/clodex/clodex/internal/atomicfile"
)

// DefaultBackupKeep is how many backups a BackupDir keeps.
const DefaultBackupKeep = 10

// backupPrefix and backupSuffix frame a backup file's name:
// clodex-backup-<UTC time>-<replica>.cbk.
const (
	backupPrefix = "clodex-backup-"
	backupSuffix = ".cbk"
	backupTime   = "20060102T150405.000Z"
)

// BackupOptions configures OpenBackupDir.
type BackupOptions struct {
	// Dir holds the backups; it is created with mode 0700. (Required)
	Dir string
	// Replica names the writer in each file's name. (Optional)
	Replica string
	// Sealer seals each file (the credential key). (Optional; default
	// none: plain JSON, mode 0600, for a control plane without sign-ins)
	Sealer Sealer
	// Keep is how many of the newest files are kept. (Optional; default
	// DefaultBackupKeep)
	Keep int
	// Logger receives a line per failed write. (Optional; default
	// discards)
	Logger *slog.Logger
	// Registerer receives clodex_controlplane_backups_total and
	// clodex_controlplane_backup_last_unix_seconds. (Optional)
	Registerer prometheus.Registerer
}

// BackupDir keeps a replica's backups in one directory: each one a whole
// Snapshot, written atomically with mode 0600 (sealed with the credential
// key when there is one), named by its time and replica; the newest Keep
// are kept. A snapshot that did not change since the last backup is not
// written again.
type BackupDir struct {
	dir     string
	replica string
	sealer  Sealer
	keep    int
	log     *slog.Logger
	written *prometheus.CounterVec
	last    prometheus.Gauge

	mu      sync.Mutex // guards the following fields
	lastSum [sha256.Size]byte
	seq     time.Time // the last file's time, kept increasing
}

// OpenBackupDir creates the directory if needed and proves it writable.
func OpenBackupDir(opts BackupOptions) (*BackupDir, error) {
	if opts.Dir == "" {
		return nil, errors.New("open backup dir: the directory is empty")
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("open backup dir: %w", &WriteError{Dir: opts.Dir, Err: err})
	}
	if err := CheckDir(opts.Dir); err != nil {
		return nil, fmt.Errorf("open backup dir: %w", err)
	}
	b := &BackupDir{dir: opts.Dir, replica: fileSafe(opts.Replica), sealer: opts.Sealer, keep: opts.Keep, log: opts.Logger}
	if b.keep <= 0 {
		b.keep = DefaultBackupKeep
	}
	if b.log == nil {
		b.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b.written = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "clodex_controlplane_backups_total",
		Help: "Backups of the durable state this replica wrote to --backup-dir, by result (written, failed).",
	}, []string{"result"})
	b.written.WithLabelValues("written")
	b.written.WithLabelValues("failed")
	b.last = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "clodex_controlplane_backup_last_unix_seconds",
		Help: "When this replica last wrote a backup to --backup-dir, Unix seconds (0: not yet).",
	})
	if opts.Registerer != nil {
		for _, c := range []prometheus.Collector{b.written, b.last} {
			if err := opts.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("open backup dir: register metrics: %w", err)
			}
		}
	}
	return b, nil
}

// Dir is the backup directory.
func (b *BackupDir) Dir() string { return b.dir }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func fileSafe(s string) string {
	s = unsafeName.ReplaceAllString(s, "_")
	if s == "" {
		return "replica"
	}
	return s
}

// Write writes s as a new backup unless its content equals the last one
// written, and removes the oldest files beyond Keep. It returns the new
// file's path ("" when nothing was written).
func (b *BackupDir) Write(s Snapshot) (string, error) {
	sum, err := contentSum(s)
	if err != nil {
		return "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if sum == b.lastSum {
		return "", nil
	}
	data, err := EncodeBackup(s, b.sealer)
	if err != nil {
		return "", err
	}
	at := s.Created.UTC()
	if !at.After(b.seq) {
		at = b.seq.Add(time.Millisecond)
	}
	at = at.Truncate(time.Millisecond)
	path := filepath.Join(b.dir, backupPrefix+at.Format(backupTime)+"-"+b.replica+backupSuffix)
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		b.written.WithLabelValues("failed").Inc()
		return "", fmt.Errorf("write backup: %w", &WriteError{Dir: b.dir, Err: err})
	}
	b.seq, b.lastSum = at, sum
	b.written.WithLabelValues("written").Inc()
	b.last.Set(float64(time.Now().Unix()))
	b.prune()
	return path, nil
}

// contentSum is the digest of s without its creation time.
func contentSum(s Snapshot) ([sha256.Size]byte, error) {
	s.Created = time.Time{}
	j, err := json.Marshal(s.normalized())
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("encode backup: %w", err)
	}
	return sha256.Sum256(j), nil
}

// files returns the backup files' names, newest first.
func (b *BackupDir) files() ([]string, error) {
	ents, err := os.ReadDir(b.dir)
	if err != nil {
		return nil, fmt.Errorf("list backups in %s: %w", b.dir, err)
	}
	var names []string
	for _, e := range ents {
		if n := e.Name(); e.Type().IsRegular() && strings.HasPrefix(n, backupPrefix) && strings.HasSuffix(n, backupSuffix) {
			names = append(names, n)
		}
	}
	slices.SortFunc(names, func(a, c string) int { return strings.Compare(c, a) })
	return names, nil
}

// prune removes the files beyond the newest keep.
func (b *BackupDir) prune() {
	names, err := b.files()
	if err != nil {
		return
	}
	for _, n := range names[min(len(names), b.keep):] {
		if err := os.Remove(filepath.Join(b.dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			b.log.Warn("remove an old backup", "file", n, "err", err)
		}
	}
}

// ErrNoBackup reports a backup directory without a usable backup.
var ErrNoBackup = errors.New("no backup")

// Newest returns the newest backup that opens and decodes, and its path.
// Files that do not are skipped and reported in skipped (their names and
// why); none at all is ErrNoBackup.
func (b *BackupDir) Newest() (s Snapshot, path string, skipped []string, err error) {
	names, err := b.files()
	if err != nil {
		return Snapshot{}, "", nil, err
	}
	for _, n := range names {
		p := filepath.Join(b.dir, n)
		data, err := os.ReadFile(p)
		if err == nil {
			s, err = DecodeBackup(data, b.sealer)
		}
		if err != nil {
			skipped = append(skipped, n+": "+err.Error())
			continue
		}
		return s, p, skipped, nil
	}
	return Snapshot{}, "", skipped, fmt.Errorf("%w in %s", ErrNoBackup, b.dir)
}

// Run writes a backup whenever the state src returns changed: at once
// when changed signals, and otherwise checked every second, until ctx
// ends. changes, when set, is a counter of src's changes: src is read
// only when it moved.
func (b *BackupDir) Run(ctx context.Context, src func(context.Context) (Snapshot, error), changes func() uint64, changed <-chan struct{}) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var seen uint64
	pending := true // nothing written yet, or the last write failed
	for {
		if changes == nil {
			b.writeFrom(ctx, src)
		} else if n := changes(); n != seen || pending {
			seen, pending = n, !b.writeFrom(ctx, src)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-changed:
		}
	}
}

// writeFrom writes src's state and reports whether it is backed up.
func (b *BackupDir) writeFrom(ctx context.Context, src func(context.Context) (Snapshot, error)) bool {
	s, err := src(ctx)
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("backup not written: the state could not be read", "dir", b.dir, "err", err)
		}
		return false
	}
	if _, err := b.Write(s); err != nil {
		b.log.Error("backup not written", "dir", b.dir, "err", err)
		return false
	}
	return true
}
