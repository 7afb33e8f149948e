package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// Span names of the trace the demo shows: the data plane's turn and
// attempt, and the Admit RPC (client side in the data plane, server side
// in the control plane).
const (
	turnSpan    = "Gateway.Messages"
	attemptSpan = "Gateway.Attempt"
	admitSpan   = "clodex.controlplane.v1.AdmissionService/Admit"

	// controlPlaneService prefixes the replicas' service names
	// (clodex-controlplane-1 and -2).
	controlPlaneService = "clodex-controlplane"
	// placeholderMarker is in the page Jaeger serves when it was built
	// without its UI assets.
	placeholderMarker = "not compiled with the UI assets"
)

//go:embed jaeger.yaml.tmpl
var jaegerConfig string

var jaegerTmpl = template.Must(template.New("jaeger").Parse(jaegerConfig))

type options struct {
	bin, jaeger, ui, dir string
	redis                string // the redis-server executable
	uiAddr               string
	fanOut               int
}

func (o options) validate() error {
	var errs []error
	for _, b := range []string{"clodex-sim", "clodex-controlplane", "clodex-dataplane", "clodexctl"} {
		if fi, err := os.Stat(filepath.Join(o.bin, b)); err != nil || fi.IsDir() {
			errs = append(errs, fmt.Errorf("--bin %s has no %s; run make build", o.bin, b))
		}
	}
	if fi, err := os.Stat(o.jaeger); err != nil || fi.IsDir() {
		errs = append(errs, fmt.Errorf("--jaeger %s is not a file; build it with scripts/build-jaeger.sh", o.jaeger))
	}
	if _, err := exec.LookPath(o.redis); err != nil {
		errs = append(errs, fmt.Errorf("--redis-server %s: %w; install Redis (apt-get install redis-server): the control-plane replicas share it", o.redis, err))
	}
	if o.ui != "" {
		if _, err := os.Stat(filepath.Join(o.ui, "index.html")); err != nil {
			errs = append(errs, fmt.Errorf("--ui %s has no index.html; want a built Jaeger UI (index.html and static/)", o.ui))
		}
	}
	if _, _, err := net.SplitHostPort(o.uiAddr); err != nil {
		errs = append(errs, fmt.Errorf("--ui-listen %q is not host:port", o.uiAddr))
	}
	if o.fanOut < 1 || o.fanOut > 50 {
		errs = append(errs, fmt.Errorf("--fan-out %d is out of range; allowed 1..50", o.fanOut))
	}
	return errors.Join(errs...)
}

// proc is one child process, logging to a file in the demo's folder.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func (d *demo) run(name, bin string, env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(d.o.dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append([]string{"HOME=" + d.o.dir, "PATH=" + os.Getenv("PATH")}, env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	d.procs = append(d.procs, p)
	return p, nil
}

// stop ends the process with SIGTERM, SIGKILL after 15 s.
func (p *proc) stop() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// demo is the running system and what the fan-out found.
type demo struct {
	o     options
	procs []*proc

	// UIURL is Jaeger's UI and API; UIPlaceholder is set when Jaeger
	// serves its placeholder page.
	UIURL         string
	UIPlaceholder bool
	simURL        string
	// firstRequests counts, per data plane service, the requests of the
	// set-up's first turn (fleet.go).
	firstRequests map[string]int

	Turns     []cluster.TurnResult
	Sim       simStats
	Decisions map[string]float64
	// Trace is the trace shown; TracesByService counts the fan-out's
	// traces per data plane service name, once every span arrived.
	Trace           *jaegerTrace
	TraceURL        string
	TracesByService map[string]int
}

type simStats struct {
	Upgrades    int64 `json:"upgrades"`
	Upgrade403s int64 `json:"upgrade_403s"`
}

func freeAddr() (string, error) {
	p, err := cluster.FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), nil
}

// start brings the team set-up up (fleet.go), runs the fan-out, waits for
// every span in Jaeger and finds the trace. On error it stops what it
// started.
func start(ctx context.Context, o options, progress io.Writer) (_ *demo, err error) {
	d := &demo{o: o, UIURL: "http://" + o.uiAddr, Decisions: map[string]float64{}, TracesByService: map[string]int{}, firstRequests: map[string]int{}}
	defer func() {
		if err != nil {
			d.close()
			err = fmt.Errorf("%w (logs in %s)", err, o.dir)
		}
	}()
	say := func(format string, args ...any) { fmt.Fprintf(progress, "==> "+format+"\n", args...) }
	addrs := map[string]string{}
	for _, k := range []string{"otlp", "query-grpc", "health", "sim", "redis", "cp1", "cp2", "cp1-admin", "cp2-admin", "dp1", "dp2", "dp1-admin", "dp2-admin"} {
		if addrs[k], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	d.simURL = "http://" + addrs["sim"]

	// Jaeger.
	var cfg bytes.Buffer
	ui := ""
	if o.ui != "" {
		if ui, err = filepath.Abs(o.ui); err != nil {
			return nil, err
		}
	}
	if err := jaegerTmpl.Execute(&cfg, map[string]string{
		"Health": addrs["health"], "UI": o.uiAddr, "QueryGRPC": addrs["query-grpc"], "OTLP": addrs["otlp"], "Assets": ui,
	}); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(o.dir, "jaeger.yaml")
	if err := os.WriteFile(cfgPath, cfg.Bytes(), 0o600); err != nil {
		return nil, err
	}
	say("Jaeger %s (UI and API at %s)", o.jaeger, d.UIURL)
	jp, err := d.run("jaeger", o.jaeger, nil, "--config", cfgPath)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, jp, "http://"+addrs["health"]+"/status"); err != nil {
		return nil, err
	}
	if body, err := get(ctx, d.UIURL+"/"); err == nil && strings.Contains(string(body), placeholderMarker) {
		d.UIPlaceholder = true
	}

	// The team set-up: clodex-sim, Redis, two replicas with the broker, the
	// account imported, scoped agents, two data planes.
	otel := func(name string) []string {
		return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addrs["otlp"], "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=" + name}
	}
	fl, err := d.startFleet(ctx, addrs, otel, say)
	if err != nil {
		return nil, err
	}

	// The fan-out: new conversations at once on both data planes.
	say("fan-out: %d new conversations at once on each data plane", o.fanOut)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for i, base := range fl.dataPlanes {
		for range o.fanOut {
			wg.Go(func() {
				r := cluster.RunTurn(ctx, http.DefaultClient, base, cluster.Retry{MaxRetries: 6}, rand.Float64)
				r.DataPlane = i + 1
				mu.Lock()
				d.Turns = append(d.Turns, r)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if b, err := get(ctx, d.simURL+"/sim/stats"); err == nil {
		_ = json.Unmarshal(b, &d.Sim)
	}
	for _, a := range fl.cpAdmins {
		d.addDecisions(ctx, "http://"+a+"/metrics")
	}

	// Every request of the fan-out is one trace; the exporters flush in
	// batches, so wait until Jaeger holds all of them, whole, before
	// counting.
	requests := maps.Clone(d.firstRequests)
	for _, r := range d.Turns {
		requests[fmt.Sprintf("clodex-dataplane-%d", r.DataPlane)] += r.Attempts
	}
	say("waiting for every span of the %d requests in Jaeger", d.requests()+sum(d.firstRequests))
	if err := d.waitTraces(ctx, requests); err != nil {
		return nil, err
	}
	return d, nil
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// requests is the number of HTTP requests the fan-out sent.
func (d *demo) requests() int {
	n := 0
	for _, r := range d.Turns {
		n += r.Attempts
	}
	return n
}

// addDecisions adds a control-plane replica's admission decisions from
// its /metrics at u.
func (d *demo) addDecisions(ctx context.Context, u string) {
	b, err := get(ctx, u)
	if err != nil {
		return
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		return
	}
	if f := fams["clodex_controlplane_admissions_total"]; f != nil {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" {
					d.Decisions[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
}

func get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	return b, nil
}

// waitHTTP polls u until it answers 200, p exits, or 60 s pass.
func waitHTTP(ctx context.Context, p *proc, u string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := get(ctx, u); err == nil {
			return nil
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			return fmt.Errorf("%s exited before it answered %s:\n%s", p.name, u, lastLines(string(b), 20))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not answer %s", p.name, u)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitTCP waits until addr accepts a connection, p exits, or 60 s pass.
func waitTCP(ctx context.Context, p *proc, addr string) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		var dl net.Dialer
		if c, err := dl.DialContext(ctx, "tcp", addr); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			return fmt.Errorf("%s exited before it listened on %s:\n%s", p.name, addr, lastLines(string(b), 20))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s does not listen on %s", p.name, addr)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (d *demo) failed() bool {
	for _, r := range d.Turns {
		if !r.OK {
			return true
		}
	}
	return d.Sim.Upgrade403s != 0
}

func (d *demo) printSummary(w io.Writer) {
	per := map[int][]time.Duration{}
	failed := 0
	for _, r := range d.Turns {
		per[r.DataPlane] = append(per[r.DataPlane], r.Latency)
		if !r.OK {
			failed++
		}
	}
	fmt.Fprintf(w, "\nSummary\n  turns: %d (%d requests), failed: %d\n", len(d.Turns), d.requests(), failed)
	for _, dp := range []int{1, 2} {
		l := per[dp]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		if len(l) > 0 {
			fmt.Fprintf(w, "  clodex-dataplane-%d: %d turns, median %v, slowest %v\n", dp, len(l), l[len(l)/2].Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
		}
	}
	fmt.Fprintf(w, "  control-plane admissions (both replicas): admit %.0f, wait %.0f, refuse %.0f\n", d.Decisions["admit"], d.Decisions["wait"], d.Decisions["refuse"])
	fmt.Fprintf(w, "  clodex-sim: %d upgrades, %d upstream 403s\n", d.Sim.Upgrades, d.Sim.Upgrade403s)
	var traces []string
	for _, svc := range slices.Sorted(maps.Keys(d.TracesByService)) {
		traces = append(traces, fmt.Sprintf("%s %d", svc, d.TracesByService[svc]))
	}
	fmt.Fprintf(w, "  traces in Jaeger, once every span arrived: %s (one per request: the fan-out's %d and the first turns' %d)\n",
		strings.Join(traces, ", "), d.requests(), sum(d.firstRequests))
	if d.Trace != nil {
		fmt.Fprintf(w, "\nOne turn across both planes:\n")
		for depth, i := range d.Trace.chain() {
			s := d.Trace.Spans[i]
			fmt.Fprintf(w, "  %s%s  [%s]  %v\n", strings.Repeat("  ", depth), s.OperationName,
				d.Trace.Processes[s.ProcessID].ServiceName, (time.Duration(s.Duration) * time.Microsecond).Round(time.Microsecond))
		}
		fmt.Fprintf(w, "\nTrace: %s\n", d.TraceURL)
		fmt.Fprintf(w, "API:   %s/api/traces/%s\n", d.UIURL, d.Trace.TraceID)
	}
	if d.UIPlaceholder {
		fmt.Fprintf(w, "\nNote: this Jaeger was built without its UI assets and serves a placeholder page;\n"+
			"pass --ui DIR (or CLODEX_JAEGER_UI) with a built Jaeger UI to see the trace page.\n")
	}
}

// close stops everything in reverse order of start.
func (d *demo) close() {
	for i := len(d.procs) - 1; i >= 0; i-- {
		d.procs[i].stop()
	}
}
