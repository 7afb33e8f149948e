package main

import (
	"bytes"
	"context"
	crand "crypto/rand" // the demo's bearer tokens must not be guessable by another user of the machine
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
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
	"github.com/clodex/clodex/internal/atomicfile"
)

// Span names of the trace the demo shows: the data plane's turn and
// attempt, and the Admit RPC (client side in the data plane, server side
// in the control plane).
const (
	turnSpan    = "Gateway.Messages"
	attemptSpan = "Gateway.Attempt"
	admitSpan   = "clodex.controlplane.v1.AdmissionService/Admit"

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
	cpAdmin       string

	Turns     []cluster.TurnResult
	Sim       simStats
	Decisions map[string]float64
	// Trace is the trace shown; TracesByService counts the fan-out's
	// traces per data plane service name.
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

// start brings the system up, runs the fan-out and finds the trace. On
// error it stops what it started.
func start(ctx context.Context, o options, progress io.Writer) (_ *demo, err error) {
	d := &demo{o: o, UIURL: "http://" + o.uiAddr, Decisions: map[string]float64{}, TracesByService: map[string]int{}}
	defer func() {
		if err != nil {
			d.close()
			err = fmt.Errorf("%w (logs in %s)", err, o.dir)
		}
	}()
	say := func(format string, args ...any) { fmt.Fprintf(progress, "==> "+format+"\n", args...) }
	addrs := map[string]string{}
	for _, k := range []string{"otlp", "query-grpc", "health", "sim", "cp", "cp-admin", "dp1", "dp2", "dp1-admin", "dp2-admin"} {
		if addrs[k], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	d.simURL, d.cpAdmin = "http://"+addrs["sim"], addrs["cp-admin"]

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

	// The emulator, the control plane, two data planes.
	otel := func(name string) []string {
		return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + addrs["otlp"], "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_SERVICE_NAME=" + name}
	}
	bin := func(name string) string { return filepath.Join(o.bin, name) }
	say("clodex-sim on %s", addrs["sim"])
	sp, err := d.run("clodex-sim", bin("clodex-sim"), nil, "--listen", addrs["sim"],
		"--accept-token", cluster.Token+"="+cluster.Account, "--log-level", "warn")
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, sp, d.simURL+"/sim/stats"); err != nil {
		return nil, err
	}
	admin, agent := filepath.Join(o.dir, "admin.token"), filepath.Join(o.dir, "agent.token")
	for path, tok := range map[string]string{admin: "demo-admin-" + crand.Text(), agent: "demo-agent-" + crand.Text()} {
		if err := atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			return nil, err
		}
	}
	say("clodex-controlplane on %s", addrs["cp"])
	cp, err := d.run("clodex-controlplane", bin("clodex-controlplane"), otel(controlPlaneService),
		"--listen", addrs["cp"], "--admin-listen", addrs["cp-admin"], "--data-dir", filepath.Join(o.dir, "controlplane"),
		"--admin-token-file", admin, "--agent-token-file", agent)
	if err != nil {
		return nil, err
	}
	if err := waitHTTP(ctx, cp, "http://"+addrs["cp-admin"]+"/metrics"); err != nil {
		return nil, err
	}
	auth := filepath.Join(o.dir, "auth.json")
	if err := atomicfile.WriteFile(auth, cluster.AuthJSON(cluster.Token, cluster.Account), 0o600); err != nil {
		return nil, err
	}
	var dataPlanes []string
	for i, k := range []string{"dp1", "dp2"} {
		name := fmt.Sprintf("clodex-dataplane-%d", i+1)
		say("%s on %s", name, addrs[k])
		p, err := d.run(name, bin("clodex-dataplane"), otel(name),
			"--listen", addrs[k], "--admin-listen", addrs[k+"-admin"],
			"--control-plane", addrs["cp"], "--agent-token-file", agent,
			"--upstream-url", "ws://"+addrs["sim"]+"/backend-api/codex/responses",
			"--codex-auth", auth, "--refresh", "never")
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, p, "http://"+addrs[k]+"/healthz"); err != nil {
			return nil, err
		}
		dataPlanes = append(dataPlanes, "http://"+addrs[k])
	}

	// The fan-out: new conversations at once on both data planes.
	say("fan-out: %d new conversations at once on each data plane", o.fanOut)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for i, base := range dataPlanes {
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
	if b, err := get(ctx, "http://"+d.cpAdmin+"/metrics"); err == nil {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if fams, err := parser.TextToMetricFamilies(bytes.NewReader(b)); err == nil {
			if f := fams["clodex_controlplane_admissions_total"]; f != nil {
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						if l.GetName() == "decision" {
							d.Decisions[l.GetValue()] = m.GetCounter().GetValue()
						}
					}
				}
			}
		}
	}

	// The trace: the exporters flush in batches; poll until one trace
	// holds turn -> attempt -> Admit on both planes.
	say("waiting for the traces in Jaeger")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if err := d.findTrace(ctx); err == nil {
			break
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no trace with %s -> %s -> Admit across both planes in Jaeger: %w", turnSpan, attemptSpan, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	return d, nil
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

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// jaegerTrace is a trace as Jaeger's query API returns it.
type jaegerTrace struct {
	TraceID string `json:"traceID"`
	Spans   []struct {
		SpanID        string `json:"spanID"`
		OperationName string `json:"operationName"`
		ProcessID     string `json:"processID"`
		StartTime     int64  `json:"startTime"`
		Duration      int64  `json:"duration"`
		References    []struct {
			RefType string `json:"refType"`
			SpanID  string `json:"spanID"`
		} `json:"references"`
	} `json:"spans"`
	Processes map[string]struct {
		ServiceName string `json:"serviceName"`
	} `json:"processes"`
}

// chain is the trace's turn -> attempt -> Admit (data plane) -> Admit
// (control plane), as span indexes, or nil when the trace lacks it.
func (tr *jaegerTrace) chain() []int {
	parent := map[string]string{}
	index := map[string]int{}
	for i, s := range tr.Spans {
		index[s.SpanID] = i
		for _, r := range s.References {
			if r.RefType == "CHILD_OF" {
				parent[s.SpanID] = r.SpanID
			}
		}
	}
	service := func(i int) string { return tr.Processes[tr.Spans[i].ProcessID].ServiceName }
	for i, s := range tr.Spans {
		if s.OperationName != admitSpan || service(i) != controlPlaneService {
			continue
		}
		// Walk up: the client Admit, then the attempt, then the turn, all
		// in one data plane.
		var path []int
		for id := s.SpanID; id != ""; id = parent[id] {
			j, ok := index[id]
			if !ok {
				break
			}
			path = append(path, j)
		}
		want := []string{admitSpan, admitSpan, attemptSpan, turnSpan}
		var got []int
		for _, j := range path {
			if len(got) < len(want) && tr.Spans[j].OperationName == want[len(got)] {
				got = append(got, j)
			}
		}
		if len(got) == len(want) && strings.HasPrefix(service(got[1]), "clodex-dataplane") &&
			service(got[1]) == service(got[2]) && service(got[2]) == service(got[3]) {
			slices.Reverse(got)
			return got
		}
	}
	return nil
}

// findTrace reads each data plane's traces and keeps the first complete
// chain.
func (d *demo) findTrace(ctx context.Context) error {
	var lastErr error
	found := 0
	for _, svc := range []string{"clodex-dataplane-1", "clodex-dataplane-2"} {
		q := url.Values{"service": {svc}, "operation": {turnSpan}, "limit": {"200"}, "lookback": {"1h"}}
		b, err := get(ctx, d.UIURL+"/api/traces?"+q.Encode())
		if err != nil {
			lastErr = err
			continue
		}
		var resp struct {
			Data []jaegerTrace `json:"data"`
		}
		if err := json.Unmarshal(b, &resp); err != nil {
			lastErr = fmt.Errorf("decode Jaeger traces: %w", err)
			continue
		}
		d.TracesByService[svc] = len(resp.Data)
		for i := range resp.Data {
			if resp.Data[i].chain() != nil {
				found++
				if d.Trace == nil {
					d.Trace = &resp.Data[i]
					d.TraceURL = d.UIURL + "/trace/" + resp.Data[i].TraceID
				}
				break
			}
		}
	}
	if found < 2 {
		if lastErr == nil {
			lastErr = fmt.Errorf("traces so far per data plane: %v", d.TracesByService)
		}
		d.Trace, d.TraceURL = nil, ""
		return lastErr
	}
	return nil
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
	fmt.Fprintf(w, "\nSummary\n  turns: %d, failed: %d\n", len(d.Turns), failed)
	for _, dp := range []int{1, 2} {
		l := per[dp]
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		if len(l) > 0 {
			fmt.Fprintf(w, "  clodex-dataplane-%d: %d turns, median %v, slowest %v\n", dp, len(l), l[len(l)/2].Round(time.Millisecond), l[len(l)-1].Round(time.Millisecond))
		}
	}
	fmt.Fprintf(w, "  control plane admissions: admit %.0f, wait %.0f, refuse %.0f\n", d.Decisions["admit"], d.Decisions["wait"], d.Decisions["refuse"])
	fmt.Fprintf(w, "  clodex-sim: %d upgrades, %d upstream 403s\n", d.Sim.Upgrades, d.Sim.Upgrade403s)
	fmt.Fprintf(w, "  traces in Jaeger: %v\n", d.TracesByService)
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
