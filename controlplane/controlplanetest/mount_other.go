//go:build !linux

package controlplanetest

import "testing"

// MountTmpfs needs Linux; elsewhere the test is skipped.
func MountTmpfs(t testing.TB, dir string, size int, ro bool) {
	t.Helper()
	t.Skip("mounting a tmpfs needs Linux")
}

// Remount needs Linux; elsewhere the test is skipped.
func Remount(t testing.TB, dir string, size int, ro bool) {
	t.Helper()
	t.Skip("mounting a tmpfs needs Linux")
}
