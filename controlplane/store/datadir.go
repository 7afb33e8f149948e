package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// WriteError is a write the memory store could not make in its data
// directory. Its message names the cause an operator can act on ("data dir
// is read-only", "no space left on device", ...) before the system's
// error; the server answers it as FailedPrecondition, never Internal.
type WriteError struct {
	// Dir is the data directory.
	Dir string
	// Err is the failed operation's error.
	Err error
}

func (e *WriteError) Error() string {
	return fmt.Sprintf("%s (data dir %s): %v", e.Cause(), e.Dir, e.Err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// Cause names what is wrong with the data directory, from the system's
// error.
func (e *WriteError) Cause() string {
	switch {
	case errors.Is(e.Err, syscall.EROFS):
		return "data dir is read-only"
	case errors.Is(e.Err, syscall.ENOSPC):
		return "no space left on device"
	case errors.Is(e.Err, syscall.EDQUOT):
		return "disk quota exceeded"
	case errors.Is(e.Err, fs.ErrPermission):
		return "data dir is not writable (permission denied)"
	case errors.Is(e.Err, fs.ErrNotExist):
		return "data dir does not exist"
	case errors.Is(e.Err, syscall.ENOTDIR):
		return "data dir is not a directory"
	case errors.Is(e.Err, syscall.EIO):
		return "input/output error on the data dir's device"
	}
	return "cannot write to the data dir"
}

// CheckDir proves dir is a directory the store can write: it creates,
// writes, syncs and removes a temporary file there, as every policy change
// does. The error is a *WriteError naming the cause.
func CheckDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return &WriteError{Dir: dir, Err: err}
	}
	if !fi.IsDir() {
		return &WriteError{Dir: dir, Err: fmt.Errorf("%s: %w", dir, syscall.ENOTDIR)}
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return &WriteError{Dir: dir, Err: err}
	}
	_, werr := f.Write([]byte("clodex write check\n"))
	if werr == nil {
		werr = f.Sync()
	}
	cerr := f.Close()
	rerr := os.Remove(f.Name())
	if err := errors.Join(werr, cerr, rerr); err != nil {
		return &WriteError{Dir: dir, Err: err}
	}
	return nil
}
