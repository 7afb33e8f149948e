package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The units are the credential-broker fleet: the control plane holds the
// sign-ins (its credential key through LoadCredential) and can join
// replicas over Redis from an environment file; the data plane takes its
// tokens from the broker and needs no auth.json copied to its host. Every
// %d/NAME a unit passes is a credential it loads.
func TestSystemdUnitsBrokerFleet(t *testing.T) {
	dir := filepath.Join(repoRoot(t), "deploy", "systemd")
	unit := func(name string) (argv []string, get func(string) []string, header string) {
		t.Helper()
		path := filepath.Join(dir, name)
		entries, err := parseUnit(path)
		if err != nil {
			t.Fatal(err)
		}
		get = func(key string) []string {
			var vs []string
			for _, e := range entries {
				if e.section == "Service" && e.key == key {
					vs = append(vs, e.value)
				}
			}
			return vs
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		header, _, _ = strings.Cut(string(b), "[Unit]")
		ex := get("ExecStart")
		if len(ex) != 1 {
			t.Fatalf("%s: ExecStart = %q, want one", name, ex)
		}
		argv = execArgv(ex[0])
		// Every credential the command line names is loaded.
		for _, m := range regexp.MustCompile(`%d/([A-Za-z0-9._-]+)`).FindAllStringSubmatch(ex[0], -1) {
			if !slices.ContainsFunc(get("LoadCredential"), func(v string) bool { return strings.HasPrefix(v, m[1]+":") }) {
				t.Errorf("%s: ExecStart names %%d/%s but no LoadCredential=%s:... loads it", name, m[1], m[1])
			}
		}
		return argv, get, header
	}

	cp, cpGet, cpHeader := unit("clodex-controlplane.service")
	if v, ok := flagValue(cp, "credential-key-file"); !ok || v != "%d/credential.key" {
		t.Errorf("control plane: --credential-key-file = %q; want %%d/credential.key, the broker's key as a credential", v)
	}
	if !slices.Contains(cpGet("EnvironmentFile"), "-/etc/clodex/controlplane.env") || !strings.Contains(cpHeader, "CLODEX_REDIS_URL=redis://") {
		t.Errorf("control plane: no optional EnvironmentFile=-/etc/clodex/controlplane.env documented with CLODEX_REDIS_URL: replicas cannot join Redis")
	}
	if !strings.Contains(cpHeader, "/etc/clodex/credential.key") {
		t.Error("control plane: the install steps do not create /etc/clodex/credential.key")
	}

	dp, _, dpHeader := unit("clodex-dataplane.service")
	if _, ok := flagValue(dp, "codex-auth"); ok {
		t.Errorf("data plane: ExecStart passes --codex-auth; in a broker fleet the host holds no auth.json")
	}
	if _, ok := flagValue(dp, "control-plane"); !ok {
		t.Error("data plane: no --control-plane")
	}
	if v, _ := flagValue(dp, "agent-token-file"); v != "%d/agent.token" {
		t.Errorf("data plane: --agent-token-file = %q; want %%d/agent.token", v)
	}
	for _, line := range strings.Split(dpHeader, "\n") {
		if strings.Contains(line, "install") && strings.Contains(line, "auth.json") {
			t.Errorf("data plane: the install steps still copy an auth.json: %q", line)
		}
	}
	if !strings.Contains(dpHeader, "clodexctl agent create") {
		t.Error("data plane: the install steps do not say where the host's agent token comes from (clodexctl agent create)")
	}
}
