package clienttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
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
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatalf("lock client run: create client cache: %v", err)
	}
	ctx, cancel := context.WithTimeout(ctx, runLockTimeout)
	defer cancel()
	release, err := lockFile(ctx, filepath.Join(cache, ".run.lock"))
	if err != nil {
		t.Fatalf("lock client run: %v", err)
	}
	unlock = sync.OnceFunc(release)
	t.Cleanup(unlock)
	return unlock
}

// lockFile takes an exclusive flock on path, polling until ctx is done, and
// returns the function that releases it. flock locks conflict between open
// files, so two goroutines of one process exclude each other too.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	fd := int(f.Fd())
	for {
		err := syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(fd, syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}
