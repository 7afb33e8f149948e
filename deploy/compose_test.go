package deploy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	composeloader "github.com/compose-spec/compose-go/v2/loader"
	composetypes "github.com/compose-spec/compose-go/v2/types"
	"sigs.k8s.io/yaml"
)

// composeFile is the part of a Compose file the tests read.
type composeFile struct {
	Name     string                           `json:"name"`
	Secrets  map[string]struct{ File string } `json:"secrets"`
	Services map[string]composeService        `json:"services"`
	Volumes  map[string]any                   `json:"volumes"`
}

type composeService struct {
	Image       string            `json:"image"`
	Build       any               `json:"build"` // set for an image compose builds itself
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
	for _, want := range []string{"redis", "controlplane-1", "controlplane-2", "dataplane-1", "dataplane-2", "clodex-sim", "login", "jaeger", "prometheus", "grafana"} {
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
		for _, f := range []string{"admin-token-file", "agent-token-file", "api-key-file", "metrics-token-file", "credential-key-file"} {
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
		if _, ok := flagValue(cmd, "credential-key-file"); !ok {
			t.Errorf("%s has no --credential-key-file: the replicas hold the sign-in (the credential broker)", name)
		}
		// Each replica keeps its backups on a volume of its own.
		if dir, ok := flagValue(cmd, "backup-dir"); !ok || !onNamedVolume(c, c.Services[name].Volumes, dir) {
			t.Errorf("%s: --backup-dir %q (given: %v) is not on a named volume", name, dir, ok)
		}
	}
	// Redis keeps its data on disk (an AOF) on a named volume.
	redis := c.Services["redis"]
	if v, _ := argAfter(redis.Command, "--appendonly"); v != "yes" {
		t.Errorf("redis command %q; want --appendonly yes", redis.Command)
	}
	if dir, _ := argAfter(redis.Command, "--dir"); !onNamedVolume(c, redis.Volumes, dir) {
		t.Errorf("redis --dir %q is not on a named volume (volumes %q)", dir, redis.Volumes)
	}
	if len(replicas) != 2 {
		t.Errorf("the control planes' --replica ids %v are not distinct", replicas)
	}
	names := map[string]bool{}
	for _, name := range []string{"dataplane-1", "dataplane-2"} {
		s := c.Services[name]
		if v, ok := flagValue(s.Command, "codex-auth"); ok {
			t.Errorf("%s: --codex-auth %s; a fleet data plane takes its tokens from the credential broker", name, v)
		}
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
			Authorization *struct {
				Type            string `json:"type"`
				CredentialsFile string `json:"credentials_file"`
			} `json:"authorization"`
			StaticConfigs []struct {
				Targets []string `json:"targets"`
			} `json:"static_configs"`
		} `json:"scrape_configs"`
	}
	if err := yaml.Unmarshal(b, &prom); err != nil {
		t.Fatalf("deploy/prometheus/prometheus.yml: %v", err)
	}
	scraped := map[string]bool{}
	promSvc := c.Services["prometheus"]
	for _, sc := range prom.ScrapeConfigs {
		// The admin listeners are off loopback: each scrape sends the
		// bearer token from a secret the prometheus service mounts.
		if a := sc.Authorization; a == nil || a.Type != "Bearer" {
			t.Errorf("prometheus.yml job %s sends no bearer token; the admin listeners require --metrics-token-file's", sc.JobName)
		} else if secret, ok := strings.CutPrefix(a.CredentialsFile, "/run/secrets/"); !ok || !slices.Contains(promSvc.Secrets, secret) || c.Secrets[secret].File == "" {
			t.Errorf("prometheus.yml job %s reads its token from %q, which is not a file secret the prometheus service mounts", sc.JobName, a.CredentialsFile)
		}
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

// TestComposeLoads loads the compose file with compose-go, the loader
// Docker Compose uses: schema validation (an unknown or misplaced key is
// an error), interpolation, anchors and merge keys, and the consistency
// checks (every depends_on, secret and volume a service names exists).
func TestComposeLoads(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "deploy", "compose")
	path := filepath.Join(dir, "compose.yaml")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := composeloader.LoadWithContext(t.Context(), composetypes.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []composetypes.ConfigFile{{Filename: path, Content: b}},
		Environment: composetypes.Mapping{},
	})
	if err != nil {
		t.Fatalf("compose-go load: %v", err)
	}
	if p.Name != "clodex" || len(p.Services) != 10 {
		t.Errorf("project %q with %d services; want clodex with 10", p.Name, len(p.Services))
	}
	for name, s := range p.Services {
		if isClodexImage(s.Image) {
			if s.Build == nil || s.Build.Context != repoRoot(t) {
				t.Errorf("service %s builds from %v; want the repository root (the Dockerfile)", name, s.Build)
			}
		}
	}

	// The same loader rejects a key that does not exist.
	bad := strings.Replace(string(b), "    read_only: true\n", "    readonly: true\n", 1)
	bad = strings.Replace(bad, "  read_only: true\n", "  readonly: true\n", 1)
	if _, err := composeloader.LoadWithContext(t.Context(), composetypes.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []composetypes.ConfigFile{{Filename: path, Content: []byte(bad)}},
		Environment: composetypes.Mapping{},
	}); err == nil {
		t.Error("compose-go accepted a misspelt key (readonly); the check cannot fail")
	}
}

func isClodexImage(image string) bool { return strings.HasPrefix(image, "clodex:") }

// onNamedVolume reports whether dir is, or is under, the mount point of
// one of mounts ("volume:/path") that names a top-level volume.
func onNamedVolume(c composeFile, mounts []string, dir string) bool {
	for _, m := range mounts {
		vol, path, ok := strings.Cut(m, ":")
		path, _, _ = strings.Cut(path, ":")
		if _, named := c.Volumes[vol]; ok && named && dir != "" && (dir == path || strings.HasPrefix(dir, path+"/")) {
			return true
		}
	}
	return false
}

// argAfter returns the argument after name in argv.
func argAfter(argv []string, name string) (string, bool) {
	for i, a := range argv {
		if a == name && i+1 < len(argv) {
			return argv[i+1], true
		}
	}
	return "", false
}
