package pool

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestThirtyTurnConversationUsesOneSocket(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-thirty")
	var hist [][]byte
	for i := 1; i <= 30; i++ {
		e.clock.Advance(time.Minute)
		held := len(hist) // the head holds everything sent and answered so far
		if i == 1 {
			hist = append(hist, user("please fix the build"))
		} else {
			hist = append(hist, callOutput(fmt.Sprintf("call_%d", i-1), fmt.Sprintf("output of step %d", i-1)))
		}
		l, err := e.pool.Acquire(t.Context(), pt, hist)
		if err != nil {
			t.Fatalf("turn %d: Acquire: %v", i, err)
		}
		e.send(l, hist)
		f := e.lastFrame(l.Conn)
		if i == 1 {
			if l.Decision != DecisionNewPartition || f.PreviousResponseID != "" || len(f.Input) != 1 {
				t.Fatalf("turn 1: decision %q, previous_response_id %q, %d items; want new_partition_head, none, 1",
					l.Decision, f.PreviousResponseID, len(f.Input))
			}
		} else {
			if l.Decision != DecisionContinuation || !l.Reused {
				t.Fatalf("turn %d: decision %q reused %v, want continuation", i, l.Decision, l.Reused)
			}
			if f.PreviousResponseID != respID(i-1) {
				t.Fatalf("turn %d: previous_response_id %q, want %q", i, f.PreviousResponseID, respID(i-1))
			}
			if l.Delta != held || len(f.Input) != 1 {
				t.Fatalf("turn %d: delta %d with %d items sent, want delta %d and 1 item", i, l.Delta, len(f.Input), held)
			}
			if l.Generation != GenerationEstablished {
				t.Fatalf("turn %d: generation %q, want established", i, l.Generation)
			}
		}
		if got := e.connID(l.Conn); got != 1 {
			t.Fatalf("turn %d: conn %d, want 1", i, got)
		}
		out := items(call(fmt.Sprintf("call_%d", i), fmt.Sprintf(`{"command": "make step%d"}`, i)))
		l.Complete(respID(i), out, Usage{InputTokens: 1000, CachedTokens: 900})
		hist = append(hist, out...)
	}
	if d := e.dialer.dials(); d != 1 {
		t.Errorf("dials = %d, want 1", d)
	}
	if a := e.admit.count(); a != 1 {
		t.Errorf("admissions = %d, want 1 (only the new socket asks)", a)
	}
	s := e.pool.Stats()
	if s.Continuations != 29 || s.Acquires != 30 || s.ReuseRatio() != 29.0/30 {
		t.Errorf("stats continuations=%d acquires=%d ratio=%v, want 29, 30, 29/30", s.Continuations, s.Acquires, s.ReuseRatio())
	}
	if s.CachedRatio() != 0.9 {
		t.Errorf("cached ratio = %v, want 0.9", s.CachedRatio())
	}
	if s.Established != 1 || s.Nursery != 0 || s.InFlight != 0 {
		t.Errorf("heads established=%d nursery=%d inflight=%d, want 1,0,0", s.Established, s.Nursery, s.InFlight)
	}
}

func TestToolArgumentsWhitespaceIsTheCallersCanonicalForm(t *testing.T) {
	// The pool compares canonical bytes as given: the same canonical item
	// continues, different bytes do not (canonicalisation is the
	// translator's job, docs/pool.md §3.1).
	e := newEnv(t, nil)
	pt := part("sess-args")
	in := items(user("hi"))
	out := items(call("c1", `{"a":1}`))
	e.turn(pt, in, "r1", out)
	l, err := e.pool.Acquire(t.Context(), pt, cat(in, items(call("c1", `{"a": 1}`)), items(callOutput("c1", "x"))))
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionHistoryMismatch {
		t.Errorf("decision %q, want %q for non-canonical bytes", l.Decision, DecisionHistoryMismatch)
	}
	l.Discard("test")
}

func TestRewindAndBranchKeepBothHeads(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-rewind")
	u1, a1 := user("u1"), assistant("a1")
	e.turn(pt, items(u1), "r1", items(a1))
	e.turn(pt, items(u1, a1, user("u2")), "r2", items(assistant("a2")))

	// Rewind to after a1 and say something else: a new head.
	l := e.turn(pt, items(u1, a1, user("u2 rewritten")), "r2b", items(assistant("a2b")))
	if l.Decision != DecisionHistoryMismatch || e.connID(l.Conn) != 2 {
		t.Fatalf("rewind: decision %q conn %d, want history_mismatch_new_head on conn 2", l.Decision, e.connID(l.Conn))
	}

	// The original branch continues on conn 1 ...
	l = e.turn(pt, items(u1, a1, user("u2"), assistant("a2"), user("u3")), "r3", items(assistant("a3")))
	if l.Decision != DecisionContinuation || e.connID(l.Conn) != 1 || l.PreviousResponseID != "r2" || l.Delta != 4 {
		t.Fatalf("original branch: decision %q conn %d prev %q delta %d, want continuation on 1 after r2 at 4",
			l.Decision, e.connID(l.Conn), l.PreviousResponseID, l.Delta)
	}
	// ... and the rewound one on conn 2.
	l = e.turn(pt, items(u1, a1, user("u2 rewritten"), assistant("a2b"), user("u3b")), "r3b", items(assistant("a3b")))
	if l.Decision != DecisionContinuation || e.connID(l.Conn) != 2 || l.PreviousResponseID != "r2b" {
		t.Fatalf("rewound branch: decision %q conn %d prev %q, want continuation on 2 after r2b", l.Decision, e.connID(l.Conn), l.PreviousResponseID)
	}
	if d := e.dialer.dials(); d != 2 {
		t.Errorf("dials = %d, want 2", d)
	}
	if s := e.pool.Stats(); s.Established != 2 {
		t.Errorf("established heads = %d, want 2", s.Established)
	}
}

func TestParallelFanOutOfTwentyKeepsEverySocketAsAHead(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-parent") // subagents share the parent's session id
	const agents, rounds = 20, 5
	hist := make([][][]byte, agents)
	for a := range agents {
		hist[a] = items(user(fmt.Sprintf("subagent %d: investigate module %d", a, a)))
	}
	conns := make([]int, agents)
	for r := 1; r <= rounds; r++ {
		leases := make([]*Lease, agents)
		var wg sync.WaitGroup
		errs := make(chan error, agents)
		for a := range agents {
			wg.Go(func() {
				l, err := e.pool.Acquire(t.Context(), pt, hist[a])
				if err != nil {
					errs <- err
					return
				}
				leases[a] = l
			})
		}
		wg.Wait() // every request is in flight before any completes
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", r, err)
		}
		decisions := map[string]int{}
		seen := map[int]bool{}
		for a, l := range leases {
			decisions[l.Decision]++
			id := e.connID(l.Conn)
			if seen[id] {
				t.Fatalf("round %d: conn %d shared by two requests in flight", r, id)
			}
			seen[id] = true
			if r == 1 {
				conns[a] = id
			} else if id != conns[a] || l.PreviousResponseID != fmt.Sprintf("r%d-%d", r-1, a) {
				t.Fatalf("round %d agent %d: conn %d prev %q, want its own conn %d after r%d-%d", r, a, id, l.PreviousResponseID, conns[a], r-1, a)
			}
		}
		if r == 1 {
			if decisions[DecisionNewPartition] != 1 || decisions[DecisionParallelHead] != agents-1 {
				t.Fatalf("round 1 decisions %v, want 1 new_partition_head and %d parallel_head", decisions, agents-1)
			}
		} else if decisions[DecisionContinuation] != agents {
			t.Fatalf("round %d decisions %v, want %d continuations", r, decisions, agents)
		}
		wg = sync.WaitGroup{}
		for a, l := range leases {
			wg.Go(func() {
				out := items(call(fmt.Sprintf("c%d-%d", r, a), `{"command":"ls"}`))
				l.Complete(fmt.Sprintf("r%d-%d", r, a), out, Usage{})
				hist[a] = append(append(hist[a], out...), callOutput(fmt.Sprintf("c%d-%d", r, a), "files"))
			})
		}
		wg.Wait()
	}
	if d := e.dialer.dials(); d != agents {
		t.Errorf("dials = %d for %d turns, want %d", d, agents*rounds, agents)
	}
	s := e.pool.Stats()
	if s.SavedSockets != agents-1 || s.ParallelHeads != agents-1 {
		t.Errorf("saved=%d parallel=%d, want %d each", s.SavedSockets, s.ParallelHeads, agents-1)
	}
	if s.Established != agents {
		t.Errorf("established = %d, want %d", s.Established, agents)
	}
}

func TestTTLsAndPromotion(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		script func(e *env, pt Partition) // leaves the head idle
		wait   time.Duration
		want   string // decision of the next turn
		reason string // eviction reason, if evicted
	}{
		{
			name:   "nursery kept just under 5m",
			script: oneTurn,
			wait:   5*time.Minute - time.Second,
			want:   DecisionContinuation,
		},
		{
			name:   "nursery evicted at 5m",
			script: oneTurn,
			wait:   5 * time.Minute,
			want:   DecisionNewPartition,
			reason: EvictNurseryIdleTTL,
		},
		{
			name:   "established kept just under 30m",
			script: twoTurns,
			wait:   30*time.Minute - time.Second,
			want:   DecisionContinuation,
		},
		{
			name:   "established evicted at 30m",
			script: twoTurns,
			wait:   30 * time.Minute,
			want:   DecisionNewPartition,
			reason: EvictIdleTTL,
		},
		{
			name:   "hard TTL counts idle time",
			cfg:    func(c *Config) { c.HardTTL = 20 * time.Minute },
			script: twoTurns, // ends at 4m
			wait:   16 * time.Minute,
			want:   DecisionNewPartition,
			reason: EvictHardTTL,
		},
		{
			name: "hard TTL excludes time in flight",
			cfg:  func(c *Config) { c.HardTTL = 20 * time.Minute },
			script: func(e *env, pt Partition) {
				e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
				e.clock.Advance(4 * time.Minute)
				l, err := e.pool.Acquire(e.t.Context(), pt, items(user("u1"), assistant("a1"), user("u2")))
				if err != nil {
					e.t.Fatal(err)
				}
				e.clock.Advance(10 * time.Minute) // a long generation
				l.Complete("r2", items(assistant("a2")), Usage{})
			},
			wait: 9 * time.Minute, // physical 23m, in flight 10m: age 13m
			want: DecisionContinuation,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.cfg)
			pt := part("sess-ttl")
			tt.script(e, pt)
			e.clock.Advance(tt.wait)
			l, err := e.pool.Acquire(t.Context(), pt, nextInput(e, pt))
			if err != nil {
				t.Fatal(err)
			}
			if l.Decision != tt.want {
				t.Errorf("decision after %v = %q, want %q", tt.wait, l.Decision, tt.want)
			}
			s := e.pool.Stats()
			if tt.reason != "" {
				if s.Evictions[tt.reason] != 1 {
					t.Errorf("evictions %v, want one %q", s.Evictions, tt.reason)
				}
				if !e.dialer.conns[0].isClosed() {
					t.Errorf("evicted socket still open")
				}
			} else if len(s.Evictions) != 0 {
				t.Errorf("evictions %v, want none", s.Evictions)
			}
			if tt.want == DecisionContinuation && l.Generation != GenerationEstablished {
				t.Errorf("generation after reuse %q, want established", l.Generation)
			}
			l.Discard("test done")
		})
	}
}

// oneTurn leaves a nursery head holding [u1 a1].
func oneTurn(e *env, pt Partition) {
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
}

// twoTurns leaves an established head holding [u1 a1 u2 a2], 4m later.
func twoTurns(e *env, pt Partition) {
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	e.clock.Advance(4 * time.Minute)
	e.turn(pt, items(user("u1"), assistant("a1"), user("u2")), "r2", items(assistant("a2")))
}

// nextInput extends whatever history the scripts above left.
func nextInput(e *env, pt Partition) [][]byte {
	if e.pool.Stats().Established > 0 || e.pool.Stats().Evictions[EvictIdleTTL] > 0 || e.pool.Stats().Evictions[EvictHardTTL] > 0 {
		return items(user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3"))
	}
	return items(user("u1"), assistant("a1"), user("u2"))
}

func TestNurseryHeadPromotedOnFirstReuseOnly(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-promo")
	l := e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	if l.Generation != GenerationNursery {
		t.Fatalf("new head generation %q, want nursery", l.Generation)
	}
	if s := e.pool.Stats(); s.Nursery != 1 || s.Established != 0 {
		t.Fatalf("after one turn nursery=%d established=%d, want 1,0", s.Nursery, s.Established)
	}
	e.turn(pt, items(user("u1"), assistant("a1"), user("u2")), "r2", items(assistant("a2")))
	if s := e.pool.Stats(); s.Nursery != 0 || s.Established != 1 {
		t.Fatalf("after reuse nursery=%d established=%d, want 0,1", s.Nursery, s.Established)
	}
	recs := e.records()
	if got := recs[1]["promotedConnectionId"]; got != float64(1) {
		t.Errorf("promotedConnectionId = %v, want 1", got)
	}
	if got := recs[1]["generation"]; got != GenerationEstablished {
		t.Errorf("generation after promotion = %v, want established", got)
	}
}

func TestRotation(t *testing.T) {
	// An established head with turns at 0, 1, 11, 21, 31 and 41 minutes.
	setup := func(t *testing.T, hook func(n int) error) (*env, Partition, [][]byte) {
		e := newEnv(t, nil)
		pt := part("sess-rotate")
		hist := items(user("u0"))
		for i := 0; i < 6; i++ {
			switch {
			case i == 1:
				e.clock.Advance(time.Minute)
			case i > 1:
				e.clock.Advance(10 * time.Minute)
			}
			out := items(assistant(fmt.Sprintf("a%d", i)))
			e.turn(pt, hist, respID(i), out)
			hist = append(append(hist, out...), user(fmt.Sprintf("u%d", i+1)))
		}
		e.admit.hook = hook
		e.clock.Advance(9 * time.Minute) // physical age 50m
		return e, pt, hist
	}

	t.Run("rotated at 50m with full context on an admitted socket", func(t *testing.T) {
		e, pt, hist := setup(t, nil)
		l, err := e.pool.Acquire(t.Context(), pt, hist)
		if err != nil {
			t.Fatal(err)
		}
		if l.Decision != DecisionRotation || l.Delta != 0 || l.PreviousResponseID != "" || l.Reused {
			t.Fatalf("lease %q delta %d prev %q reused %v, want rotation with full context", l.Decision, l.Delta, l.PreviousResponseID, l.Reused)
		}
		if e.connID(l.Conn) != 2 || !e.dialer.conns[0].isClosed() {
			t.Fatalf("conn %d, old closed %v; want new conn 2 and old closed", e.connID(l.Conn), e.dialer.conns[0].isClosed())
		}
		if e.admit.count() != 2 {
			t.Errorf("admissions = %d, want 2 (first socket, rotation)", e.admit.count())
		}
		e.send(l, hist)
		if f := e.lastFrame(l.Conn); len(f.Input) != len(hist) || f.PreviousResponseID != "" {
			t.Errorf("rotation frame: %d items prev %q, want %d items and none", len(f.Input), f.PreviousResponseID, len(hist))
		}
		l.Complete("r-rot", items(assistant("a6")), Usage{})
		e.clock.Advance(time.Minute)
		l = e.turn(pt, cat(hist, items(assistant("a6"), user("u7"))), "r7", items(assistant("a7")))
		if l.Decision != DecisionContinuation || e.connID(l.Conn) != 2 || l.PreviousResponseID != "r-rot" {
			t.Errorf("after rotation: %q on conn %d prev %q, want continuation on 2 after r-rot", l.Decision, e.connID(l.Conn), l.PreviousResponseID)
		}
		if l.Generation != GenerationEstablished {
			t.Errorf("rotated head generation %q, want established", l.Generation)
		}
	})

	t.Run("refused rotation keeps the old socket under 58m", func(t *testing.T) {
		refused := errors.New("admission refused: retry after 2s")
		e, pt, hist := setup(t, func(n int) error { return refused })
		l, err := e.pool.Acquire(t.Context(), pt, hist)
		if err != nil {
			t.Fatal(err)
		}
		if l.Decision != DecisionContinuation || e.connID(l.Conn) != 1 || l.PreviousResponseID != respID(5) {
			t.Fatalf("lease %q conn %d prev %q, want continuation on old conn 1 after %s", l.Decision, e.connID(l.Conn), l.PreviousResponseID, respID(5))
		}
		if e.dialer.dials() != 1 || e.dialer.conns[0].isClosed() {
			t.Errorf("dials %d, old closed %v; want 1 and open", e.dialer.dials(), e.dialer.conns[0].isClosed())
		}
		if s := e.pool.Stats(); s.RotationsDeferred != 1 {
			t.Errorf("rotations deferred = %d, want 1", s.RotationsDeferred)
		}
		e.clock.Advance(5 * time.Minute) // in flight: not counted by the hard TTL
		l.Complete("r6", items(assistant("a6")), Usage{})
		// At 58m physical (53m of TTL age) the idle socket is too old to use at all.
		e.clock.Advance(3 * time.Minute)
		e.admit.hook = nil
		l, err = e.pool.Acquire(t.Context(), pt, cat(hist, items(assistant("a6"), user("u7"))))
		if err != nil {
			t.Fatal(err)
		}
		if l.Decision != DecisionNewPartition || e.pool.Stats().Evictions[EvictMaxSocketAge] != 1 {
			t.Errorf("decision %q evictions %v, want new_partition_head after a max_socket_age eviction", l.Decision, e.pool.Stats().Evictions)
		}
		l.Discard("done")
	})

	t.Run("refused rotation past 58m fails and drops the head", func(t *testing.T) {
		refused := errors.New("admission refused")
		var e *env
		e, pt, hist := setup(t, func(n int) error {
			e.clock.Advance(9 * time.Minute) // the wait crosses 58m
			return refused
		})
		_, err := e.pool.Acquire(t.Context(), pt, hist)
		if !errors.Is(err, refused) {
			t.Fatalf("Acquire err = %v, want the refusal", err)
		}
		if !e.dialer.conns[0].isClosed() || e.pool.Stats().Established != 0 {
			t.Errorf("old socket closed %v, established %d; want closed and 0", e.dialer.conns[0].isClosed(), e.pool.Stats().Established)
		}
	})
}

func TestReplace(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-replace")
	in1 := items(user("u1"))
	e.turn(pt, in1, "r1", items(assistant("a1")))
	in2 := items(user("u1"), assistant("a1"), user("u2"))
	l, err := e.pool.Acquire(t.Context(), pt, in2)
	if err != nil {
		t.Fatal(err)
	}
	e.send(l, in2)
	// The backend answers previous_response_not_found.
	r, err := l.Replace(t.Context(), ReplacePreviousResponseNotFound)
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision != DecisionReplacement || r.Delta != 0 || r.PreviousResponseID != "" || e.connID(r.Conn) != 2 {
		t.Fatalf("replacement %q delta %d prev %q conn %d, want full context on conn 2", r.Decision, r.Delta, r.PreviousResponseID, e.connID(r.Conn))
	}
	if !e.dialer.conns[0].isClosed() {
		t.Errorf("failed socket not closed")
	}
	if e.admit.count() != 2 {
		t.Errorf("admissions = %d, want 2: the replacement of a held socket asks like a new one", e.admit.count())
	}
	if _, err := r.Replace(t.Context(), ReplaceTransport); !errors.Is(err, ErrReplaceSpent) {
		t.Errorf("second Replace err = %v, want ErrReplaceSpent", err)
	}
	if _, err := l.Replace(t.Context(), ReplaceTransport); !errors.Is(err, ErrLeaseDone) {
		t.Errorf("Replace on replaced lease err = %v, want ErrLeaseDone", err)
	}
	e.send(r, in2)
	if f := e.lastFrame(r.Conn); len(f.Input) != 3 {
		t.Errorf("replacement sent %d items, want 3", len(f.Input))
	}
	r.Complete("r2", items(assistant("a2")), Usage{})
	l3 := e.turn(pt, items(user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3")), "r3", nil)
	if l3.Decision != DecisionContinuation || e.connID(l3.Conn) != 2 || l3.PreviousResponseID != "r2" {
		t.Errorf("after replacement: %q conn %d prev %q, want continuation on 2 after r2", l3.Decision, e.connID(l3.Conn), l3.PreviousResponseID)
	}
	if s := e.pool.Stats(); s.Replacements != 1 || s.Nursery+s.Established != 1 {
		t.Errorf("replacements %d heads %d, want 1 and 1", s.Replacements, s.Nursery+s.Established)
	}
}

func TestReplaceDialFailureDropsTheHead(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-replace-fail")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	l, err := e.pool.Acquire(t.Context(), pt, items(user("u1"), assistant("a1"), user("u2")))
	if err != nil {
		t.Fatal(err)
	}
	down := errors.New("connection refused")
	e.dialer.fail = func(int) error { return down }
	if _, err := l.Replace(t.Context(), ReplaceTransport); !errors.Is(err, down) {
		t.Fatalf("Replace err = %v, want %v", err, down)
	}
	if s := e.pool.Stats(); s.Nursery+s.Established+s.InFlight != 0 {
		t.Errorf("heads left: %+v", s)
	}
}

func TestCapsEvictOldestIdle(t *testing.T) {
	t.Run("nursery cap", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.MaxNurseryConnections = 2 })
		e.turn(part("A"), items(user("a")), "ra", nil) // conn 1
		e.clock.Advance(time.Second)
		e.turn(part("B"), items(user("b")), "rb", nil) // conn 2
		e.clock.Advance(time.Second)
		e.turn(part("A"), items(user("a"), user("a again")), "ra2", nil) // promote A: nursery count 1
		e.turn(part("C"), items(user("c")), "rc", nil)                   // conn 3: under the cap
		e.clock.Advance(time.Second)
		e.turn(part("D"), items(user("d")), "rd", nil) // conn 4: evicts B (oldest idle nursery)
		if got := e.dialer.closed(); !slices.Equal(got, []int{2}) {
			t.Fatalf("closed conns %v, want [2]", got)
		}
		s := e.pool.Stats()
		if s.Evictions[EvictNurseryCap] != 1 || s.Nursery != 2 || s.Established != 1 {
			t.Errorf("stats %+v, want one nursery_lru_cap eviction, 2 nursery, 1 established", s)
		}
	})
	t.Run("busy heads are never evicted", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.MaxNurseryConnections = 1 })
		busy, err := e.pool.Acquire(t.Context(), part("A"), items(user("a"))) // conn 1 in flight
		if err != nil {
			t.Fatal(err)
		}
		l := e.turn(part("B"), items(user("b")), "rb", nil) // conn 2: cap exceeded, nothing idle
		if len(e.dialer.closed()) != 0 || e.connID(l.Conn) != 2 {
			t.Fatalf("closed %v, want none", e.dialer.closed())
		}
		e.clock.Advance(time.Second)
		busy.Complete("ra", nil, Usage{}) // A is now more recently used than B
		e.clock.Advance(time.Second)
		e.turn(part("C"), items(user("c")), "rc", nil) // evicts A then B? only until under cap
		if got := e.dialer.closed(); !slices.Equal(got, []int{2, 1}) {
			t.Fatalf("closed %v, want [2 1] (least recently used first)", got)
		}
	})
	t.Run("established cap on promotion", func(t *testing.T) {
		e := newEnv(t, func(c *Config) { c.MaxConnections = 2 })
		for _, k := range []string{"A", "B", "C"} {
			e.turn(part(k), items(user(k)), "r"+k, nil)
			e.clock.Advance(time.Second)
		}
		for _, k := range []string{"A", "B", "C"} { // promote A, B, then C evicts A
			e.turn(part(k), items(user(k), user(k+"2")), "r2"+k, nil)
			e.clock.Advance(time.Second)
		}
		if got := e.dialer.closed(); !slices.Equal(got, []int{1}) {
			t.Fatalf("closed %v, want [1]", got)
		}
		recs := e.records()
		ev := recs[len(recs)-1]["evictions"].([]any)
		if len(ev) != 1 || ev[0].(map[string]any)["reason"] != EvictEstablishedCap {
			t.Errorf("last record evictions %v, want one established_lru_cap", ev)
		}
		if c := recs[len(recs)-1]["maxConnections"]; c != float64(2) {
			t.Errorf("maxConnections = %v, want 2", c)
		}
	})
}

func TestOmittedReasoningMatch(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-reasoning")
	u1, r1, a1 := user("u1"), reasoning("gAAAA-blob-1"), assistant("a1")
	e.turn(pt, items(u1), "resp1", items(r1, a1))

	// Claude Code dropped the reasoning item from its history.
	l, err := e.pool.Acquire(t.Context(), pt, items(u1, a1, user("u2")))
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionContinuation || l.MatchMode != "omitted_reasoning" || l.Delta != 2 || l.PreviousResponseID != "resp1" {
		t.Fatalf("lease %q mode %q delta %d prev %q, want omitted_reasoning continuation at 2 after resp1", l.Decision, l.MatchMode, l.Delta, l.PreviousResponseID)
	}
	l.Complete("resp2", items(reasoning("gAAAA-blob-2"), call("c1", `{"x":1}`)), Usage{})

	// Next turn, again without reasoning.
	l, err = e.pool.Acquire(t.Context(), pt, items(u1, a1, user("u2"), call("c1", `{"x":1}`), callOutput("c1", "ok")))
	if err != nil {
		t.Fatal(err)
	}
	if l.MatchMode != "omitted_reasoning" || l.Delta != 4 {
		t.Fatalf("mode %q delta %d, want omitted_reasoning at 4", l.MatchMode, l.Delta)
	}
	l.Complete("resp3", items(assistant("done")), Usage{})

	// With the reasoning echoed back the match is exact.
	pt2 := part("sess-reasoning-exact")
	e.turn(pt2, items(u1), "x1", items(r1, a1))
	l, err = e.pool.Acquire(t.Context(), pt2, items(u1, r1, a1, user("u2")))
	if err != nil {
		t.Fatal(err)
	}
	if l.MatchMode != "exact" || l.Delta != 3 {
		t.Errorf("mode %q delta %d, want exact at 3", l.MatchMode, l.Delta)
	}
	l.Discard("done")

	// A different reasoning blob at the same place does not match.
	pt3 := part("sess-reasoning-other")
	e.turn(pt3, items(u1), "y1", items(r1, a1))
	l, err = e.pool.Acquire(t.Context(), pt3, items(u1, reasoning("other-blob"), a1, user("u2")))
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionHistoryMismatch {
		t.Errorf("decision %q, want history mismatch for a different blob", l.Decision)
	}
	l.Discard("done")
}

func TestLongestMatchWins(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-longest")
	u1, a1 := user("u1"), assistant("a1")
	e.turn(pt, items(u1), "r1", items(a1)) // head 1: [u1 a1]
	b, err := e.pool.Acquire(t.Context(), pt, items(u1, a1, user("u2")))
	if err != nil {
		t.Fatal(err)
	}
	// A side request resends the first message while head 1 is busy.
	side := e.turn(pt, items(u1), "s1", items(a1)) // head 2: [u1 a1]
	if side.Decision != DecisionParallelHead {
		t.Fatalf("side request %q, want parallel_head", side.Decision)
	}
	b.Complete("r2", items(assistant("a2")), Usage{}) // head 1: [u1 a1 u2 a2]

	l := e.turn(pt, items(u1, a1, user("u2"), assistant("a2"), user("u3")), "r3", items(assistant("a3")))
	if e.connID(l.Conn) != 1 || l.Delta != 4 {
		t.Fatalf("long history went to conn %d delta %d, want conn 1 at 4", e.connID(l.Conn), l.Delta)
	}
	l = e.turn(pt, items(u1, a1, user("other question")), "r4", nil)
	if e.connID(l.Conn) != 2 || l.Delta != 2 || l.PreviousResponseID != "s1" {
		t.Fatalf("short history went to conn %d delta %d prev %q, want conn 2 at 2 after s1", e.connID(l.Conn), l.Delta, l.PreviousResponseID)
	}
	if s := e.pool.Stats(); s.SavedSockets != 1 {
		t.Errorf("saved sockets = %d, want 1 (the side request's socket was reused)", s.SavedSockets)
	}
}

func TestLongestMatchWinsOverAnOlderHead(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-longest-2")
	u1, a1, u2, a2, u3, a3 := user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3"), assistant("a3")
	e.turn(pt, items(u1), "r1", items(a1)) // conn 1
	b, err := e.pool.Acquire(t.Context(), pt, items(u1, a1, u2))
	if err != nil {
		t.Fatal(err)
	}
	// The following turn arrives on its own socket while turn 2 is in flight.
	e.turn(pt, items(u1, a1, u2, a2, u3), "r3", items(a3)) // conn 2: [u1 a1 u2 a2 u3 a3]
	b.Complete("r2", items(a2), Usage{})                   // conn 1: [u1 a1 u2 a2]
	l := e.turn(pt, items(u1, a1, u2, a2, u3, a3, user("u4")), "r4", nil)
	if e.connID(l.Conn) != 2 || l.Delta != 6 || l.PreviousResponseID != "r3" {
		t.Errorf("conn %d delta %d prev %q, want the longer head: conn 2 at 6 after r3", e.connID(l.Conn), l.Delta, l.PreviousResponseID)
	}
}

func TestAdmissionRematchesAHeadFreedDuringTheWait(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-rematch")
	in1 := items(user("u1"))
	e.turn(pt, in1, "r1", items(assistant("a1")))
	in2 := items(user("u1"), assistant("a1"), user("u2"))
	busy, err := e.pool.Acquire(t.Context(), pt, in2)
	if err != nil {
		t.Fatal(err)
	}
	// The next turn arrives while turn 2 is still in flight (a client
	// retry): no idle head matches, so it asks for admission; while it
	// waits, turn 2 completes and its head matches.
	in3 := items(user("u1"), assistant("a1"), user("u2"), assistant("a2"), user("u3"))
	e.admit.hook = func(n int) error {
		busy.Complete("r2", items(assistant("a2")), Usage{})
		return nil
	}
	l, err := e.pool.Acquire(t.Context(), pt, in3)
	if err != nil {
		t.Fatal(err)
	}
	if l.Decision != DecisionContinuation || e.connID(l.Conn) != 1 || l.PreviousResponseID != "r2" || l.Delta != 4 {
		t.Fatalf("lease %q conn %d prev %q delta %d, want continuation on conn 1 after r2 at 4", l.Decision, e.connID(l.Conn), l.PreviousResponseID, l.Delta)
	}
	if e.dialer.dials() != 1 || e.pool.Stats().Rematches != 1 {
		t.Errorf("dials %d rematches %d, want 1 and 1", e.dialer.dials(), e.pool.Stats().Rematches)
	}
	recs := e.records()
	if recs[len(recs)-1]["rematchedAfterAdmission"] != true {
		t.Errorf("record %v lacks rematchedAfterAdmission", recs[len(recs)-1])
	}
	l.Discard("done")
}

func TestAdmissionAskedOnlyForNewSockets(t *testing.T) {
	e := newEnv(t, nil)
	refused := errors.New("refused: retry after 1s")
	pt := part("sess-admit")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	if e.admit.count() != 1 || e.admit.accts[0] != "acct-1" {
		t.Fatalf("admissions %d %v, want 1 for acct-1", e.admit.count(), e.admit.accts)
	}
	e.admit.hook = func(int) error { return refused }
	// Reuse never asks, so a refusing admitter does not matter.
	e.turn(pt, items(user("u1"), assistant("a1"), user("u2")), "r2", items(assistant("a2")))
	if e.admit.count() != 1 {
		t.Fatalf("admissions = %d after a continuation, want 1", e.admit.count())
	}
	// A new head asks and the refusal reaches the caller; nothing is registered.
	_, err := e.pool.Acquire(t.Context(), part("other"), items(user("x")))
	if !errors.Is(err, refused) {
		t.Fatalf("Acquire err = %v, want the refusal", err)
	}
	if e.dialer.dials() != 1 {
		t.Errorf("dials = %d, want 1", e.dialer.dials())
	}
	if s := e.pool.Stats(); s.Nursery+s.Established != 1 || s.InFlight != 0 {
		t.Errorf("heads %+v, want only the first", s)
	}
}

func TestDropAccount(t *testing.T) {
	e := newEnv(t, nil)
	p1 := part("s1")
	p2 := Partition{Account: "acct-2", Model: "gpt-5-codex", PromptCacheKey: "s2"}
	e.turn(p1, items(user("a")), "ra", nil)                                // conn 1 idle
	e.turn(p2, items(user("b")), "rb", nil)                                // conn 2 idle, other account
	busy, err := e.pool.Acquire(t.Context(), part("s3"), items(user("c"))) // conn 3 busy
	if err != nil {
		t.Fatal(err)
	}
	if n := e.pool.DropAccount("acct-1"); n != 2 {
		t.Fatalf("DropAccount = %d, want 2", n)
	}
	if got := e.dialer.closed(); !slices.Equal(got, []int{1}) {
		t.Fatalf("closed %v, want [1] (busy conn 3 closes at the end of its turn)", got)
	}
	busy.Complete("rc", nil, Usage{})
	if got := e.dialer.closed(); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("closed %v after completion, want [1 3]", got)
	}
	l := e.turn(p1, items(user("a"), user("a2")), "ra2", nil)
	if l.Decision != DecisionNewPartition {
		t.Errorf("after drop: %q, want new_partition_head", l.Decision)
	}
	l = e.turn(p2, items(user("b"), user("b2")), "rb2", nil)
	if l.Decision != DecisionContinuation {
		t.Errorf("other account: %q, want continuation", l.Decision)
	}
}

func TestUnpartitionedSocketIsNeverAHead(t *testing.T) {
	e := newEnv(t, nil)
	pt := Partition{Account: "acct-1", Model: "gpt-5-codex"} // no prompt_cache_key
	for i := 1; i <= 2; i++ {
		l := e.turn(pt, items(user("u1")), respID(i), items(assistant("a1")))
		if l.Decision != DecisionUnpartitioned || l.Generation != GenerationIsolated || e.connID(l.Conn) != i {
			t.Fatalf("request %d: %q %q conn %d, want unpartitioned_socket isolated on conn %d", i, l.Decision, l.Generation, e.connID(l.Conn), i)
		}
		if !e.conn(l.Conn).isClosed() {
			t.Fatalf("request %d: socket left open", i)
		}
	}
	if e.admit.count() != 2 {
		t.Errorf("admissions = %d, want 2", e.admit.count())
	}
	if s := e.pool.Stats(); s.Misses[MissUnpartitioned] != 2 {
		t.Errorf("misses %v, want 2 unpartitioned", s.Misses)
	}
}

func TestFailedTurnsDropTheHead(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  func(l *Lease)
	}{
		{"discard", func(l *Lease) { l.Discard("client cancelled") }},
		{"no response id", func(l *Lease) { l.Complete("", nil, Usage{}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, nil)
			pt := part("sess-fail")
			e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
			l, err := e.pool.Acquire(t.Context(), pt, items(user("u1"), assistant("a1"), user("u2")))
			if err != nil {
				t.Fatal(err)
			}
			tt.end(l)
			tt.end(l) // a second end is a no-op
			if !e.conn(l.Conn).isClosed() {
				t.Fatal("socket left open")
			}
			if s := e.pool.Stats(); s.Nursery+s.Established+s.InFlight != 0 {
				t.Fatalf("heads left: %+v", s)
			}
		})
	}
}

func TestAcquireRejectsEmptyInputAndClosedPool(t *testing.T) {
	e := newEnv(t, nil)
	if _, err := e.pool.Acquire(t.Context(), part("x"), nil); err == nil {
		t.Error("Acquire(nil items) succeeded, want an error")
	}
	e.turn(part("x"), items(user("u")), "r", nil)
	if err := e.pool.Close(); err != nil {
		t.Fatal(err)
	}
	if !e.dialer.conns[0].isClosed() {
		t.Error("Close left an idle socket open")
	}
	if _, err := e.pool.Acquire(t.Context(), part("x"), items(user("u"), user("v"))); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close err = %v, want ErrClosed", err)
	}
}

func TestTieBetweenExactAndOmittedReasoningPrefersExact(t *testing.T) {
	e := newEnv(t, nil)
	pt := part("sess-tie")
	u1, r, r2, a1 := user("u1"), reasoning("blob-r"), reasoning("blob-r2"), assistant("a1")
	e.turn(pt, items(u1, r), "rb", items(r2, a1)) // conn 1: [u1 r | r2 a1]; without reasoning [u1 r a1]
	e.turn(pt, items(u1), "ra", items(r, a1))     // conn 2: [u1 | r a1]
	l := e.turn(pt, items(u1, r, a1, user("u2")), "rc", nil)
	if e.connID(l.Conn) != 2 || l.MatchMode != "exact" || l.Delta != 3 {
		t.Errorf("conn %d mode %q delta %d, want the exact match: conn 2 at 3", e.connID(l.Conn), l.MatchMode, l.Delta)
	}
}

func TestEarlierDeadlineAfterALaterOneStillExpires(t *testing.T) {
	e := newEnv(t, nil)
	a, b := part("A"), part("B")
	e.turn(a, items(user("a1")), "ra1", items(assistant("x")))
	e.clock.Advance(time.Minute)
	e.turn(a, items(user("a1"), assistant("x"), user("a2")), "ra2", nil) // established, idle until 31m
	e.clock.Advance(5 * time.Minute)
	e.turn(b, items(user("b1")), "rb1", items(assistant("y"))) // nursery at 6m, expires at 11m
	e.clock.Advance(5 * time.Minute)
	l := e.turn(b, items(user("b1"), assistant("y"), user("b2")), "rb2", nil)
	if l.Decision != DecisionNewPartition {
		t.Errorf("B after its nursery TTL: %q, want new_partition_head", l.Decision)
	}
	l = e.turn(a, items(user("a1"), assistant("x"), user("a2"), user("a3")), "ra3", nil)
	if l.Decision != DecisionContinuation {
		t.Errorf("A within its idle TTL: %q, want continuation", l.Decision)
	}
}
