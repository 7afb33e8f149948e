package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
)

// The data dir's files (policy.json, logins.json) are written twice, each
// time atomically: the file, then its last good copy FILE.bak with the
// same bytes. A file that later does not decode (truncated, damaged on
// disk, edited by hand) is reported and set aside as FILE.corrupt-TIME,
// and the last good copy takes its place; nothing else is touched.

// bakSuffix names a file's last good copy.
const bakSuffix = ".bak"

// writeGood writes data to path and then to its last good copy. The copy
// is best effort: path holds the change either way.
func writeGood(path string, data []byte) error {
	if err := atomicfile.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	_ = atomicfile.WriteFile(path+bakSuffix, data, 0o600)
	return nil
}

// Recovery reports a data-dir file that did not decode and what took its
// place.
type Recovery struct {
	// File is the unreadable file and Err why.
	File string
	Err  error
	// SetAside is where the unreadable file was moved ("" when it was
	// missing).
	SetAside string
	// From is the last good copy that replaced it.
	From string
	At   time.Time
}

func (r *Recovery) String() string {
	what := fmt.Sprintf("%s did not decode (%v)", r.File, r.Err)
	if errors.Is(r.Err, fs.ErrNotExist) {
		what = r.File + " was missing"
	}
	s := what + "; its last good copy " + r.From + " took its place"
	if r.SetAside != "" {
		s += "; the unreadable file is kept as " + r.SetAside
	}
	return s
}

// loadGood reads path with parse. A missing file with no last good copy
// is parse(nil). A file that does not decode, or is missing while its
// last good copy exists, is replaced by that copy when the copy decodes
// (the unreadable file is set aside), and the Recovery says so; otherwise
// the error names the file and why.
func loadGood[T any](path string, parse func([]byte) (T, error)) (T, *Recovery, error) {
	var zero T
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		if _, berr := os.Stat(path + bakSuffix); errors.Is(berr, fs.ErrNotExist) {
			v, err := parse(nil)
			return v, nil, err
		}
	} else if err != nil {
		return zero, nil, fmt.Errorf("read %s: %w", path, err)
	}
	var perr error
	if err == nil {
		v, err := parse(b)
		if err == nil {
			return v, nil, nil
		}
		perr = err
	} else {
		perr = err
	}
	good, err := os.ReadFile(path + bakSuffix)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return zero, nil, perr
		}
		return zero, nil, fmt.Errorf("%w; and its last good copy: %w", perr, err)
	}
	v, err := parse(good)
	if err != nil {
		return zero, nil, fmt.Errorf("%w; and its last good copy %s: %w", perr, path+bakSuffix, err)
	}
	rec := &Recovery{File: path, Err: perr, From: path + bakSuffix, At: time.Now()}
	if b != nil {
		rec.SetAside = fmt.Sprintf("%s.corrupt-%d", path, rec.At.Unix())
		if err := os.Rename(path, rec.SetAside); err != nil {
			return zero, nil, fmt.Errorf("%w; set it aside: %w", perr, err)
		}
	}
	if err := atomicfile.WriteFile(path, good, 0o600); err != nil {
		return zero, nil, fmt.Errorf("%w; put its last good copy back: %w", perr, err)
	}
	return v, rec, nil
}

// checkGood is loadGood without writing: it reports what a load would
// do (a Recovery whose From would take the file's place) or the error.
func checkGood[T any](path string, parse func([]byte) (T, error)) (*Recovery, error) {
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, berr := os.Stat(path + bakSuffix); errors.Is(berr, fs.ErrNotExist) {
			_, err := parse(nil)
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("read %s: %w", path, err)
	default:
		if _, perr := parse(b); perr == nil {
			return nil, nil
		} else {
			err = perr
		}
	}
	good, berr := os.ReadFile(path + bakSuffix)
	if berr != nil {
		if errors.Is(berr, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("%w; and its last good copy: %w", err, berr)
	}
	if _, perr := parse(good); perr != nil {
		return nil, fmt.Errorf("%w; and its last good copy %s: %w", err, path+bakSuffix, perr)
	}
	return &Recovery{File: path, Err: err, From: path + bakSuffix, At: time.Now()}, nil
}

// CheckDataFiles reads the data dir's policy.json and logins.json as a
// start would, writing nothing (--check-config): an error names a file
// that does not decode and has no good copy; each warning says which
// file a start would replace with its last good copy.
func CheckDataFiles(dir string) (warnings []string, err error) {
	var errs []error
	path := policyPath(dir)
	if rec, err := checkGood(path, func(b []byte) (policyFile, error) { return parsePolicyFile(path, b) }); err != nil {
		errs = append(errs, err)
	} else if rec != nil {
		warnings = append(warnings, "a start will put back a last good copy: "+rec.String())
	}
	f := &LoginFile{dir: dir}
	if rec, err := checkGood(f.path(), f.parse); err != nil {
		errs = append(errs, err)
	} else if rec != nil {
		warnings = append(warnings, "a start will put back a last good copy: "+rec.String())
	}
	return warnings, errors.Join(errs...)
}
