//go:build !unix

package filelock

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// tryLock fails with an error wrapping [errors.ErrUnsupported]: this
// platform has no flock, and a lock that does not exclude would be worse
// than none.
func tryLock(f *os.File) (bool, error) {
	return false, fmt.Errorf("file locking is not supported on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func unlock(f *os.File) error { return nil }
