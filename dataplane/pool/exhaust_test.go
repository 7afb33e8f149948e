package pool

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func emfileDialError(errno syscall.Errno) error {
	return fmt.Errorf("failed to WebSocket dial: %w", &os.SyscallError{Syscall: "socket", Err: errno})
}

// idleHeads registers n idle heads, one second apart (conn ids 1..n).
func idleHeads(e *env, n int) {
	for i := range n {
		e.turn(part(fmt.Sprintf("idle-%d", i)), items(user(fmt.Sprintf("q%d", i))), fmt.Sprintf("r%d", i), nil)
		e.clock.Advance(time.Second)
	}
}

func TestDescriptorExhaustionShedsIdleHeadsOldestFirst(t *testing.T) {
	e := newEnv(t, nil)
	idleHeads(e, 3)                                                                // conns 1..3
	busy, err := e.pool.Acquire(t.Context(), part("busy"), items(user("working"))) // conn 4
	if err != nil {
		t.Fatal(err)
	}
	// Touch conn 1 so conn 2 becomes the least recently used.
	e.turn(part("idle-0"), items(user("q0"), user("q0 again")), "r0b", nil)

	failNext := func() {
		start := e.dialer.attempts
		e.dialer.fail = func(n int) error {
			if n == start+1 {
				return emfileDialError(syscall.EMFILE)
			}
			return nil
		}
	}
	failNext()
	l, err := e.pool.Acquire(t.Context(), part("new"), items(user("fresh")))
	if err != nil {
		t.Fatalf("Acquire after shedding: %v", err)
	}
	if got := e.dialer.closed(); !slices.Equal(got, []int{2, 3, 1}) {
		t.Fatalf("closed %v, want idle heads least recently used first [2 3 1]", got)
	}
	if e.conn(busy.Conn).isClosed() {
		t.Fatal("busy head was shed")
	}
	if len(*e.notes) != 1 {
		t.Fatalf("notices %q, want one", *e.notes)
	}
	note := (*e.notes)[0]
	for _, want := range []string{"EMFILE", "ulimit -n", "closed the 3 idle"} {
		if !strings.Contains(note, want) {
			t.Errorf("notice %q lacks %q", note, want)
		}
	}
	s := e.pool.Stats()
	if s.ShedConnections != 3 || s.DescriptorExhaustions != 1 || s.Evictions[EvictDescriptorShed] != 3 {
		t.Errorf("stats shed=%d exhaustions=%d evictions=%v, want 3, 1, 3 descriptor_shed", s.ShedConnections, s.DescriptorExhaustions, s.Evictions)
	}
	l.Complete("rn", nil, Usage{})
	busy.Complete("rb", nil, Usage{})

	// A second exhaustion is not announced again but is recorded.
	failNext()
	l, err = e.pool.Acquire(t.Context(), part("new2"), items(user("fresh2")))
	if err != nil {
		t.Fatal(err)
	}
	l.Discard("done")
	if len(*e.notes) != 1 {
		t.Errorf("notices %d after a second exhaustion, want 1", len(*e.notes))
	}
	var fd []map[string]any
	for _, r := range e.records() {
		if r["event"] == "ws_descriptor_exhaustion" {
			fd = append(fd, r)
		}
	}
	if len(fd) != 2 || fd[0]["announced"] != true || fd[1]["announced"] != false ||
		fd[0]["code"] != "EMFILE" || fd[0]["detectedBy"] != "error_code" || fd[0]["shedConnections"] != float64(3) {
		t.Errorf("descriptor records %v, want two (announced then not), EMFILE by error_code, 3 shed", fd)
	}
}

func TestDescriptorExhaustionDetection(t *testing.T) {
	lookupErr := errors.New("dial tcp: lookup localhost: no such host")
	tests := []struct {
		name      string
		dialErr   error
		probe     error
		wantShed  bool
		wantErrno string
		wantBy    string
	}{
		{"EMFILE in the dial error", emfileDialError(syscall.EMFILE), nil, true, "EMFILE", "error_code"},
		{"ENFILE in the dial error", emfileDialError(syscall.ENFILE), nil, true, "ENFILE", "error_code"},
		{"hidden by a lookup error, probe finds EMFILE", lookupErr, &os.PathError{Op: "open", Path: os.DevNull, Err: syscall.EMFILE}, true, "EMFILE", "descriptor_probe"},
		{"genuine lookup error, probe succeeds", lookupErr, nil, false, "", ""},
		{"probe fails for another reason", lookupErr, &os.PathError{Op: "open", Path: os.DevNull, Err: syscall.EACCES}, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) {
				probe := tt.probe
				c.ProbeDescriptor = func() error { return probe }
			})
			idleHeads(e, 2)
			e.dialer.fail = func(n int) error {
				if n == 3 {
					return tt.dialErr
				}
				return nil
			}
			l, err := e.pool.Acquire(t.Context(), part("new"), items(user("fresh")))
			if !tt.wantShed {
				if !errors.Is(err, tt.dialErr) {
					t.Fatalf("Acquire err = %v, want the dial error unchanged", err)
				}
				if len(e.dialer.closed()) != 0 || len(*e.notes) != 0 || e.dialer.attempts != 3 {
					t.Errorf("closed %v notes %q attempts %d, want nothing shed, no notice, no retry", e.dialer.closed(), *e.notes, e.dialer.attempts)
				}
				return
			}
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			l.Discard("done")
			if len(e.dialer.closed()) < 2 || len(*e.notes) != 1 {
				t.Fatalf("closed %v notes %q, want both idle heads shed and one notice", e.dialer.closed(), *e.notes)
			}
			note := (*e.notes)[0]
			if !strings.Contains(note, tt.wantErrno) {
				t.Errorf("notice %q does not name %s", note, tt.wantErrno)
			}
			if tt.wantErrno == "ENFILE" && (strings.Contains(note, "ulimit") || !strings.Contains(note, "system-wide")) {
				t.Errorf("ENFILE notice %q: want the system-wide remedy, not ulimit", note)
			}
			for _, r := range e.records() {
				if r["event"] == "ws_descriptor_exhaustion" && r["detectedBy"] != tt.wantBy {
					t.Errorf("detectedBy = %v, want %s", r["detectedBy"], tt.wantBy)
				}
			}
		})
	}
}

func TestDescriptorExhaustionWithNothingIdleFailsOnceWithAdvice(t *testing.T) {
	e := newEnv(t, nil)
	busy, err := e.pool.Acquire(t.Context(), part("busy"), items(user("working")))
	if err != nil {
		t.Fatal(err)
	}
	e.dialer.fail = func(n int) error { return emfileDialError(syscall.EMFILE) }
	_, err = e.pool.Acquire(t.Context(), part("new"), items(user("fresh")))
	var de *DescriptorExhaustionError
	if !errors.As(err, &de) || de.Errno != syscall.EMFILE || de.Shed != 0 || !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("err = %v, want a DescriptorExhaustionError for EMFILE with nothing shed", err)
	}
	if !strings.Contains(err.Error(), "ulimit -n") {
		t.Errorf("error %q lacks the remedy", err)
	}
	if e.dialer.attempts != 2 {
		t.Errorf("dial attempts = %d, want 2 (no retry with nothing freed)", e.dialer.attempts)
	}
	if e.conn(busy.Conn).isClosed() {
		t.Error("busy socket closed")
	}
	if s := e.pool.Stats(); s.InFlight != 1 || s.Nursery != 1 {
		t.Errorf("heads %+v, want only the busy one", s)
	}
	busy.Discard("done")
}
