package store

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
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
	// generation it was given (0: no record yet).
	Generation int64 `json:"generation"`
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
}

// LoginFile keeps logins in DIR/logins.json, written atomically with mode
// 0600 under DIR/logins.json.lock; leases are lock files
// DIR/leases/KEY.lock. It is safe for concurrent use, and for several
// processes sharing the directory. It is the credential broker's
// broker.Logins and the server's controlplane.AgentCredStore.
type LoginFile struct {
	dir string
	mu  sync.Mutex // serialises this process's read-modify-writes
}

// OpenLogins returns the logins kept in dir, checking the file if it
// exists.
func OpenLogins(dir string) (*LoginFile, error) {
	if dir == "" {
		return nil, errors.New("open logins: the data directory is empty")
	}
	if err := os.MkdirAll(filepath.Join(dir, "leases"), 0o700); err != nil {
		return nil, fmt.Errorf("open logins: %w", err)
	}
	f := &LoginFile{dir: dir}
	if _, err := f.read(); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *LoginFile) path() string { return filepath.Join(f.dir, LoginsFile) }

// read loads the file; a missing file holds no logins.
func (f *LoginFile) read() (loginsDoc, error) {
	b, err := os.ReadFile(f.path())
	if errors.Is(err, fs.ErrNotExist) {
		return loginsDoc{Format: loginsFormat, Logins: map[string]Login{}}, nil
	}
	if err != nil {
		return loginsDoc{}, fmt.Errorf("read logins file: %w", err)
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
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return fmt.Errorf("encode logins file: %w", err)
	}
	if err := atomicfile.WriteFile(f.path(), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write logins file: %w", err)
	}
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

// PutLogin writes l over generation l.Generation. The lease needs no
// check here: a lock file is held until released or its process dies.
func (f *LoginFile) PutLogin(ctx context.Context, l Login, _ *Lease) (Login, error) {
	if err := ValidateKey(l.Key); err != nil {
		return Login{}, err
	}
	err := f.update(ctx, func(d *loginsDoc) error {
		if d.Logins[l.Key].Generation != l.Generation {
			return ErrConflict
		}
		l.Generation++
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
