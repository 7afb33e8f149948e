//go:build linux

package controlplanetest

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// MountTmpfs mounts a tmpfs of size bytes on dir, read-only when ro, and
// unmounts it when the test ends. Tests run as root, where file modes do
// not stop a write, so a read-only or full data dir must be a real file
// system to be honest: a read-only tmpfs answers EROFS, a full one ENOSPC.
// It needs CAP_SYS_ADMIN: without it the test is skipped, and fails under
// CI=true (CI runs as root on the same kind of machine).
func MountTmpfs(t testing.TB, dir string, size int, ro bool) {
	t.Helper()
	var flags uintptr
	if ro {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, fmt.Sprintf("size=%d,mode=0700", size)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("controlplanetest: mount a tmpfs on %s (needs root with CAP_SYS_ADMIN): %v", dir, err)
		}
		t.Skipf("cannot mount a tmpfs on %s (needs root with CAP_SYS_ADMIN): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("controlplanetest: unmount %s: %v", dir, err)
		}
	})
}

// Remount makes the tmpfs MountTmpfs mounted on dir read-only (ro) or
// writable again.
func Remount(t testing.TB, dir string, size int, ro bool) {
	t.Helper()
	flags := uintptr(syscall.MS_REMOUNT)
	if ro {
		flags |= syscall.MS_RDONLY
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", flags, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("controlplanetest: remount %s: %v", dir, err)
	}
}
