//go:build unix

package atomicfile

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// names lists dir's entries.
func names(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func checkFile(t *testing.T, path, want string, mode fs.FileMode) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || string(got) != want {
		t.Errorf("%s holds %q, %v; want %q", filepath.Base(path), got, err, want)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != mode {
		t.Errorf("%s mode = %v, want a regular file with mode %v", filepath.Base(path), fi.Mode(), mode)
	}
}

func TestWriteFile(t *testing.T) {
	tests := []struct {
		name     string
		existing string // "" = no file yet
		oldMode  fs.FileMode
		perm     fs.FileMode
	}{
		{name: "new credential file", perm: 0o600},
		{name: "new readable file", perm: 0o644},
		{name: "replace a readable file with a private one", existing: "old content, longer than the new", oldMode: 0o644, perm: 0o600},
		{name: "replace a private file with a readable one", existing: "old", oldMode: 0o600, perm: 0o640},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "auth.json")
			if tt.existing != "" {
				if err := os.WriteFile(path, []byte(tt.existing), tt.oldMode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.oldMode); err != nil {
					t.Fatal(err)
				}
			}
			if err := WriteFile(path, []byte("new"), tt.perm); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			checkFile(t, path, "new", tt.perm)
			if got := names(t, dir); len(got) != 1 {
				t.Errorf("directory holds %q, want only auth.json (no temporary file)", got)
			}
		})
	}
}

func TestWriteFileFollowsSymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real-auth.json")
	link := filepath.Join(dir, "auth.json")
	if err := os.WriteFile(target, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	if err := WriteFile(link, []byte("new"), 0o600); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("auth.json is no longer a symlink (%v)", err)
	}
	checkFile(t, target, "new", 0o600)
}

func TestWriteFileDanglingSymlink(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "auth.json")
	if err := os.Symlink(filepath.Join(dir, "missing"), link); err != nil {
		t.Fatalf("symlink: %v", err)
	}
	if err := WriteFile(link, []byte("new"), 0o600); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	checkFile(t, link, "new", 0o600)
	if _, err := os.Lstat(filepath.Join(dir, "missing")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dangling link's target was created (%v); want the link replaced", err)
	}
}

func TestWriteFileFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auth.json")
	// Renaming a file over a non-empty directory fails.
	if err := os.MkdirAll(filepath.Join(path, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	err := WriteFile(path, []byte("new"), 0o600)
	if err == nil || !strings.HasPrefix(err.Error(), "write "+path+": ") {
		t.Fatalf("WriteFile over a directory = %v, want an error starting \"write %s: \"", err, path)
	}
	if got := names(t, dir); len(got) != 1 {
		t.Errorf("directory holds %q after a failed write, want only auth.json (no temporary file)", got)
	}
	if fi, err := os.Stat(path); err != nil || !fi.IsDir() {
		t.Errorf("auth.json after a failed write: %v, %v; want the directory left as it was", fi, err)
	}

	missing := filepath.Join(dir, "missing", "auth.json")
	if err := WriteFile(missing, []byte("new"), 0o600); !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "write "+missing+": ") {
		t.Errorf("WriteFile in a missing directory = %v, want \"write %s: ...\" wrapping fs.ErrNotExist", err, missing)
	}
}

// TestWriteFileReadersSeeWholeFiles reads the file while it is replaced
// again and again: every read must see one of the written contents in full.
func TestWriteFileReadersSeeWholeFiles(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	contents := [][]byte{bytes.Repeat([]byte("a"), 1<<20), bytes.Repeat([]byte("b"), 3<<19)}
	if err := WriteFile(path, contents[0], 0o600); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	readerDone := make(chan error, 1)
	go func() {
		reads := 0
		for {
			select {
			case <-stop:
				if reads == 0 {
					readerDone <- errors.New("the reader never read the file")
					return
				}
				readerDone <- nil
				return
			default:
			}
			got, err := os.ReadFile(path)
			if err != nil {
				readerDone <- err
				return
			}
			if !bytes.Equal(got, contents[0]) && !bytes.Equal(got, contents[1]) {
				readerDone <- fmt.Errorf("a reader saw a partial file of %d bytes", len(got))
				return
			}
			reads++
		}
	}()
	for i := range 40 {
		if err := WriteFile(path, contents[i%2], 0o600); err != nil {
			t.Error(err)
			break
		}
	}
	close(stop)
	if err := <-readerDone; err != nil {
		t.Error(err)
	}
}

// TestWriteFileIgnoresUmask: the requested mode is the file's mode even
// when the umask would take bits away. Not parallel: the umask is the
// process's.
func TestWriteFileIgnoresUmask(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "shared.txt")
	if err := WriteFile(path, []byte("new"), 0o644); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	checkFile(t, path, "new", 0o644)
}
