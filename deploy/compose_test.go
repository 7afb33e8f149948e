package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// composeFile is the part of a Compose file the tests read.
type composeFile struct {
	Name     string                           `json:"name"`
	Secrets  map[string]struct{ File string } `json:"secrets"`
	Services map[string]composeService        `json:"services"`
}

type composeService struct {
	Image       string            `json:"image"`
	Command     []string          `json:"command"`
	Entrypoint  []string          `json:"entrypoint"`
	Environment map[string]string `json:"environment"`
	Secrets     []string          `json:"secrets"`
	Volumes     []string          `json:"volumes"`
	Restart     string            `json:"restart"`
	ReadOnly    bool              `json:"read_only"`
	User        string            `json:"user"`
	Healthcheck *struct {
		Test []string `json:"test"`
	} `json:"healthcheck"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("deploy/compose/compose.yaml: %v", err)
	}
	return c
}

func isClodex(s composeService) bool { return strings.HasPrefix(s.Image, "clodex:") }

// composeCommandLines returns each clodex service's command and every
// service's health check command for the flag check.
func composeCommandLines(t *testing.T) []commandLine {
	t.Helper()
	c := readCompose(t)
	var out []commandLine
	for name, s := range c.Services {
		if isClodex(s) {
			out = append(out, commandLine{"deploy/compose/compose.yaml services." + name + ".command", append(slices.Clone(s.Entrypoint), s.Command...)})
		}
		if s.Healthcheck != nil && len(s.Healthcheck.Test) > 1 && s.Healthcheck.Test[0] == "CMD" {
			out = append(out, commandLine{"deploy/compose/compose.yaml services." + name + ".healthcheck", s.Healthcheck.Test[1:]})
		}
	}
	return out
}

// flagValue returns the value of --name in argv ("--name v" or
// "--name=v").
func flagValue(argv []string, name string) (string, bool) {
	for i, a := range argv {
		switch {
		case a == "--"+name && i+1 < len(argv):
			return argv[i+1], true
		case strings.HasPrefix(a, "--"+name+"="):
			return strings.TrimPrefix(a, "--"+name+"="), true
		}
	}
	return "", false
}

// TestCompose checks the system the issue asks compose to stand up:
// Redis, two control-plane replicas on it, two data planes, clodex-sim,
// Jaeger, Prometheus and Grafana; tokens as files (secrets), health checks
// and restart policies everywhere; Prometheus scraping every admin
// listener.
func TestCompose(t *testing.T) {
	c := readCompose(t)
	for _, want := range []string{"redis", "controlplane-1", "controlplane-2", "dataplane-1", "dataplane-2", "clodex-sim", "jaeger", "prometheus", "grafana"} {
		if _, ok := c.Services[want]; !ok {
			t.Errorf("compose has no service %s", want)
		}
	}
	for name, s := range c.Services {
		if s.Restart == "" || s.Restart == "no" {
			t.Errorf("service %s has no restart policy", name)
		}
		if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 {
			t.Errorf("service %s has no health check", name)
		} else if isClodex(s) && (s.Healthcheck.Test[0] != "CMD" || s.Healthcheck.Test[1] != "clodexctl") {
			t.Errorf("service %s health check %q; the image has no shell: want [\"CMD\", \"clodexctl\", ...]", name, s.Healthcheck.Test)
		}
		for k, v := range s.Environment {
			if strings.Contains(strings.ToUpper(k), "TOKEN") || strings.Contains(strings.ToUpper(k), "API_KEY") {
				t.Errorf("service %s passes %s=%s in its environment; tokens are files (secrets)", name, k, v)
			}
		}
		if !isClodex(s) {
			continue
		}
		if !s.ReadOnly {
			t.Errorf("service %s: read_only is not set", name)
		}
		for _, f := range []string{"admin-token-file", "agent-token-file", "api-key-file"} {
			if v, ok := flagValue(s.Command, f); ok {
				secret, found := strings.CutPrefix(v, "/run/secrets/")
				if !found || !slices.Contains(s.Secrets, secret) || c.Secrets[secret].File == "" {
					t.Errorf("service %s: --%s %s is not a file secret the service mounts", name, f, v)
				}
			}
		}
	}

	replicas := map[string]bool{}
	for _, name := range []string{"controlplane-1", "controlplane-2"} {
		cmd := c.Services[name].Command
		if v, ok := flagValue(cmd, "redis"); !ok || !strings.HasPrefix(v, "redis://redis:") {
			t.Errorf("%s: --redis %q, want the compose Redis", name, v)
		}
		r, _ := flagValue(cmd, "replica")
		replicas[r] = true
	}
	if len(replicas) != 2 {
		t.Errorf("the control planes' --replica ids %v are not distinct", replicas)
	}
	names := map[string]bool{}
	for _, name := range []string{"dataplane-1", "dataplane-2"} {
		s := c.Services[name]
		if v, _ := flagValue(s.Command, "control-plane"); v != "controlplane:17700" {
			t.Errorf("%s: --control-plane %q, want the replicas' shared alias controlplane:17700", name, v)
		}
		names[s.Environment["OTEL_SERVICE_NAME"]] = true
	}
	if len(names) != 2 || names[""] {
		t.Errorf("the data planes' OTEL_SERVICE_NAME %v are not distinct: their spans could not be told apart", names)
	}

	// Prometheus scrapes every clodex admin listener, and nothing else.
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var prom struct {
		ScrapeConfigs []struct {
			JobName       string `json:"job_name"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &prom); err != nil {
		t.Fatalf("deploy/prometheus/prometheus.yml: %v", err)
	}
	scraped := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				scraped[target] = true
			}
		}
	}
	want := map[string]bool{}
	for name, s := range c.Services {
		if v, ok := flagValue(s.Command, "admin-listen"); ok && isClodex(s) {
			_, port, err := net.SplitHostPort(v)
			if err != nil {
				t.Errorf("%s: --admin-listen %q: %v", name, v, err)
				continue
			}
			want[name+":"+port] = true
		}
	}
	if fmt.Sprint(sortedKeys(scraped)) != fmt.Sprint(sortedKeys(want)) {
		t.Errorf("prometheus.yml scrapes %v; the admin listeners are %v", sortedKeys(scraped), sortedKeys(want))
	}
	if len(want) != 4 {
		t.Errorf("admin listeners %v; want both control planes and both data planes", sortedKeys(want))
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
