package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/atomicfile"
)

// dashboardQueries returns every PromQL expression of the Grafana
// dashboard, with the panel it is in.
func dashboardQueries(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "grafana", "clodex.json"))
	if err != nil {
		t.Fatal(err)
	}
	type panel struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
		Panels []json.RawMessage `json:"panels"`
	}
	var dash struct {
		Title  string            `json:"title"`
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("deploy/grafana/clodex.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard uid %q title %q; both are needed for provisioning", dash.UID, dash.Title)
	}
	out := map[string]string{}
	var walk func([]json.RawMessage)
	walk = func(raw []json.RawMessage) {
		for _, r := range raw {
			var p panel
			if err := json.Unmarshal(r, &p); err != nil {
				t.Fatalf("dashboard panel: %v", err)
			}
			for _, tg := range p.Targets {
				out[tg.Expr] = p.Title
			}
			walk(p.Panels)
		}
	}
	walk(dash.Panels)
	if len(out) < 10 {
		t.Fatalf("dashboard has %d queries; want the panels over both planes", len(out))
	}
	return out
}

// metricRef is a metric a query names, with the labels it matches on.
type metricRef struct {
	name   string
	labels []string
}

var (
	metricName = regexp.MustCompile(`\b((?:clodex|process|go)_[a-zA-Z0-9_]+)(\{[^}]*\})?`)
	labelName  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	// grouping labels in "by (a, b)"
	byClause = regexp.MustCompile(`by\s*\(([^)]*)\)`)
)

// metricRefs extracts the metrics of one expression. Every metric the
// dashboard queries is named clodex_*, process_* or go_*; the test
// rejects any other identifier that looks like a metric.
func metricRefs(expr string) []metricRef {
	var refs []metricRef
	for _, m := range metricName.FindAllStringSubmatch(expr, -1) {
		r := metricRef{name: m[1]}
		for _, l := range labelName.FindAllStringSubmatch(m[2], -1) {
			r.labels = append(r.labels, l[1])
		}
		refs = append(refs, r)
	}
	return refs
}

// scrape reads and parses one /metrics page.
func scrape(ctx context.Context, t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape %s: %s %v", addr, resp.Status, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics of %s: %v", addr, err)
	}
	return fams
}

// family finds the family a series name belongs to: itself, or a
// histogram's _bucket, _sum and _count.
func family(fams map[string]*dto.MetricFamily, series string) *dto.MetricFamily {
	if f, ok := fams[series]; ok {
		return f
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(series, suffix); ok {
			if f, ok := fams[base]; ok && (f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY) {
				return f
			}
		}
	}
	return nil
}

func hasLabel(f *dto.MetricFamily, label string) bool {
	if label == "le" && f.GetType() == dto.MetricType_HISTOGRAM {
		return true
	}
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if lp.GetName() == label {
				return true
			}
		}
	}
	return false
}

// TestDashboardMetricsExist runs the control plane, clodex-sim and a data
// plane as real processes with their admin listeners, serves one turn, and
// checks that every metric the dashboard queries is on one of their
// /metrics pages, with every label the query matches or groups on.
func TestDashboardMetricsExist(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the real binaries")
	}
	queries := dashboardQueries(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	bins := binaries(t)
	dpAdmin, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dpAdminAddr := fmt.Sprintf("127.0.0.1:%d", dpAdmin)
	f, err := cluster.Start(ctx, cluster.Options{
		Bins: cluster.BinariesIn(bins), Dir: t.TempDir(), Mode: cluster.Central, DataPlanes: 1,
		ControlPlaneAdmin: true, DataPlaneArgs: []string{"--admin-listen", dpAdminAddr},
		UpgradeLimit: 1000,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	res := cluster.RunTurn(ctx, http.DefaultClient, f.DataPlanes[0].BaseURL, cluster.Retry{MaxRetries: 3}, rand.Float64)
	if !res.OK {
		t.Fatalf("turn through the data plane failed: %s", res.Reason)
	}

	cp := scrape(ctx, t, f.ControlPlane.AdminAddr)
	dp := scrape(ctx, t, dpAdminAddr)
	// A replica over Redis has the store's metrics too.
	for name, fam := range scrapeRedisReplica(ctx, t, bins) {
		if _, ok := cp[name]; !ok {
			cp[name] = fam
		}
	}
	var checked []string
	for expr, title := range queries {
		refs := metricRefs(expr)
		if len(refs) == 0 {
			t.Errorf("panel %q: query %q names no clodex, process or go metric", title, expr)
		}
		var grouped []string
		for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
			for _, l := range strings.Split(m[1], ",") {
				if l = strings.TrimSpace(l); l != "" && l != "job" && l != "instance" {
					grouped = append(grouped, l)
				}
			}
		}
		for _, r := range refs {
			fam := family(cp, r.name)
			if fam == nil {
				fam = family(dp, r.name)
			}
			if fam == nil {
				t.Errorf("panel %q: %s is on neither /metrics page (query %q)", title, r.name, expr)
				continue
			}
			checked = append(checked, r.name)
			for _, l := range r.labels {
				if !hasLabel(fam, l) {
					t.Errorf("panel %q: %s has no label %q (query %q)", title, r.name, l, expr)
				}
			}
			// A "by" label must exist on at least one metric of the query.
			for _, l := range grouped {
				found := false
				for _, r2 := range refs {
					if f2 := family(cp, r2.name); f2 != nil && hasLabel(f2, l) {
						found = true
					}
					if f2 := family(dp, r2.name); f2 != nil && hasLabel(f2, l) {
						found = true
					}
				}
				if !found {
					t.Errorf("panel %q: no metric of %q has the label %q it groups by", title, expr, l)
				}
			}
		}
	}
	slices.Sort(checked)
	t.Logf("checked %d metric references (%d distinct)", len(checked), len(slices.Compact(checked)))
}

// scrapeRedisReplica runs clodex-controlplane over a real redis-server,
// admits once through it, and returns its /metrics.
func scrapeRedisReplica(ctx context.Context, t *testing.T, bins string) map[string]*dto.MetricFamily {
	t.Helper()
	rs := redistest.Start(t)
	dir := t.TempDir()
	admin, agent := filepath.Join(dir, "admin.token"), filepath.Join(dir, "agent.token")
	for path, tok := range map[string]string{admin: "dash-admin-token-0123456789", agent: "dash-agent-token-0123456789"} {
		if err := atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	adminPort, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr, adminAddr := fmt.Sprintf("127.0.0.1:%d", port), fmt.Sprintf("127.0.0.1:%d", adminPort)
	logPath := filepath.Join(dir, "controlplane.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bins, "clodex-controlplane"), "--listen", addr, "--admin-listen", adminAddr,
		"--redis", rs.URL, "--replica", "dash-1", "--admin-token-file", admin, "--agent-token-file", agent)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("---- clodex-controlplane --redis ----\n%s", b)
		}
	})
	// Ready when an admission goes through it.
	for {
		out, err := exec.CommandContext(ctx, filepath.Join(bins, "clodexctl"), "--control-plane", addr, "--token-file", admin,
			"set-rate", cluster.Account, "120").CombinedOutput()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the Redis replica never answered: %v\n%s", err, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return scrape(ctx, t, adminAddr)
}

func TestMetricRefs(t *testing.T) {
	got := metricRefs(`sum by (decision) (rate(clodex_controlplane_admissions_total{decision="refuse", x=~"a"}[5m])) / process_open_fds`)
	if len(got) != 2 || got[0].name != "clodex_controlplane_admissions_total" || !slices.Equal(got[0].labels, []string{"decision", "x"}) || got[1].name != "process_open_fds" {
		t.Errorf("metricRefs = %+v", got)
	}
}
