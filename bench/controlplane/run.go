package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

type options struct {
	addr       string
	redisAddr  string
	tokenFile  string
	redisToken string
	inflight   []int
	accounts   []int
	modes      []string
	duration   time.Duration
	warmup     time.Duration
	conns      int
	ready      time.Duration
	jsonOut    bool
	rounds     int
	cpuprofile string
	// The redis-server behind --redis-addr (optional): its address and
	// process id, read around each redis measurement.
	redisServer string
	redisPID    int
	clkTck      int
}

// result is one measured run.
type result struct {
	Mode      string           `json:"mode"`
	Accounts  int              `json:"accounts"`
	Inflight  int              `json:"inflight"`
	Requests  int              `json:"requests"`
	Errors    int              `json:"errors"`
	Seconds   float64          `json:"seconds"`
	RPS       float64          `json:"rps"`
	P50us     float64          `json:"p50_us"`
	P99us     float64          `json:"p99_us"`
	Decisions map[string]int64 `json:"decisions,omitempty"`
	// With --redis-server and --redis-pid, for the redis mode:
	// redis-server's CPU time per script call and the admit script's own
	// time per call (INFO commandstats usec over calls), in µs.
	RedisCPUus float64 `json:"redis_cpu_us_per_call,omitempty"`
	ScriptUs   float64 `json:"script_us_per_call,omitempty"`
}

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("controlplane-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	inflight, accounts, modes := "1,16,64", "1,10000", "noop,admit"
	fs.StringVar(&o.addr, "addr", "127.0.0.1:17700", "control plane `address` (memory store; the noop and admit modes)")
	fs.StringVar(&o.redisAddr, "redis-addr", "", "`address` of a control plane on the Redis store (the redis mode)")
	fs.StringVar(&o.tokenFile, "token-file", "", "agent token `file` (required)")
	fs.StringVar(&o.redisToken, "redis-token-file", "", "agent token `file` of the --redis-addr control plane (default --token-file)")
	fs.StringVar(&inflight, "inflight", inflight, "comma-separated in-flight counts")
	fs.StringVar(&accounts, "accounts", accounts, "comma-separated account counts")
	fs.StringVar(&modes, "modes", modes, "comma-separated modes: noop (the floor), admit (memory store), redis (Admit on the Redis store, needs --redis-addr)")
	fs.DurationVar(&o.duration, "duration", time.Second, "measured duration per mode and round")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds per combination; the modes alternate within and across rounds so load drift hits both alike")
	fs.DurationVar(&o.warmup, "warmup", 300*time.Millisecond, "unmeasured warm-up per measurement")
	fs.IntVar(&o.conns, "conns", 1, "client connections (HTTP/2 multiplexes in-flight calls over them)")
	fs.DurationVar(&o.ready, "wait-ready", 15*time.Second, "wait this long for the server's health to be SERVING")
	fs.BoolVar(&o.jsonOut, "json", false, "print JSON lines instead of the table")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the load generator's CPU profile to `file`")
	fs.StringVar(&o.redisServer, "redis-server", "", "`host:port` of the redis-server behind --redis-addr: its INFO commandstats give the admit script's time per call")
	fs.IntVar(&o.redisPID, "redis-pid", 0, "`pid` of that redis-server (with --redis-server): its CPU time per Admit from /proc/PID/stat")
	fs.IntVar(&o.clkTck, "clk-tck", 100, "the kernel's clock `ticks` a second (getconf CLK_TCK), for /proc/PID/stat")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.inflight, err = intList(inflight); err != nil {
		return fmt.Errorf("--inflight: %w", err)
	}
	if o.accounts, err = intList(accounts); err != nil {
		return fmt.Errorf("--accounts: %w", err)
	}
	for _, m := range strings.Split(modes, ",") {
		if m != "noop" && m != "admit" && m != "redis" {
			return fmt.Errorf("--modes: %q is invalid; allowed noop, admit, redis", m)
		}
		if m == "redis" && o.redisAddr == "" {
			return errors.New("--modes redis needs --redis-addr")
		}
		o.modes = append(o.modes, m)
	}
	if o.tokenFile == "" {
		return errors.New("--token-file is required")
	}
	if o.rounds < 1 {
		return errors.New("--rounds must be at least 1")
	}
	if o.conns < 1 {
		return errors.New("--conns must be at least 1")
	}
	if (o.redisServer == "") != (o.redisPID == 0) {
		return errors.New("--redis-server and --redis-pid go together")
	}
	tok, _, err := bearer.ReadFile(o.tokenFile)
	if err != nil {
		return err
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	dialAll := func(addr string, tok bearer.Token) ([]*grpc.ClientConn, error) {
		conns := make([]*grpc.ClientConn, 0, o.conns)
		for range o.conns {
			// No client stats handler: the load generator shares the
			// machine's CPUs with the servers, and tracing its own calls
			// measured 8 % of its CPU. The servers keep theirs (otelgrpc
			// on every RPC, the floor's too).
			cc, err := grpc.NewClient(addr,
				grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
			if err != nil {
				closeAll(conns)
				return nil, fmt.Errorf("dial %s: %w", addr, err)
			}
			conns = append(conns, cc)
		}
		if err := waitReady(ctx, conns[0], o.ready); err != nil {
			closeAll(conns)
			return nil, err
		}
		return conns, nil
	}
	targets := map[string][]*grpc.ClientConn{}
	conns, err := dialAll(o.addr, tok)
	if err != nil {
		return err
	}
	defer closeAll(conns)
	targets["noop"], targets["admit"] = conns, conns
	if slices.Contains(o.modes, "redis") {
		rtok := tok
		if o.redisToken != "" {
			if rtok, _, err = bearer.ReadFile(o.redisToken); err != nil {
				return err
			}
		}
		rconns, err := dialAll(o.redisAddr, rtok)
		if err != nil {
			return err
		}
		defer closeAll(rconns)
		targets["redis"] = rconns
	}
	var probe *redisProbe
	if o.redisServer != "" {
		probe = newRedisProbe(o.redisServer, o.redisPID, o.clkTck)
		defer probe.close()
		if _, err := probe.read(ctx); err != nil {
			return err
		}
	}

	fmt.Fprintf(stderr, "controlplane-bench: %s, GOMAXPROCS %d, %d connection(s), %v per run after %v warm-up\n",
		o.addr, runtime.GOMAXPROCS(0), o.conns, o.duration, o.warmup)
	var results []result
	for _, na := range o.accounts {
		keys := make([]string, na)
		for i := range keys {
			keys[i] = account.Key("bench-account-" + strconv.Itoa(i))
		}
		for _, inf := range o.inflight {
			byMode := map[string][]sample{}
			var costs []redisStats // the redis mode's, one per round
			for round := range o.rounds {
				modes := slices.Clone(o.modes)
				if round%2 == 1 {
					slices.Reverse(modes)
				}
				for _, mode := range modes {
					if ctx.Err() != nil {
						return ctx.Err()
					}
					var before redisStats
					if mode == "redis" && probe != nil {
						if before, err = probe.read(ctx); err != nil {
							return err
						}
					}
					byMode[mode] = append(byMode[mode], measure(ctx, targets[mode], mode, keys, inf, o.warmup, o.duration))
					if mode == "redis" && probe != nil {
						after, err := probe.read(ctx)
						if err != nil {
							return err
						}
						costs = append(costs, redisStats{cpu: after.cpu - before.cpu, calls: after.calls - before.calls, usec: after.usec - before.usec})
					}
				}
			}
			for _, mode := range o.modes {
				r := combine(mode, na, inf, byMode[mode])
				if mode == "redis" {
					r.RedisCPUus, r.ScriptUs, _ = redisCost(costs)
				}
				if o.jsonOut {
					b, _ := json.Marshal(r)
					fmt.Fprintln(stdout, string(b))
				} else {
					fmt.Fprintf(stderr, "  %-5s accounts=%-5d inflight=%-3d %8.0f/s p50 %7.0fµs p99 %7.0fµs errors %d%s\n",
						r.Mode, r.Accounts, r.Inflight, r.RPS, r.P50us, r.P99us, r.Errors, redisNote(r))
				}
				results = append(results, r)
			}
		}
	}
	if !o.jsonOut {
		printTable(stdout, results)
	}
	for _, r := range results {
		if r.Errors > 0 {
			return fmt.Errorf("%d errors in %s accounts=%d inflight=%d", r.Errors, r.Mode, r.Accounts, r.Inflight)
		}
	}
	return nil
}

// redisNote is redis-server's cost per call of r, when measured.
func redisNote(r result) string {
	if r.ScriptUs == 0 && r.RedisCPUus == 0 {
		return ""
	}
	return fmt.Sprintf("; redis-server CPU %.1fµs/Admit, script %.1fµs/call", r.RedisCPUus, r.ScriptUs)
}

func closeAll(conns []*grpc.ClientConn) {
	for _, cc := range conns {
		_ = cc.Close()
	}
}

func waitReady(ctx context.Context, cc *grpc.ClientConn, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	for {
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("server not ready after %v: %v", d, err)
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// phases of a run.
const (
	phaseWarmup int32 = iota
	phaseMeasure
	phaseStop
)

// sample is one measured phase.
type sample struct {
	lat       []time.Duration
	errors    int
	elapsed   time.Duration
	decisions [4]int64
}

// combine pools samples: throughput is all requests over all measured
// time, percentiles are over every latency.
func combine(mode string, accounts, inflight int, ss []sample) result {
	var all []time.Duration
	var elapsed time.Duration
	var decisions [4]int64
	r := result{Mode: mode, Accounts: accounts, Inflight: inflight}
	for _, s := range ss {
		all = append(all, s.lat...)
		elapsed += s.elapsed
		r.Errors += s.errors
		for i, n := range s.decisions {
			decisions[i] += n
		}
	}
	slices.Sort(all)
	r.Requests, r.Seconds = len(all), elapsed.Seconds()
	if elapsed > 0 {
		r.RPS = float64(len(all)) / elapsed.Seconds()
	}
	if len(all) > 0 {
		r.P50us = float64(all[len(all)*50/100]) / 1e3
		r.P99us = float64(all[min(len(all)-1, len(all)*99/100)]) / 1e3
	}
	if mode != "noop" {
		r.Decisions = map[string]int64{}
		for d, n := range decisions {
			if n > 0 {
				r.Decisions[strings.ToLower(strings.TrimPrefix(controlplanev1.Decision(d).String(), "DECISION_"))] = n
			}
		}
	}
	return r
}

// measure drives inflight concurrent callers and returns the measured phase.
func measure(ctx context.Context, conns []*grpc.ClientConn, mode string, keys []string, inflight int, warmup, dur time.Duration) sample {
	var phase atomic.Int32
	var next atomic.Uint64
	var errCount atomic.Int64
	var decisions [4]atomic.Int64
	lat := make([][]time.Duration, inflight)
	var wg sync.WaitGroup
	for w := range inflight {
		lat[w] = make([]time.Duration, 0, 1<<14)
		admit := controlplanev1.NewAdmissionServiceClient(conns[w%len(conns)])
		bench := controlplanev1.NewBenchServiceClient(conns[w%len(conns)])
		// One request per caller, reused: Invoke has marshalled it when it
		// returns.
		admitReq := &controlplanev1.AdmitRequest{AgentId: "bench"} // registers its accounts, as a data plane does
		noopReq := &controlplanev1.NoopRequest{}
		wg.Go(func() {
			for {
				p := phase.Load()
				if p == phaseStop {
					return
				}
				key := keys[next.Add(1)%uint64(len(keys))]
				start := time.Now()
				var err error
				var d controlplanev1.Decision
				if mode != "noop" {
					var resp *controlplanev1.AdmitResponse
					admitReq.Account = key
					resp, err = admit.Admit(ctx, admitReq)
					d = resp.GetDecision()
				} else {
					noopReq.Account = key
					_, err = bench.Noop(ctx, noopReq)
				}
				el := time.Since(start)
				if p != phaseMeasure {
					continue
				}
				if err != nil {
					errCount.Add(1)
					continue
				}
				lat[w] = append(lat[w], el)
				if int(d) < len(decisions) {
					decisions[d].Add(1)
				}
			}
		})
	}
	sleep(ctx, warmup)
	phase.Store(phaseMeasure)
	start := time.Now()
	sleep(ctx, dur)
	phase.Store(phaseStop)
	elapsed := time.Since(start)
	wg.Wait()

	smp := sample{errors: int(errCount.Load()), elapsed: elapsed}
	for _, l := range lat {
		smp.lat = append(smp.lat, l...)
	}
	for d := range decisions {
		smp.decisions[d] = decisions[d].Load()
	}
	return smp
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// printTable prints the floor, Admit on the memory store and Admit on the
// Redis store side by side per accounts x inflight.
func printTable(w io.Writer, rs []result) {
	type k struct{ a, i int }
	by := map[string]map[k]result{"noop": {}, "admit": {}, "redis": {}}
	var order []k
	seen := map[k]bool{}
	for _, r := range rs {
		key := k{r.Accounts, r.Inflight}
		if !seen[key] {
			seen[key] = true
			order = append(order, key)
		}
		by[r.Mode][key] = r
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "accounts\tin flight\tfloor rps\tfloor p50 µs\tfloor p99 µs\tAdmit rps\tAdmit p50 µs\tAdmit p99 µs\tAdmit/floor rps\tRedis rps\tRedis p50 µs\tRedis p99 µs\tRedis/floor rps\tRedis/Admit p99\tredis-server CPU µs/Admit\tscript µs/call\tAdmit decisions\tRedis decisions\t")
	ratio := func(a, n result) string {
		if n.RPS > 0 && a.RPS > 0 {
			return fmt.Sprintf("%.1f%%", 100*a.RPS/n.RPS)
		}
		return "-"
	}
	cell := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", v)
	}
	decisions := func(r result) string {
		var dec []string
		for _, name := range []string{"admit", "wait", "refuse"} {
			if v := r.Decisions[name]; v > 0 {
				dec = append(dec, fmt.Sprintf("%s %d", name, v))
			}
		}
		return strings.Join(dec, ", ")
	}
	p99 := func(r, a result) string {
		if r.P99us > 0 && a.P99us > 0 {
			return fmt.Sprintf("%.2fx", r.P99us/a.P99us)
		}
		return "-"
	}
	cell1 := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, key := range order {
		n, a, r := by["noop"][key], by["admit"][key], by["redis"][key]
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", key.a, key.i,
			cell(n.RPS), cell(n.P50us), cell(n.P99us), cell(a.RPS), cell(a.P50us), cell(a.P99us), ratio(a, n),
			cell(r.RPS), cell(r.P50us), cell(r.P99us), ratio(r, n), p99(r, a), cell1(r.RedisCPUus), cell1(r.ScriptUs),
			decisions(a), decisions(r))
	}
	_ = tw.Flush()
}
