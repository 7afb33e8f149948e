//go:build unix

package filelock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Environment of the helper process (TestHelperProcess).
const (
	envHelper = "CLODEX_FILELOCK_HELPER" // "hold" or "count"
	envPath   = "CLODEX_FILELOCK_PATH"
	envRounds = "CLODEX_FILELOCK_ROUNDS"
)

// TestHelperProcess is not a test: the multi-process tests run the test
// binary with this test selected as another process.
//
//   - "hold" takes the lock on the path, prints "locked", and releases it
//     when its standard input is closed.
//   - "count" increments the number in the path's ".count" file the given
//     number of times, each time under the lock.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envHelper)
	if mode == "" {
		t.Skip("helper process of the multi-process tests")
	}
	path := os.Getenv(envPath)
	switch mode {
	case "hold":
		l, err := Acquire(t.Context(), path)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Println("locked")
		_, _ = io.Copy(io.Discard, os.Stdin)
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	case "count":
		rounds, err := strconv.Atoi(os.Getenv(envRounds))
		if err != nil {
			t.Fatalf("%s: %v", envRounds, err)
		}
		for range rounds {
			if err := incrementLocked(t.Context(), path); err != nil {
				t.Fatal(err)
			}
		}
	default:
		t.Fatalf("%s=%q is invalid; want hold or count", envHelper, mode)
	}
}

// incrementLocked adds one to the number in path+".count" under the lock on
// path. The read and the write are separate, so without the lock
// concurrent increments would be lost.
func incrementLocked(ctx context.Context, path string) error {
	l, err := Acquire(ctx, path)
	if err != nil {
		return err
	}
	defer l.Close()
	n, err := readCount(path)
	if err != nil {
		return err
	}
	// Widen the window between read and write so that a lock that does
	// not exclude shows up as lost increments.
	time.Sleep(time.Millisecond)
	return os.WriteFile(path+".count", []byte(strconv.Itoa(n+1)), 0o600)
}

func readCount(path string) (int, error) {
	b, err := os.ReadFile(path + ".count")
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(string(b))
}

func helper(t *testing.T, mode, path string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), append([]string{envHelper + "=" + mode, envPath + "=" + path}, env...)...)
	return cmd
}

// holdInOtherProcess starts a process that holds the lock on path and
// returns the function that makes it release the lock and waits for it.
func holdInOtherProcess(t *testing.T, path string) (release func()) {
	t.Helper()
	release, _ = startHolder(t, path)
	return release
}

// startHolder is holdInOtherProcess that also returns the function that
// kills the holder (without releasing the lock) and waits for it.
func startHolder(t *testing.T, path string) (release, kill func()) {
	t.Helper()
	cmd := helper(t, "hold", path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "locked" {
		_ = stdin.Close()
		_ = cmd.Wait()
		t.Fatalf("helper did not report the lock: %q %v\n%s", sc.Text(), sc.Err(), stderr.String())
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = stdin.Close()
			_, _ = io.Copy(io.Discard, stdout)
			if err := cmd.Wait(); err != nil {
				t.Errorf("helper: %v\n%s", err, stderr.String())
			}
		})
	}
	kill = func() {
		once.Do(func() {
			if err := cmd.Process.Kill(); err != nil {
				t.Errorf("kill helper: %v", err)
			}
			_ = cmd.Wait() // "signal: killed"
		})
	}
	t.Cleanup(release)
	return release, kill
}

var errHeld = errors.New("the lock is held elsewhere")

func TestAcquireWaitsForOtherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	release := holdInOtherProcess(t, path)

	ctx, cancel := context.WithTimeoutCause(t.Context(), 50*time.Millisecond, errHeld)
	defer cancel()
	l, err := Acquire(ctx, path)
	if err == nil {
		l.Close()
		t.Fatal("Acquire while another process holds the lock: no error")
	}
	if !errors.Is(err, errHeld) || !strings.Contains(err.Error(), path) {
		t.Errorf("Acquire while held = %q, want an error naming %s and wrapping the context's cause", err, path)
	}

	acquired := make(chan error, 1)
	go func() {
		l, err := Acquire(t.Context(), path)
		if err == nil {
			err = l.Close()
		}
		acquired <- err
	}()
	release()
	if err := <-acquired; err != nil {
		t.Errorf("Acquire after the other process released the lock: %v", err)
	}
}

func TestCrashedHolderReleases(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	_, kill := startHolder(t, path)
	kill()
	// The holder is gone, so the lock is free at once; the deadline only
	// keeps a broken lock from hanging the test.
	ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, errHeld)
	defer cancel()
	l, err := Acquire(ctx, path)
	if err != nil {
		t.Fatalf("Acquire after the holder was killed: %v", err)
	}
	l.Close()
}

func TestAcquireSerialisesProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	const procs, rounds = 4, 25
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			out, err := helper(t, "count", path, envRounds+"="+strconv.Itoa(rounds)).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("helper %d: %w\n%s", i, err, out)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	n, err := readCount(path)
	if err != nil {
		t.Fatal(err)
	}
	if n != procs*rounds {
		t.Errorf("count = %d after %d processes each added %d under the lock, want %d", n, procs, rounds, procs*rounds)
	}
}

func TestAcquireSerialisesGoroutines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	const workers, rounds = 4, 25
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for range rounds {
				if err := incrementLocked(t.Context(), path); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if n, err := readCount(path); err != nil || n != workers*rounds {
		t.Errorf("count = %d, %v; want %d", n, err, workers*rounds)
	}
}

func TestAcquireCancelled(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	held, err := Acquire(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := Acquire(ctx, path)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire(cancelled while waiting) = %v, want context.Canceled", err)
	}

	// A context that is already done fails even when the lock is free.
	free := filepath.Join(t.TempDir(), "free.lock")
	if _, err := Acquire(ctx, free); !errors.Is(err, context.Canceled) {
		t.Errorf("Acquire(cancelled context, free lock) = %v, want context.Canceled", err)
	}
}

func TestLockFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	l, err := Acquire(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o600 {
		t.Errorf("lock file mode = %o, want 600", mode)
	}
	if err := l.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v, want nil", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("lock file after Close: %v, want it left in place", err)
	}
	// Released: it can be taken again at once.
	ctx, cancel := context.WithTimeoutCause(t.Context(), time.Minute, errHeld)
	defer cancel()
	l2, err := Acquire(ctx, path)
	if err != nil {
		t.Fatalf("Acquire after Close: %v", err)
	}
	l2.Close()
}

func TestAcquireError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "x.lock")
	_, err := Acquire(t.Context(), path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "lock "+path+": ") {
		t.Errorf("Acquire in a missing directory = %v, want \"lock %s: ...\" wrapping fs.ErrNotExist", err, path)
	}
}
