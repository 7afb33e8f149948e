//go:build unix

package filelock

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock on f without blocking; ok is false while
// another open file holds it.
func tryLock(f *os.File) (ok bool, err error) {
	err = control(f, func(fd int) error { return syscall.Flock(fd, syscall.LOCK_EX|syscall.LOCK_NB) })
	if errors.Is(err, syscall.EWOULDBLOCK) || errors.Is(err, syscall.EINTR) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("flock: %w", err)
	}
	return true, nil
}

// unlock releases the flock on f.
func unlock(f *os.File) error {
	if err := control(f, func(fd int) error { return syscall.Flock(fd, syscall.LOCK_UN) }); err != nil {
		return fmt.Errorf("flock: %w", err)
	}
	return nil
}

// control runs op on f's descriptor.
func control(f *os.File, op func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := rc.Control(func(fd uintptr) { opErr = op(int(fd)) }); err != nil {
		return err
	}
	return opErr
}
