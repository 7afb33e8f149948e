// Package atomicfile replaces a file's contents so that a reader, another
// process or a crash sees either the old file or the new one, never a
// partial write:
//
//	err := atomicfile.WriteFile(path, data, 0o600)
//
// The data goes to a temporary file in the same directory, which is synced,
// given its final mode and renamed over path; the directory is then synced
// so the rename survives a crash. Credential files are written this way
// with mode 0600.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// WriteFile replaces the file at path with data and mode perm. perm is set
// exactly: the umask does not apply, and an existing file's mode is not
// kept.
//
// A path that is a symlink keeps the link: the file it points to is
// replaced. A dangling symlink is replaced by a regular file.
//
// The parent directory must exist. On failure the file at path is left as
// it was and no temporary file remains. The error names path and wraps the
// failing file-system call's error.
func WriteFile(path string, data []byte, perm fs.FileMode) (err error) {
	target := path
	if t, err := filepath.EvalSymlinks(path); err == nil {
		target = t
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("write %s: %w", path, err)
		}
	}()
	dir := filepath.Dir(target)
	f, err := os.CreateTemp(dir, "."+filepath.Base(target)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close() // may already be closed
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, target); err != nil {
		return err
	}
	syncDir(dir)
	return nil
}

// syncDir makes a rename in dir durable. It is best effort: the rename is
// already visible, and not every file system or platform can sync a
// directory.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}
