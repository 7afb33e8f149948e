package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/clodex/clodex/internal/filelock"
)

// Login is one account's ChatGPT sign-in as the credential broker keeps
// it. The tokens are sealed by the broker (encrypted with its key) before
// they reach a store: a store never sees them in clear.
type Login struct {
	// Key is the account key. (Not stored in the record: it is the
	// record's name.)
	Key string `json:"-"`
	// AccountID is the ChatGPT account id (the chatgpt-account-id header).
	AccountID string `json:"account_id"`
	// Sealed holds the sealed tokens (access, refresh, id).
	Sealed []byte `json:"sealed"`
	// Expiry is the access token's expiry; zero when unknown.
	Expiry time.Time `json:"expiry"`
	// LifetimeMs is the access token's lifetime (exp - iat); 0 when
	// unknown.
	LifetimeMs int64 `json:"lifetime_ms,omitempty"`
	// Refreshed is when the tokens were last written (import, login or
	// refresh).
	Refreshed time.Time `json:"refreshed"`
	// Refreshes counts the refreshes since the last import or login.
	Refreshes int64 `json:"refreshes,omitempty"`
	// NeedsLogin is why the sign-in can no longer be refreshed
	// (refresh_token_reused, ...); "" while it can.
	NeedsLogin string `json:"needs_login,omitempty"`
	// Generation counts the record's writes; PutLogin writes only over the
	// generation it was given (0: no record yet). It only grows, across
	// removals too (Redis), so a restore keeps the newer of two copies.
	Generation int64 `json:"generation"`
	// Unreadable, when set, says the stored record does not decode and no
	// good copy was at hand (Logins lists it so; the other fields but Key
	// are empty). Never stored.
	Unreadable string `json:"-"`
}

// Lease is the right to refresh one account's login: one holder at a time
// across every process sharing the store (a lock file for the file store,
// a Redis key with a fencing token for Redis). Release it when done.
type Lease struct {
	// Key is the account key.
	Key string
	// Fence is the lease's fencing token (Redis): a write made under a
	// lease that expired and was taken by another holder is refused.
	Fence int64

	release func() error
}

// NewLease returns key's lease with fencing token fence (0 without one);
// release gives it up, and runs once (Release). It is for the stores.
func NewLease(key string, fence int64, release func() error) *Lease {
	return &Lease{Key: key, Fence: fence, release: release}
}

// Release gives the lease up. Calls after the first do nothing.
func (l *Lease) Release() error {
	if l == nil || l.release == nil {
		return nil
	}
	f := l.release
	l.release = nil
	return f()
}

var (
	// ErrConflict reports a write over a generation that is no longer the
	// stored one: another writer got there first.
	ErrConflict = errors.New("login changed meanwhile")
	// ErrFenced reports a write under a lease another holder has taken
	// since (it expired).
	ErrFenced = errors.New("refresh lease lost to another holder")
)

// LoginsFile is the logins file's name inside the data directory.
const LoginsFile = "logins.json"

const loginsFormat = 1

// loginsDoc is the logins file.
type loginsDoc struct {
	Format     int                  `json:"format"`
	Logins     map[string]Login     `json:"logins"`
	AgentCreds map[string]AgentCred `json:"agent_credentials,omitempty"`
	Members    map[string]Member    `json:"members,omitempty"`
}

// LoginFile keeps logins in DIR/logins.json, written atomically with mode
// 0600 under DIR/logins.json.lock; leases are lock files
// DIR/leases/KEY.lock. It is safe for concurrent use, and for several
// processes sharing the directory. It is the credential broker's
// broker.Logins and the server's controlplane.AgentCredStore and
// controlplane.MemberStore.
type LoginFile struct {
	dir    string
	log    *slog.Logger
	writes atomic.Uint64 // counts writes, for backups

	mu sync.Mutex // serialises this process's read-modify-writes

	recMu     sync.Mutex // guards recovered
	recovered recovery
}

// LoginOptions configures OpenLoginFile.
type LoginOptions struct {
	// Dir is the data directory. (Required)
	Dir string
	// Logger receives a logins file recovered from its last good copy or
	// restored from a backup. (Optional; default discards)
	Logger *slog.Logger
	// Backup returns the newest backup: a missing logins.json, or one
	// unreadable with no good copy, is restored from it, saying so.
	// (Optional)
	Backup func() (snap Snapshot, path string, skipped []string, err error)
}

// OpenLogins returns the logins kept in dir, checking the file if it
// exists.
func OpenLogins(dir string) (*LoginFile, error) { return OpenLoginFile(LoginOptions{Dir: dir}) }

// OpenLoginFile returns the logins kept in opts.Dir, checking the file if
// it exists (and putting back its last good copy, or the newest backup,
// when it does not decode or is missing).
func OpenLoginFile(opts LoginOptions) (*LoginFile, error) {
	dir := opts.Dir
	if dir == "" {
		return nil, errors.New("open logins: the data directory is empty")
	}
	if err := os.MkdirAll(filepath.Join(dir, "leases"), 0o700); err != nil {
		return nil, fmt.Errorf("open logins: %w", err)
	}
	f := &LoginFile{dir: dir, log: opts.Logger}
	if f.log == nil {
		f.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	d, err := f.read()
	if (err != nil || (len(d.Logins) == 0 && len(d.AgentCreds) == 0 && len(d.Members) == 0)) && opts.Backup != nil {
		snap, path, skipped, berr := opts.Backup()
		for _, sk := range skipped {
			f.log.Error("a backup does not open; skipped", "backup", sk)
		}
		if berr == nil && (len(snap.Logins) > 0 || len(snap.AgentCreds) > 0 || len(snap.Members) > 0) {
			d = loginsDoc{Format: loginsFormat, Logins: map[string]Login{}, AgentCreds: map[string]AgentCred{}, Members: map[string]Member{}}
			maps.Copy(d.Logins, snap.Logins)
			maps.Copy(d.AgentCreds, snap.AgentCreds)
			maps.Copy(d.Members, snap.Members)
			if werr := f.write(d); werr != nil {
				return nil, fmt.Errorf("open logins: restore from backup %s: %w", path, werr)
			}
			why := "missing"
			if err != nil {
				why = "unreadable (" + err.Error() + ")"
			}
			f.recovered = recovery{at: time.Now(), loss: f.path() + " was " + why,
				restored: fmt.Sprintf("%d sign-ins, %d agent credentials and %d members from backup %s", len(d.Logins), len(d.AgentCreds), len(d.Members), path)}
			f.log.Warn("the logins file was "+why+": restored the sign-ins, agent credentials and members from the newest backup",
				"file", f.path(), "backup", path, "written", snap.Created.UTC(), "sign_ins", len(d.Logins), "agent_credentials", len(d.AgentCreds),
				"members", len(d.Members))
			err = nil
		}
	}
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (f *LoginFile) path() string { return filepath.Join(f.dir, LoginsFile) }

// read loads the file; a missing file holds no logins. A file that does
// not decode is replaced by its last good copy when that one does
// (reported once, and in Recovered).
func (f *LoginFile) read() (loginsDoc, error) {
	d, rec, err := loadGood(f.path(), f.parse)
	if rec != nil {
		f.log.Error("the logins file was not as last written; its last good copy took its place", "file", f.path(), "recovery", rec.String())
		f.recMu.Lock()
		f.recovered = recovery{at: rec.At, loss: rec.File + ": " + rec.Err.Error(), restored: "from its last good copy " + rec.From}
		f.recMu.Unlock()
	}
	return d, err
}

// Recovered says when and how the logins file was last put back (zero
// when it never was).
func (f *LoginFile) Recovered() (at time.Time, loss, restored string) {
	f.recMu.Lock()
	defer f.recMu.Unlock()
	return f.recovered.at, f.recovered.loss, f.recovered.restored
}

// parse decodes logins.json's bytes (nil: a missing file, no logins).
func (f *LoginFile) parse(b []byte) (loginsDoc, error) {
	if b == nil {
		return loginsDoc{Format: loginsFormat, Logins: map[string]Login{}}, nil
	}
	var d loginsDoc
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return loginsDoc{}, fmt.Errorf("parse logins file %s: %w", f.path(), err)
	}
	if d.Format != loginsFormat {
		return loginsDoc{}, fmt.Errorf("parse logins file %s: format %d is not supported; want %d", f.path(), d.Format, loginsFormat)
	}
	if d.Logins == nil {
		d.Logins = map[string]Login{}
	}
	for k := range d.Logins {
		if err := ValidateKey(k); err != nil {
			return loginsDoc{}, fmt.Errorf("logins file %s: %w", f.path(), err)
		}
	}
	return d, nil
}

// update runs fn over the file's content under the file lock and writes
// the result back when fn returns nil.
func (f *LoginFile) update(ctx context.Context, fn func(d *loginsDoc) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lock, err := filelock.Acquire(lctx, f.path()+".lock")
	if err != nil {
		return fmt.Errorf("write logins file: %w", err)
	}
	defer lock.Close()
	d, err := f.read()
	if err != nil {
		return err
	}
	if err := fn(&d); err != nil {
		return err
	}
	return f.write(d)
}

// write replaces the file (and its last good copy) with d.
func (f *LoginFile) write(d loginsDoc) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fmt.Errorf("encode logins file: %w", err)
	}
	if err := writeGood(f.path(), append(b, '\n')); err != nil {
		return fmt.Errorf("write logins file: %w", err)
	}
	f.writes.Add(1)
	return nil
}

// Login returns key's login, or ErrNotFound.
func (f *LoginFile) Login(_ context.Context, key string) (Login, error) {
	d, err := f.read()
	if err != nil {
		return Login{}, err
	}
	l, ok := d.Logins[key]
	if !ok {
		return Login{}, ErrNotFound
	}
	l.Key = key
	return l, nil
}

// Logins returns every login, ordered by key.
func (f *LoginFile) Logins(_ context.Context) ([]Login, error) {
	d, err := f.read()
	if err != nil {
		return nil, err
	}
	out := make([]Login, 0, len(d.Logins))
	for k, l := range d.Logins {
		l.Key = k
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b Login) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// PutLogin writes l over generation l.Generation (-1: over whatever is
// stored). The lease needs no check here: a lock file is held until released or its process dies.
func (f *LoginFile) PutLogin(ctx context.Context, l Login, _ *Lease) (Login, error) {
	if err := ValidateKey(l.Key); err != nil {
		return Login{}, err
	}
	err := f.update(ctx, func(d *loginsDoc) error {
		cur := d.Logins[l.Key].Generation
		if l.Generation != -1 && cur != l.Generation {
			return ErrConflict
		}
		l.Generation = cur + 1
		d.Logins[l.Key] = l
		return nil
	})
	if err != nil {
		return Login{}, err
	}
	return l, nil
}

// RemoveLogin deletes key's login, or returns ErrNotFound.
func (f *LoginFile) RemoveLogin(ctx context.Context, key string) error {
	return f.update(ctx, func(d *loginsDoc) error {
		if _, ok := d.Logins[key]; !ok {
			return ErrNotFound
		}
		delete(d.Logins, key)
		return nil
	})
}

// AcquireLease takes DIR/leases/KEY.lock. ttl does not apply: the lock
// is held until released or this process exits.
func (f *LoginFile) AcquireLease(ctx context.Context, key string, _ time.Duration) (*Lease, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	lock, err := filelock.Acquire(ctx, filepath.Join(f.dir, "leases", key+".lock"))
	if err != nil {
		return nil, fmt.Errorf("refresh lease of %s: %w", key, err)
	}
	return NewLease(key, 0, lock.Close), nil
}
