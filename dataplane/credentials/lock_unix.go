//go:build unix

package credentials

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// Poll intervals while another process holds the lock. flock has no
// context-aware blocking form, so lockFile polls with LOCK_NB.
const (
	lockPollMin = 5 * time.Millisecond
	lockPollMax = 100 * time.Millisecond
)

// lockFile takes an exclusive flock on path, creating it with mode 0600. It
// waits at most wait, and no longer than ctx allows. The returned function
// releases the lock; the lock file itself is left in place (removing it
// would let two processes lock different inodes).
func lockFile(ctx context.Context, path string, wait time.Duration) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	delay := lockPollMin
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				_ = f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-waitCtx.Done():
			t.Stop()
			_ = f.Close()
			if err := ctx.Err(); err != nil {
				return nil, fmt.Errorf("lock %s: %w", path, err)
			}
			return nil, fmt.Errorf("lock %s: another process has held it for more than %v", path, wait)
		case <-t.C:
		}
		delay = min(2*delay, lockPollMax)
	}
}
