package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-fleet:", err)
		var u *usageError
		if errors.As(err, &u) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// usageError is a bad command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// scenario is one configuration of the benchmark.
type scenario struct {
	name string
	mode cluster.Mode
	kill bool // SIGKILL the control plane mid-run, restart it later
	// replicas is the number of control-plane replicas over one Redis
	// (0: one control plane on the memory store).
	replicas int
	// killReplica SIGKILLs the last replica at --kill-at, for good.
	killReplica bool
	// accuracy runs --accuracy-dataplanes data planes on a hot account
	// (--accuracy-rate, --accuracy-burst) with no upstream throttle and
	// reports the most upgrades in any --duration window against
	// rate x duration + burst.
	accuracy bool
	// adaptiveOff switches the learned throttle off (clodexctl
	// set-adaptive ACCOUNT off) before the load.
	adaptiveOff bool
	// fanOut replaces the closed-loop load: --fanout new conversations
	// at once, spread over fanOutDataPlanes data planes, against
	// clodex-sim at --fanout-limit upgrades per --fanout-window, with the
	// default policy (no clodexctl set-rate).
	fanOut           bool
	fanOutDataPlanes int
}

var scenarios = []scenario{
	{name: "central", mode: cluster.Central},
	{name: "per-host", mode: cluster.PerHost},
	{name: "central-kill", mode: cluster.Central, kill: true},
	{name: "replicas-kill", mode: cluster.Central, replicas: 2, killReplica: true},
	{name: "replicas-2x2", mode: cluster.Central, replicas: 2, accuracy: true},
	{name: "central-adaptive-off", mode: cluster.Central, adaptiveOff: true},
	{name: "learned-1", mode: cluster.Central, fanOut: true, fanOutDataPlanes: 1},
	{name: "learned-off-1", mode: cluster.Central, fanOut: true, fanOutDataPlanes: 1, adaptiveOff: true},
	{name: "learned-3", mode: cluster.Central, fanOut: true, fanOutDataPlanes: 3},
	{name: "learned-off-3", mode: cluster.Central, fanOut: true, fanOutDataPlanes: 3, adaptiveOff: true},
}

func scenarioNames() string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return strings.Join(names, ",")
}

// config is the command line.
type config struct {
	binDir        string
	workDir       string
	keep          bool
	configs       []scenario
	dataPlanes    int
	agents        int
	duration      time.Duration
	drain         time.Duration
	rate, burst   int
	upgradeLimit  int
	upgradeWindow time.Duration
	maxRetries    int
	killAt        time.Duration
	killFor       time.Duration
	timeout       time.Duration
	verbose       bool
	accDataPlanes int
	accRate       int
	accBurst      int
	fanOut        int
	fanOutLimit   int
	fanOutWindow  time.Duration
}

func parseFlags(args []string, stdout io.Writer) (*config, error) {
	c := &config{}
	fs := flag.NewFlagSet("bench-fleet", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&c.binDir, "bin", "bin", "`directory` holding clodex-sim, clodex-controlplane, clodexctl and clodex-dataplane (make build)")
	fs.StringVar(&c.workDir, "work", "", "working `directory` for auth files, tokens, logs (default: a new temporary directory)")
	fs.BoolVar(&c.keep, "keep", false, "keep the working directory (logs) after the run")
	configs := fs.String("configs", scenarioNames(), "comma-separated `configurations` to run, side by side: "+scenarioNames())
	fs.IntVar(&c.dataPlanes, "dataplanes", 3, "data-plane processes, 1..16")
	fs.IntVar(&c.agents, "agents", 20, "concurrent agents per data plane, 1..200")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "how long agents start new turns (5s..10m)")
	fs.DurationVar(&c.drain, "drain", 30*time.Second, "bound on turns still running after --duration; the rest count as unfinished (1s..5m)")
	fs.IntVar(&c.rate, "rate", 120, "the account's new connections per minute (1..600): central policy, and each host's CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN")
	fs.IntVar(&c.burst, "burst", 5, "the account's burst in central mode (1..1000; per-host pacing keeps the environment default)")
	fs.IntVar(&c.upgradeLimit, "upgrade-limit", 30, "clodex-sim: accepted upgrades per account in the trailing window before 403s (1..100000)")
	fs.DurationVar(&c.upgradeWindow, "upgrade-window", 10*time.Second, "clodex-sim: the throttle window (1s..10m)")
	fs.IntVar(&c.maxRetries, "max-retries", 10, "429 retries per turn, like CLAUDE_CODE_MAX_RETRIES (0..20)")
	fs.DurationVar(&c.killAt, "kill-at", 20*time.Second, "central-kill: SIGKILL the control plane this long into the run")
	fs.DurationVar(&c.killFor, "kill-for", 20*time.Second, "central-kill: restart it on the same port after this long")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "hard bound on the whole benchmark (30s..1h)")
	fs.IntVar(&c.accDataPlanes, "accuracy-dataplanes", 2, "replicas-2x2: data planes on the hot account, 1..16")
	fs.IntVar(&c.accRate, "accuracy-rate", 30, "replicas-2x2: the hot account's new connections per minute (1..600)")
	fs.IntVar(&c.accBurst, "accuracy-burst", 5, "replicas-2x2: the hot account's burst (1..1000)")
	fs.IntVar(&c.fanOut, "fanout", 30, "learned-*: new conversations started at once, spread over the data planes (1..600)")
	fs.IntVar(&c.fanOutLimit, "fanout-limit", 20, "learned-*: clodex-sim's accepted upgrades per --fanout-window (1..100000)")
	fs.DurationVar(&c.fanOutWindow, "fanout-window", 60*time.Second, "learned-*: clodex-sim's throttle window (1s..10m)")
	fs.BoolVar(&c.verbose, "v", false, "log process starts and phases to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: bench-fleet [--bin DIR] [--configs "+scenarioNames()+"] [flags]")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return nil, err
		}
		return nil, &usageError{msg: err.Error() + " (see --help)"}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected argument %q; bench-fleet takes flags only (see --help)", fs.Arg(0))}
	}
	var errs []string
	for _, name := range strings.Split(*configs, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.name == name })
		if i < 0 {
			errs = append(errs, fmt.Sprintf("--configs: unknown configuration %q; allowed %s", name, scenarioNames()))
			continue
		}
		c.configs = append(c.configs, scenarios[i])
	}
	if len(c.configs) == 0 && len(errs) == 0 {
		errs = append(errs, "--configs is empty; allowed "+scenarioNames())
	}
	intRange := func(name string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Sprintf("--%s %d is out of range; allowed %d..%d", name, v, lo, hi))
		}
	}
	durRange := func(name string, v, lo, hi time.Duration) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Sprintf("--%s %v is out of range; allowed %v..%v", name, v, lo, hi))
		}
	}
	intRange("dataplanes", c.dataPlanes, 1, 16)
	intRange("accuracy-dataplanes", c.accDataPlanes, 1, 16)
	intRange("accuracy-rate", c.accRate, 1, 600)
	intRange("accuracy-burst", c.accBurst, 1, 1000)
	intRange("agents", c.agents, 1, 200)
	intRange("rate", c.rate, 1, 600)
	intRange("burst", c.burst, 1, 1000)
	intRange("upgrade-limit", c.upgradeLimit, 1, 100000)
	intRange("max-retries", c.maxRetries, 0, 20)
	intRange("fanout", c.fanOut, 1, 600)
	intRange("fanout-limit", c.fanOutLimit, 1, 100000)
	durRange("fanout-window", c.fanOutWindow, time.Second, 10*time.Minute)
	durRange("duration", c.duration, 5*time.Second, 10*time.Minute)
	durRange("drain", c.drain, time.Second, 5*time.Minute)
	durRange("upgrade-window", c.upgradeWindow, time.Second, 10*time.Minute)
	durRange("timeout", c.timeout, 30*time.Second, time.Hour)
	if c.killAt <= 0 || c.killFor <= 0 || c.killAt+c.killFor >= c.duration {
		errs = append(errs, fmt.Sprintf("--kill-at %v and --kill-for %v must be positive and end before --duration %v", c.killAt, c.killFor, c.duration))
	}
	if c.duration%time.Second != 0 {
		errs = append(errs, fmt.Sprintf("--duration %v must be whole seconds (it is clodex-sim's window in replicas-2x2)", c.duration))
	}
	if len(errs) > 0 {
		return nil, &usageError{msg: strings.Join(errs, "; ")}
	}
	return c, nil
}

// outcome is one configuration's figures.
type outcome struct {
	sc       scenario
	load     cluster.LoadResult
	upgrades int64
	u403     int64
	maxWin   int
	window   time.Duration // clodex-sim's throttle window in this run
	limit    int           // clodex-sim's upgrade limit in this run
	killNote string
	accNote  string
	accMet   bool
	err      error
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	bins := cluster.BinariesIn(cfg.binDir)
	if err := bins.Check(); err != nil {
		return &usageError{msg: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()

	level := slog.LevelWarn
	if cfg.verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	work := cfg.workDir
	if work == "" {
		if work, err = os.MkdirTemp("", "bench-fleet-*"); err != nil {
			return fmt.Errorf("create work dir: %w", err)
		}
		if !cfg.keep {
			defer os.RemoveAll(work)
		}
	}

	fmt.Fprintf(stdout, "fleet benchmark: %d data planes x %d agents, one account, new conversation per turn, %v of load (+ up to %v drain)\n",
		cfg.dataPlanes, cfg.agents, cfg.duration, cfg.drain)
	fmt.Fprintf(stdout, "clodex-sim throttle: %d upgrades per %v (403 above); central policy %d/min burst %d; per-host: CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=%d on every host (burst: the default 10)\n",
		cfg.upgradeLimit, cfg.upgradeWindow, cfg.rate, cfg.burst, cfg.rate)
	fmt.Fprintf(stdout, "learned-*: %d new conversations at once (one turn each) against clodex-sim at %d upgrades per %v, default policy; -off: clodexctl set-adaptive ACCOUNT off\n",
		cfg.fanOut, cfg.fanOutLimit, cfg.fanOutWindow)
	fmt.Fprintf(stdout, "client: a 429 is retried after its retry-after on Claude Code's ladder, up to %d times; any other error fails the turn\n\n", cfg.maxRetries)

	var outs []outcome
	for _, sc := range cfg.configs {
		fmt.Fprintf(stderr, "bench-fleet: running %s ...\n", sc.name)
		o := runScenario(ctx, cfg, bins, filepath.Join(work, sc.name), sc, log)
		if o.err != nil {
			fmt.Fprintf(stderr, "bench-fleet: %s: %v\n", sc.name, o.err)
			if work != cfg.workDir && !cfg.keep {
				fmt.Fprintln(stderr, "bench-fleet: rerun with --keep to keep the process logs")
			} else {
				fmt.Fprintf(stderr, "bench-fleet: logs in %s\n", filepath.Join(work, sc.name))
			}
		}
		outs = append(outs, o)
		if ctx.Err() != nil {
			break
		}
	}
	printTable(stdout, cfg, outs)
	for _, o := range outs {
		if o.err != nil {
			return fmt.Errorf("%s: %w", o.sc.name, o.err)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("hard timeout --timeout %v reached", cfg.timeout)
	}
	return nil
}

// runScenario starts a fresh fleet, runs the load, reads the emulator and
// stops everything.
func runScenario(ctx context.Context, cfg *config, bins cluster.Binaries, dir string, sc scenario, log *slog.Logger) outcome {
	o := outcome{sc: sc, window: cfg.upgradeWindow, limit: cfg.upgradeLimit}
	opts := cluster.Options{
		Bins:          bins,
		Dir:           dir,
		Logger:        log.With("config", sc.name),
		Mode:          sc.mode,
		DataPlanes:    cfg.dataPlanes,
		Rate:          cfg.rate,
		Burst:         cfg.burst,
		UpgradeLimit:  cfg.upgradeLimit,
		UpgradeWindow: cfg.upgradeWindow,
		Replicas:      sc.replicas,
		AdaptiveOff:   sc.adaptiveOff,
	}
	if sc.fanOut {
		opts.DataPlanes, opts.DefaultPolicy = sc.fanOutDataPlanes, true
		opts.UpgradeLimit, opts.UpgradeWindow = cfg.fanOutLimit, cfg.fanOutWindow
		o.window, o.limit = opts.UpgradeWindow, opts.UpgradeLimit
	}
	if sc.accuracy {
		// No throttle: the emulator only counts, in windows as long as
		// the run.
		opts.DataPlanes, opts.Rate, opts.Burst = cfg.accDataPlanes, cfg.accRate, cfg.accBurst
		opts.UpgradeLimit, opts.UpgradeWindow = 100000, cfg.duration
		o.window, o.limit = opts.UpgradeWindow, opts.UpgradeLimit
	}
	f, err := cluster.Start(ctx, opts)
	if err != nil {
		o.err = err
		return o
	}
	defer f.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.agents}}
	defer client.CloseIdleConnections()

	bases := make([]string, len(f.DataPlanes))
	for i, dp := range f.DataPlanes {
		bases[i] = dp.BaseURL
	}
	// killer is the control-plane outage of central-kill, owned here:
	// done is closed when it has finished (or was cancelled).
	killCtx, stopKiller := context.WithCancel(ctx)
	done := make(chan struct{})
	var killErr error
	switch {
	case sc.kill:
		go func() {
			defer close(done)
			killErr = outage(killCtx, f.ControlPlane, cfg.killAt, cfg.killFor, log)
		}()
	case sc.killReplica:
		go func() {
			defer close(done)
			if sleepCtx(killCtx, cfg.killAt) == nil {
				log.Info("SIGKILL the last control-plane replica")
				f.ControlPlanes[len(f.ControlPlanes)-1].Kill()
			}
		}()
	default:
		close(done)
	}
	// sampler reads the emulator's 403 count every 500 ms, so the kill
	// configuration can say when the 403s happened.
	sampleCtx, stopSampler := context.WithCancel(ctx)
	sampled := make(chan []sample, 1)
	go func() { sampled <- sampleStats(sampleCtx, f.Sim, client, 500*time.Millisecond) }()
	if sc.fanOut {
		o.load = cluster.RunFanOut(ctx, cluster.FanOutConfig{
			BaseURLs:      bases,
			Conversations: cfg.fanOut,
			Retry:         cluster.Retry{MaxRetries: cfg.maxRetries},
			Client:        client,
		})
	} else {
		o.load, err = cluster.RunLoad(ctx, cluster.LoadConfig{
			BaseURLs: bases,
			Agents:   cfg.agents,
			Duration: cfg.duration,
			Drain:    cfg.drain,
			Retry:    cluster.Retry{MaxRetries: cfg.maxRetries},
			Client:   client,
		})
	}
	stopKiller()
	<-done
	stopSampler()
	samples := <-sampled
	if err != nil {
		o.err = err
		return o
	}
	if killErr != nil {
		o.err = killErr
		return o
	}
	if sc.kill {
		restart := cfg.killAt + cfg.killFor
		o.killNote = fmt.Sprintf("control plane SIGKILLed at %v, restarted at %v; upstream 403s before the kill %d, during the outage %d, after the restart %d",
			cfg.killAt, restart, count403(samples, 0, cfg.killAt), count403(samples, cfg.killAt, restart), count403(samples, restart, time.Hour))
	}
	if sc.killReplica {
		local, err := localNotices(f)
		if err != nil {
			o.err = err
			return o
		}
		o.killNote = fmt.Sprintf("replica %d of %d SIGKILLed at %v for good; upstream 403s before the kill %d, after it %d; data planes that admitted locally: %d of %d",
			len(f.ControlPlanes), len(f.ControlPlanes), cfg.killAt, count403(samples, 0, cfg.killAt), count403(samples, cfg.killAt, time.Hour), local, len(f.DataPlanes))
	}
	st, err := f.Sim.Stats(ctx, client)
	if err != nil {
		o.err = err
		return o
	}
	o.upgrades = st.Upgrades
	o.u403 = st.Upgrade403s
	o.maxWin = st.MaxUpgradesPerWindow[cluster.Account]
	if sc.accuracy {
		bound := float64(cfg.accRate)*cfg.duration.Minutes() + float64(cfg.accBurst)
		o.accMet = float64(o.maxWin) <= bound*1.01
		o.accNote = fmt.Sprintf("%d replicas x %d data planes x %d agents on one account at %d/min burst %d: at most %d upgrades in any %v window; bound rate x time + burst = %.0f (+1%% = %.2f)",
			len(f.ControlPlanes), len(f.DataPlanes), cfg.agents, cfg.accRate, cfg.accBurst, o.maxWin, cfg.duration, bound, bound*1.01)
	}
	return o
}

// localNotices counts the data planes whose log says they admitted
// locally (the control plane was unreachable) at least once.
func localNotices(f *cluster.Fleet) (int, error) {
	n := 0
	for _, dp := range f.DataPlanes {
		b, err := os.ReadFile(dp.Log)
		if err != nil {
			return 0, fmt.Errorf("read data plane log: %w", err)
		}
		if strings.Contains(string(b), "admitting new upstream connections locally") {
			n++
		}
	}
	return n, nil
}

// sample is the emulator's 403 count at an offset into the run.
type sample struct {
	at   time.Duration
	u403 int64
}

// sampleStats polls the emulator until ctx ends (errors skip a sample).
func sampleStats(ctx context.Context, sim *cluster.Sim, client *http.Client, every time.Duration) []sample {
	start := time.Now()
	out := []sample{{at: 0}}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
			st, err := sim.Stats(ctx, client)
			if err == nil {
				out = append(out, sample{at: time.Since(start), u403: st.Upgrade403s})
			}
		}
	}
}

// count403 is how many 403s the samples saw arrive in [from, to): the
// count at the last sample before to minus the count at the last sample
// before from (to the sampling period's resolution).
func count403(samples []sample, from, to time.Duration) int64 {
	at := func(d time.Duration) int64 {
		var v int64
		for _, s := range samples {
			if s.at < d {
				v = s.u403
			}
		}
		return v
	}
	return at(to) - at(from)
}

// outage kills the control plane at killAt and restarts it killFor later.
func outage(ctx context.Context, cp *cluster.ControlPlane, killAt, killFor time.Duration, log *slog.Logger) error {
	if err := sleepCtx(ctx, killAt); err != nil {
		return nil // the run ended first
	}
	log.Info("SIGKILL control plane")
	cp.Kill()
	if err := sleepCtx(ctx, killFor); err != nil {
		return nil
	}
	log.Info("restart control plane")
	if err := cp.Restart(ctx); err != nil {
		return fmt.Errorf("restart control plane: %w", err)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// printTable prints the configurations side by side.
func printTable(w io.Writer, cfg *config, outs []outcome) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	const labelWidth = 44 // labels read left-aligned in a right-aligned table
	row := func(label string, f func(o outcome) string) {
		fmt.Fprintf(tw, "%-*s\t", labelWidth, label)
		for _, o := range outs {
			if o.err != nil {
				fmt.Fprint(tw, "error\t")
				continue
			}
			fmt.Fprint(tw, f(o), "\t")
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintf(tw, "%-*s\t", labelWidth, "")
	for _, o := range outs {
		fmt.Fprint(tw, o.sc.name, "\t")
	}
	fmt.Fprintln(tw)
	row("upstream 403s", func(o outcome) string { return fmt.Sprint(o.u403) })
	row("failed turns", func(o outcome) string { return fmt.Sprint(o.load.Failed) })
	row("turns ok", func(o outcome) string { return fmt.Sprint(o.load.OK) })
	row("unfinished at drain bound", func(o outcome) string { return fmt.Sprint(o.load.Unfinished) })
	row("admitted new sockets/min", func(o outcome) string {
		return fmt.Sprintf("%.1f", float64(o.upgrades)/o.load.Elapsed.Minutes())
	})
	row("upgrades (total)", func(o outcome) string { return fmt.Sprint(o.upgrades) })
	row("max upgrades in one throttle window", func(o outcome) string { return fmt.Sprintf("%d (%d per %v)", o.maxWin, o.limit, o.window) })
	row("429s retried by clients", func(o outcome) string { return fmt.Sprint(o.load.Retries) })
	row("p50 turn latency", func(o outcome) string { return cluster.FormatDuration(o.load.Percentile(50)) })
	row("p99 turn latency", func(o outcome) string { return cluster.FormatDuration(o.load.Percentile(99)) })
	row("elapsed", func(o outcome) string { return cluster.FormatDuration(o.load.Elapsed.Round(100 * time.Millisecond)) })
	tw.Flush()
	for _, o := range outs {
		if o.killNote != "" {
			fmt.Fprintf(w, "\n%s: %s", o.sc.name, o.killNote)
		}
		if o.accNote != "" {
			verdict := "met"
			if !o.accMet {
				verdict = "NOT met"
			}
			fmt.Fprintf(w, "\n%s: %s: %s", o.sc.name, o.accNote, verdict)
		}
		if len(o.load.Reasons) > 0 {
			keys := make([]string, 0, len(o.load.Reasons))
			for k := range o.load.Reasons {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			parts := make([]string, len(keys))
			for i, k := range keys {
				parts[i] = fmt.Sprintf("%s x%d", k, o.load.Reasons[k])
			}
			fmt.Fprintf(w, "\n%s failed turns: %s", o.sc.name, strings.Join(parts, ", "))
		}
	}
	for _, o := range outs {
		if o.err != nil || !o.sc.fanOut || o.sc.adaptiveOff {
			continue
		}
		verdict := "met"
		if o.u403 > 3 || o.load.Failed != 0 {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "\n%s target (at most 3 upstream 403s, 0 failed turns): %s", o.sc.name, verdict)
	}
	for _, o := range outs {
		if o.err != nil || o.sc.mode != cluster.Central || o.sc.accuracy || o.sc.fanOut {
			continue
		}
		verdict := "met"
		if o.u403 != 0 || o.load.Failed != 0 {
			verdict = "NOT met"
		}
		fmt.Fprintf(w, "\n%s target (0 upstream 403s, 0 failed turns): %s", o.sc.name, verdict)
	}
	fmt.Fprintln(w)
}
