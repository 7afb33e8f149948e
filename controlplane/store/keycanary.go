package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/filelock"
)

// KeyCanaryFile is the credential key's canary inside the data directory
// (see broker.CheckKey).
const KeyCanaryFile = "key-canary"

func (f *LoginFile) canaryPath() string { return filepath.Join(f.dir, KeyCanaryFile) }

// KeyCanary returns the sealed canary of the credential key, nil when the
// data dir has none.
func (f *LoginFile) KeyCanary(context.Context) ([]byte, error) {
	b, err := os.ReadFile(f.canaryPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the key canary: %w", err)
	}
	return b, nil
}

// PutKeyCanary writes the sealed canary (atomically, mode 0600): only when
// there is none, unless replace is set.
func (f *LoginFile) PutKeyCanary(ctx context.Context, sealed []byte, replace bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lock, err := filelock.Acquire(lctx, f.path()+".lock")
	if err != nil {
		return fmt.Errorf("write the key canary: %w", err)
	}
	defer lock.Close()
	if !replace {
		if _, err := os.Stat(f.canaryPath()); err == nil {
			return nil
		}
	}
	if err := atomicfile.WriteFile(f.canaryPath(), sealed, 0o600); err != nil {
		return fmt.Errorf("write the key canary: %w", &WriteError{Dir: f.dir, Err: err})
	}
	f.writes.Add(1)
	return nil
}

// KeyCanaryPlace names the canary's file.
func (f *LoginFile) KeyCanaryPlace() string { return f.canaryPath() }
