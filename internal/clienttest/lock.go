package clienttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/atomicfile"
	"github.com/clodex/clodex/internal/filelock"
)

// The waits for another process: each has a deadline, says what it waits
// for as it starts waiting, and fails naming the deadline and what to do.
const (
	// runLockTimeout bounds the wait for another process's client run.
	runLockTimeout = 10 * time.Minute
	// installLockTimeout bounds the wait for another process's install:
	// its npm install (installTimeout) and its probe.
	installLockTimeout = installTimeout + 2*time.Minute
	// lockPeek is how long a lock is tried before the wait is announced.
	lockPeek = 200 * time.Millisecond
)

// errDeadline marks a wait or an install that reached its deadline.
var errDeadline = errors.New("deadline reached")

// errBusy ends the first, short try of a lock: another process holds it.
var errBusy = errors.New("held by another process")

// holderSuffix names the file beside a lock that says who holds it: the
// holder's pid, what it does and since when (Unix seconds), one per line.
// scripts/install-clients.sh writes it in the same format.
const holderSuffix = ".holder"

// LockClientRun waits until no other test process on this machine is running
// a real client, takes the machine-wide run lock (an flock on
// <cache>/.run.lock) and returns the function that releases it. The release
// also runs at t's cleanup, so calling it is optional. Waiting is bounded by
// ctx and by ten minutes (less when t's own deadline comes first); a wait
// says on stderr which process holds the lock, and a wait that reaches the
// deadline fails t saying so.
//
// RunClaude and RunCodex take the lock themselves; tests that start a client
// some other way should hold it for the client's lifetime.
func LockClientRun(ctx context.Context, t testing.TB) (unlock func()) {
	t.Helper()
	cache, err := CacheDir()
	if err != nil {
		t.Fatalf("lock client run: %v", err)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil { //nolint:gosec // G301: the cache holds public npm packages, readable like any npm install
		t.Fatalf("lock client run: create client cache: %v", err)
	}
	unlock, err = waitLock(ctx, filepath.Join(cache, ".run.lock"), "running a client for "+t.Name(), within(t, runLockTimeout), sayStderr)
	if err != nil {
		t.Fatalf("lock client run: %v", err)
	}
	t.Cleanup(unlock)
	return unlock
}

// waitLock takes the flock on path for what this process will do with it
// ("installing Codex CLI 0.171.0"), waiting at most limit. While another
// process holds it, say gets one line naming the lock, the holder (its
// pid and what it does, as its holder file says) and the deadline; a wait
// that reaches the deadline returns an error wrapping errDeadline that
// names them and what to do. Once taken, the holder file names this
// process; release removes it and unlocks.
func waitLock(ctx context.Context, path, what string, limit time.Duration, say func(string)) (release func(), err error) {
	peek, cancel := context.WithTimeoutCause(ctx, lockPeek, errBusy)
	l, err := filelock.Acquire(peek, path)
	cancel()
	if err != nil && errors.Is(err, errBusy) && ctx.Err() == nil {
		say(fmt.Sprintf("waiting up to %v for %s, held by %s", limit, path, readHolder(path)))
		start := time.Now()
		wctx, cancel := context.WithTimeoutCause(ctx, limit, errDeadline)
		l, err = filelock.Acquire(wctx, path)
		cancel()
		if err != nil && errors.Is(err, errDeadline) {
			h := readHolder(path)
			return nil, fmt.Errorf("lock %s: %w: waited %v (the limit), still held by %s; fix: let that process finish, or end it if it hung%s, then run the tests again",
				path, errDeadline, limit, h, h.kill())
		}
		if err == nil {
			say(fmt.Sprintf("took %s after %v", path, time.Since(start).Round(time.Second)))
		}
	}
	if err != nil {
		return nil, err
	}
	hf := path + holderSuffix
	_ = atomicfile.WriteFile(hf, fmt.Appendf(nil, "%d\n%s\n%d\n", os.Getpid(), oneLine(what, 200), time.Now().Unix()), 0o644) // best effort: it only informs waiters
	return func() {
		_ = os.Remove(hf)
		_ = l.Close()
	}, nil
}

// holder is who holds a lock, as its holder file says.
type holder struct {
	pid   int // 0: unknown
	what  string
	since time.Time
	alive bool // the pid runs
}

func readHolder(lock string) holder {
	b, err := os.ReadFile(lock + holderSuffix)
	if err != nil {
		return holder{}
	}
	lines := strings.SplitN(string(b), "\n", 4)
	if len(lines) < 3 {
		return holder{}
	}
	pid, err := strconv.Atoi(strings.TrimSpace(lines[0]))
	if err != nil || pid <= 0 {
		return holder{}
	}
	h := holder{pid: pid, what: oneLine(lines[1], 200)}
	if secs, err := strconv.ParseInt(strings.TrimSpace(lines[2]), 10, 64); err == nil {
		h.since = time.Unix(secs, 0)
	}
	// Signal 0 asks whether the process exists; EPERM: it does, as
	// another user.
	if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
		h.alive = true
	}
	return h
}

func (h holder) String() string {
	switch {
	case h.pid == 0:
		return "another process (it left no holder file naming itself)"
	case !h.alive:
		return fmt.Sprintf("another process (the holder file names pid %d, %s, which no longer runs)", h.pid, h.what)
	case h.since.IsZero():
		return fmt.Sprintf("pid %d (%s)", h.pid, h.what)
	}
	return fmt.Sprintf("pid %d (%s, since %s)", h.pid, h.what, h.since.UTC().Format(time.RFC3339))
}

// kill is the command that ends a live holder, as advice: " (kill PID)".
func (h holder) kill() string {
	if h.pid == 0 || !h.alive {
		return ""
	}
	return fmt.Sprintf(" (kill %d)", h.pid)
}

// sayStderr writes one line to the test binary's stderr at once: t.Log
// would hold it until the test ends, and a wait is worth seeing while it
// lasts.
func sayStderr(msg string) { fmt.Fprintln(os.Stderr, "clienttest: "+msg) }

// deadliner is the Deadline of *testing.T (a *testing.B has none).
type deadliner interface{ Deadline() (time.Time, bool) }

// within is limit, shortened to end a little before t's own deadline (go
// test -timeout) so that the wait fails saying what it waited for instead
// of the whole binary panicking.
func within(t testing.TB, limit time.Duration) time.Duration {
	d, ok := t.(deadliner)
	if !ok {
		return limit
	}
	end, ok := d.Deadline()
	if !ok {
		return limit
	}
	return max(min(limit, time.Until(end)-30*time.Second), time.Second)
}
