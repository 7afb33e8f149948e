package clienttest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/filelock"
)

// runLockTimeout bounds the wait for another process's client run.
const runLockTimeout = 10 * time.Minute

// LockClientRun waits until no other test process on this machine is running
// a real client, takes the machine-wide run lock (an flock on
// <cache>/.run.lock) and returns the function that releases it. The release
// also runs at t's cleanup, so calling it is optional. Waiting is bounded by
// ctx and by ten minutes; a failure to lock fails t.
//
// RunClaude and RunCodex take the lock themselves; tests that start a client
// some other way should hold it for the client's lifetime.
func LockClientRun(ctx context.Context, t testing.TB) (unlock func()) {
	t.Helper()
	cache, err := CacheDir()
	if err != nil {
		t.Fatalf("lock client run: %v", err)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil { //nolint:gosec // G301: the cache holds public npm packages, readable like any npm install
		t.Fatalf("lock client run: create client cache: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, runLockTimeout)
	defer cancel()
	lock, err := filelock.Acquire(ctx, filepath.Join(cache, ".run.lock"))
	if err != nil {
		t.Fatalf("lock client run: %v", err)
	}
	unlock = func() { _ = lock.Close() }
	t.Cleanup(unlock)
	return unlock
}
