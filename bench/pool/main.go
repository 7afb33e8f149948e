package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
)

// targetPerConv is the most an idle pooled conversation may add to the heap
// or to RSS; a run above it fails.
const targetPerConv = 64 << 10

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "poolbench:", err)
		var u *usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// runSpec is one memory run: shape, conversations held, turns each.
type runSpec struct {
	shape string // "one-message" or "cc"
	n     int
	turns int
}

func (r runSpec) String() string { return fmt.Sprintf("%s:%d:%d", r.shape, r.n, r.turns) }

// parseRuns parses "shape:N:turns,..." (one-message runs have 1 turn).
func parseRuns(s string) ([]runSpec, error) {
	var out []runSpec
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p := strings.Split(f, ":")
		if len(p) != 3 {
			return nil, fmt.Errorf("--runs entry %q: want shape:N:turns, e.g. cc:1000:20", f)
		}
		n, err1 := strconv.Atoi(p[1])
		t, err2 := strconv.Atoi(p[2])
		switch {
		case p[0] != "one-message" && p[0] != "cc":
			return nil, fmt.Errorf("--runs entry %q: shape %q; allowed: one-message, cc", f, p[0])
		case err1 != nil || n <= 0:
			return nil, fmt.Errorf("--runs entry %q: N %q; allowed: a positive integer", f, p[1])
		case err2 != nil || t <= 0:
			return nil, fmt.Errorf("--runs entry %q: turns %q; allowed: a positive integer", f, p[2])
		case p[0] == "one-message" && t != 1:
			return nil, fmt.Errorf("--runs entry %q: one-message has exactly 1 turn", f)
		case p[0] == "cc" && t < 2:
			return nil, fmt.Errorf("--runs entry %q: cc needs at least 2 turns", f)
		}
		out = append(out, runSpec{shape: p[0], n: n, turns: t})
	}
	if len(out) == 0 {
		return nil, errors.New("--runs is empty; want shape:N:turns,..., e.g. one-message:1000:1,cc:1000:20")
	}
	return out, nil
}

type options struct {
	url, token, account, fixture string
	runs                         []runSpec
	workers                      int
	timeout                      time.Duration
	bytesTurns, agents, rounds   int
	memProfile                   string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("poolbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	var runs string
	fs.StringVar(&o.url, "url", "", "clodex-sim WebSocket URL, as it prints it (Required)")
	fs.StringVar(&o.token, "token", "tok", "bearer token the emulator accepts (--accept-token TOKEN=ACCOUNT)")
	fs.StringVar(&o.account, "account", "acct-bench", "account id the token belongs to")
	fs.StringVar(&o.fixture, "fixture", "", "Claude Code capture file with the Messages request under \"body\" (Optional; default the embedded Claude Code 2.1.332 first turn)")
	fs.StringVar(&runs, "runs", "one-message:1000:1,one-message:10000:1,cc:1000:20,cc:10000:20", "memory runs, shape:N:turns comma-separated (shapes: one-message, cc)")
	fs.IntVar(&o.workers, "workers", 4, "conversations driven concurrently while building a run")
	fs.DurationVar(&o.timeout, "timeout", 45*time.Minute, "bound on the whole benchmark")
	fs.IntVar(&o.bytesTurns, "bytes-turns", 30, "turns of the upstream-bytes conversation")
	fs.IntVar(&o.agents, "agents", 20, "subagents of the fan-out")
	fs.IntVar(&o.rounds, "rounds", 5, "rounds of the fan-out (turns = agents x rounds)")
	fs.StringVar(&o.memProfile, "memprofile", "", "write a heap profile of each memory run, with every conversation held, to PATH.<shape>-<N> (Optional)")
	if err := fs.Parse(args); err != nil {
		return nil, &usageError{err}
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q; all settings are flags", fs.Args()))
	}
	if o.url == "" {
		errs = append(errs, errors.New("--url is required: the ws:// URL clodex-sim prints"))
	} else if u, err := url.Parse(o.url); err != nil || (u.Scheme != "ws" && u.Scheme != "http") || u.Host == "" {
		errs = append(errs, fmt.Errorf("--url %q: want ws://HOST:PORT/backend-api/codex/responses (loopback clodex-sim)", o.url))
	}
	if o.token == "" {
		errs = append(errs, errors.New("--token is empty; want the token given to clodex-sim --accept-token"))
	}
	if o.account == "" {
		errs = append(errs, errors.New("--account is empty; want the account given to clodex-sim --accept-token"))
	}
	if o.workers <= 0 {
		errs = append(errs, fmt.Errorf("--workers %d; allowed: a positive integer", o.workers))
	}
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %v; allowed: a positive duration", o.timeout))
	}
	if o.bytesTurns < 2 {
		errs = append(errs, fmt.Errorf("--bytes-turns %d; allowed: 2 or more", o.bytesTurns))
	}
	if o.agents < 2 || o.rounds < 1 {
		errs = append(errs, fmt.Errorf("--agents %d --rounds %d; allowed: at least 2 agents and 1 round", o.agents, o.rounds))
	}
	r, err := parseRuns(runs)
	if err != nil {
		errs = append(errs, err)
	}
	o.runs = r
	if err := errors.Join(errs...); err != nil {
		return nil, &usageError{err}
	}
	return o, nil
}

// bench holds what every part of the run shares.
type bench struct {
	opts  *options
	tp    *template
	stats string // the emulator's /sim/stats URL
	cred  codexauth.Credential
	http  *http.Client // for /sim/stats; its idle connections are closed when run returns
	out   io.Writer
	logw  io.Writer
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, o.timeout, fmt.Errorf("benchmark exceeded --timeout %v", o.timeout))
	defer cancel()
	tp, err := loadTemplate(o.fixture)
	if err != nil {
		return err
	}
	u, _ := url.Parse(o.url)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	b := &bench{opts: o, tp: tp, out: stdout, logw: stderr, http: &http.Client{Transport: tr},
		stats: (&url.URL{Scheme: "http", Host: u.Host, Path: "/sim/stats"}).String()}
	b.cred = codexauth.Credential{AccessToken: codexauth.Secret(o.token), AccountID: o.account}
	if _, err := b.simStats(ctx); err != nil {
		return err
	}

	fmt.Fprintf(stdout, "poolbench: %s, GOMAXPROCS=%d, %d workers, fixture %s\n\n", runtime.Version(), runtime.GOMAXPROCS(0), o.workers, cmp.Or(o.fixture, "captures:"+defaultCapture))
	var rows []memRow
	for _, r := range o.runs {
		row, err := b.memRun(ctx, r)
		if err != nil {
			if len(rows) > 0 {
				printMem(stdout, rows) // what finished before the failure
			}
			return fmt.Errorf("run %s: %w", r, err)
		}
		rows = append(rows, row)
	}
	printMem(stdout, rows)

	by, err := b.bytesRun(ctx)
	if err != nil {
		return fmt.Errorf("upstream bytes: %w", err)
	}
	printBytes(stdout, o.bytesTurns, by)

	kept, err := b.fanOut(ctx, false)
	if err != nil {
		return fmt.Errorf("fan-out: %w", err)
	}
	closed, err := b.fanOut(ctx, true)
	if err != nil {
		return fmt.Errorf("fan-out (parallel sockets closed): %w", err)
	}
	printFanOut(stdout, o.agents, o.rounds, kept, closed)

	var fails []string
	for _, r := range rows {
		if r.heapPer > targetPerConv || r.rssPer > targetPerConv {
			fails = append(fails, fmt.Sprintf("%s N=%d", r.spec.shape, r.spec.n))
		}
	}
	if len(fails) > 0 {
		fmt.Fprintf(stdout, "\nabove the 64 KiB target: %s\n", strings.Join(fails, ", "))
	}
	return nil
}

// simStats reads the emulator's counters.
type simCounters struct {
	Upgrades                  int64 `json:"upgrades"`
	OpenSockets               int64 `json:"open_sockets"`
	ContinuedResponses        int64 `json:"continued_responses"`
	PreviousResponseNotFound  int64 `json:"previous_response_not_found"`
	CompletedResponses        int64 `json:"completed_responses"`
	InputTokens, CachedTokens int64
}

func (b *bench) simStats(ctx context.Context) (simCounters, error) {
	var s struct {
		simCounters
		InputTokens  int64 `json:"input_tokens"`
		CachedTokens int64 `json:"cached_tokens"`
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.stats, nil)
	if err != nil {
		return s.simCounters, fmt.Errorf("read emulator stats: %w", err)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return s.simCounters, fmt.Errorf("read emulator stats (is clodex-sim running at --url?): %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s.simCounters, fmt.Errorf("read emulator stats: %s answered HTTP %d", b.stats, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return s.simCounters, fmt.Errorf("read emulator stats: %w", err)
	}
	s.simCounters.InputTokens, s.simCounters.CachedTokens = s.InputTokens, s.CachedTokens
	return s.simCounters, nil
}

// waitClosed waits until the emulator has no open socket (the previous
// run's pool was closed), bounded by ctx and a minute.
func (b *bench) waitClosed(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		s, err := b.simStats(ctx)
		if err == nil && s.OpenSockets == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the emulator's sockets to close: %d still open: %w", s.OpenSockets, context.Cause(ctx))
		case <-t.C:
		}
	}
}

func (b *bench) newPool() (*pool.Pool, error) {
	// Retention is not what is measured: idle TTLs above the run's length
	// keep every head until the pool is closed.
	return pool.New(pool.Config{
		Upstream: upstream.DialOptions{URL: b.opts.url, Version: "poolbench"},
		Credentials: pool.CredentialsFunc(func(context.Context, string) (codexauth.Credential, error) {
			return b.cred, nil
		}),
		NurseryIdleTTL: 50 * time.Minute, IdleTTL: 50 * time.Minute,
	})
}

// mem is the process's memory now, after a GC that returns freed pages.
type mem struct {
	rss, heap, stack uint64
	goroutines       int
}

func measure() (mem, error) {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	rss, err := vmRSS()
	return mem{rss: rss, heap: ms.HeapAlloc, stack: ms.StackInuse, goroutines: runtime.NumGoroutine()}, err
}

// vmRSS reads VmRSS from /proc/self/status.
func vmRSS() (uint64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, fmt.Errorf("read VmRSS: %w", err)
	}
	return parseVmRSS(string(b))
}

func parseVmRSS(status string) (uint64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("read VmRSS: unexpected line %q; want \"VmRSS: <n> kB\"", line)
		}
		kb, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read VmRSS: %q is not a number", f[0])
		}
		return kb << 10, nil
	}
	return 0, errors.New("read VmRSS: no VmRSS line in /proc/self/status")
}

type memRow struct {
	spec                  runSpec
	build                 time.Duration
	rssPer, heapPer       float64 // bytes per conversation
	stackPer, goroutPer   float64
	heads                 int
	continuations, turns  uint64
	simOpen, simContinued int64
	simNotFound           int64
}

// memRun builds r.n idle pooled conversations of r.turns turns each and
// measures the growth.
func (b *bench) memRun(ctx context.Context, r runSpec) (memRow, error) {
	row := memRow{spec: r}
	if err := b.waitClosed(ctx); err != nil {
		return row, err
	}
	p, err := b.newPool()
	if err != nil {
		return row, err
	}
	defer p.Close()
	sim0, err := b.simStats(ctx)
	if err != nil {
		return row, err
	}
	m0, err := measure()
	if err != nil {
		return row, err
	}
	start := time.Now()
	fmt.Fprintf(b.logw, "run %s: building %d conversations of %d turn(s)...\n", r, r.n, r.turns)
	var next atomic.Int64
	var done atomic.Int64
	errc := make(chan error, b.opts.workers)
	var wg sync.WaitGroup
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for range b.opts.workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(r.n) || wctx.Err() != nil {
					return
				}
				session := fmt.Sprintf("%08x-bench-%s-%d", i, r.shape, r.n)
				if err := runConversation(wctx, p, b.tp, b.opts.account, session, r.turns, nil); err != nil {
					errc <- fmt.Errorf("conversation %d: %w", i, err)
					wcancel()
					return
				}
				if d := done.Add(1); d%1000 == 0 {
					fmt.Fprintf(b.logw, "  %d/%d conversations (%v)\n", d, r.n, time.Since(start).Round(time.Second))
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return row, err
	}
	if err := ctx.Err(); err != nil {
		return row, context.Cause(ctx)
	}
	row.build = time.Since(start)
	m1, err := measure()
	if err != nil {
		return row, err
	}
	if b.opts.memProfile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s.%s-%d", b.opts.memProfile, r.shape, r.n)); err != nil {
			return row, err
		}
	}
	st := p.Stats()
	sim1, err := b.simStats(ctx)
	if err != nil {
		return row, err
	}
	n := float64(r.n)
	row.rssPer = (float64(m1.rss) - float64(m0.rss)) / n
	row.heapPer = (float64(m1.heap+m1.stack) - float64(m0.heap+m0.stack)) / n
	row.stackPer = (float64(m1.stack) - float64(m0.stack)) / n
	row.goroutPer = float64(m1.goroutines-m0.goroutines) / n
	row.heads = st.Nursery + st.Established
	row.continuations, row.turns = st.Continuations, st.Acquires
	row.simOpen = sim1.OpenSockets - sim0.OpenSockets
	row.simContinued = sim1.ContinuedResponses - sim0.ContinuedResponses
	row.simNotFound = sim1.PreviousResponseNotFound - sim0.PreviousResponseNotFound
	wantCont := uint64(r.n * (r.turns - 1))
	switch {
	case row.heads != r.n:
		return row, fmt.Errorf("pool holds %d heads after %d conversations; want one each", row.heads, r.n)
	case row.simOpen != int64(r.n):
		return row, fmt.Errorf("emulator has %d open sockets for %d conversations; want one each", row.simOpen, r.n)
	case st.Continuations != wantCont || row.simContinued != int64(wantCont):
		return row, fmt.Errorf("%d pool continuations, %d continued at the emulator; want %d", st.Continuations, row.simContinued, wantCont)
	}
	fmt.Fprintf(b.logw, "run %s: built in %v; %.0f B RSS, %.0f B heap+stack per conversation\n", r, row.build.Round(time.Millisecond), row.rssPer, row.heapPer)
	return row, nil
}

// writeHeapProfile writes the heap profile as of the last GC to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write heap profile: %w", err)
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("write heap profile %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write heap profile %s: %w", path, err)
	}
	return nil
}

func kib(v float64) string { return fmt.Sprintf("%.1f KiB", v/1024) }

func printMem(w io.Writer, rows []memRow) {
	fmt.Fprintln(w, "Memory per idle pooled conversation (real coder/websocket sockets to clodex-sim in another process; target <= 64 KiB)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tconversations\tturns/conv\tbuild\tturns/s\tRSS growth/conv\theap+stack/conv\tof which stack\tgoroutines/conv\theads\tcontinuations\tsim open sockets\tsim prev-not-found\ttarget\t")
	for _, r := range rows {
		ok := "ok"
		if r.heapPer > targetPerConv || r.rssPer > targetPerConv {
			ok = "ABOVE"
		}
		turns := float64(r.spec.n * r.spec.turns)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%v\t%.0f\t%s\t%s\t%s\t%.2f\t%d\t%d\t%d\t%d\t%s\t\n", r.spec.shape, r.spec.n, r.spec.turns,
			r.build.Round(time.Second), turns/r.build.Seconds(), kib(r.rssPer), kib(r.heapPer), kib(r.stackPer), r.goroutPer,
			r.heads, r.continuations, r.simOpen, r.simNotFound, ok)
	}
	tw.Flush()
}
