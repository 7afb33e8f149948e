package filelock

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"
)

// Poll intervals while another open file holds the lock. flock has no
// blocking form that a context can interrupt, so Acquire polls, backing off
// from pollMin to pollMax.
const (
	pollMin = 5 * time.Millisecond
	pollMax = 100 * time.Millisecond
)

// Lock is an acquired lock. Close releases it.
type Lock struct {
	f     *os.File
	close func() error
}

// Acquire takes the exclusive lock on path, creating the file with mode
// 0600 if it does not exist. While another holder has it, Acquire waits
// until it is released or ctx is done; then the error wraps
// [context.Cause] of ctx. An error always names path. On platforms without
// flock it fails with an error wrapping [errors.ErrUnsupported].
func Acquire(ctx context.Context, path string) (*Lock, error) {
	if err := context.Cause(ctx); err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600) //nolint:gosec // G703: path is the lock file the calling program chose, not outside input
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	delay := pollMin
	for {
		ok, err := tryLock(f)
		if err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if ok {
			l := &Lock{f: f}
			l.close = sync.OnceValue(l.release)
			return l, nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, context.Cause(ctx))
		case <-t.C:
		}
		delay = min(2*delay, pollMax)
	}
}

// Close releases the lock. Calls after the first do nothing and return
// the first call's result.
func (l *Lock) Close() error { return l.close() }

func (l *Lock) release() error {
	err := unlock(l.f)
	if cerr := l.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("unlock %s: %w", l.f.Name(), err)
	}
	return nil
}
