package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/clodex/clodex/controlplane/controlplanetest"
)

// A policy change the store cannot write reaches the operator with its
// cause (read-only data dir, full disk), exit code 1, never "internal
// error". The data dir is a real tmpfs turned read-only or filled: as
// root a chmod would not stop the write.
func TestStoreWriteErrorsNamed(t *testing.T) {
	srv := startServer(t)
	const size = 64 << 10
	controlplanetest.MountTmpfs(t, srv.DataDir, size, false)
	if _, _, err := ctl(t, srv, "set-rate", acct1, "30"); err != nil {
		t.Fatalf("set-rate on a writable data dir: %v", err)
	}

	controlplanetest.Remount(t, srv.DataDir, size, true)
	_, _, err := ctl(t, srv, "set-rate", acct1, "20")
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "data dir is read-only") ||
		!strings.Contains(err.Error(), "could not do it: SetRate: policy not saved") || strings.Contains(err.Error(), "internal error") {
		t.Errorf("set-rate on a read-only data dir = %v, want exit 1 naming \"data dir is read-only\"", err)
	}

	controlplanetest.Remount(t, srv.DataDir, size, false)
	filler, err := os.Create(filepath.Join(srv.DataDir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 4096)
	for {
		if _, err := filler.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill the data dir: %v", err)
			}
			break
		}
	}
	_ = filler.Close()
	_, _, err = ctl(t, srv, "set-budget", acct1, "--max-retries", "2")
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "no space left on device") || strings.Contains(err.Error(), "internal error") {
		t.Errorf("set-budget on a full data dir = %v, want exit 1 naming \"no space left on device\"", err)
	}
	// What was stored before stays in effect.
	out, _, err := ctl(t, srv, "get", acct1, "-o", "json")
	if err != nil || !strings.Contains(out, `"rate_per_minute": 30`) {
		t.Errorf("get after the failed writes = %s, %v; want rate 30", out, err)
	}
}
