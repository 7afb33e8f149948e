package deploy

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clodex/clodex/internal/telemetry"
)

// commandLine is one invocation of a clodex binary written in a
// deployment file.
type commandLine struct {
	source string // file and place, for errors
	argv   []string
}

// deployedCommandLines gathers every command line in the deployment files:
// unit ExecStart lines, the Dockerfile's CMD, compose services' entrypoints,
// commands and health checks, and the Kubernetes manifests' containers and
// exec probes.
func deployedCommandLines(t *testing.T) []commandLine {
	t.Helper()
	var out []commandLine
	for _, path := range unitFiles(t) {
		entries, err := parseUnit(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.key, "Exec") {
				out = append(out, commandLine{fmt.Sprintf("%s:%d %s", rel(t, path), e.line, e.key), execArgv(e.value)})
			}
		}
	}
	out = append(out, dockerfileCommandLines(t)...)
	out = append(out, composeCommandLines(t)...)
	out = append(out, kubernetesCommandLines(t)...)
	return out
}

func rel(t *testing.T, path string) string {
	t.Helper()
	r, err := filepath.Rel(repoRoot(t), path)
	if err != nil {
		return path
	}
	return r
}

// TestDeployedFlagsExist fails when a deployment file names a flag, or a
// clodexctl command, that the binary does not have: a renamed flag breaks
// the build here instead of a deployment.
func TestDeployedFlagsExist(t *testing.T) {
	lines := deployedCommandLines(t)
	perBinary := map[string]int{}
	for _, cl := range lines {
		for _, err := range checkArgv(t, cl.source, cl.argv) {
			t.Error(err)
		}
		perBinary[filepath.Base(cl.argv[0])]++
	}
	// The check must have something to check: every server binary is
	// deployed somewhere.
	for _, b := range []string{"clodex-controlplane", "clodex-dataplane", "clodex-sim", "clodexctl"} {
		if perBinary[b] == 0 {
			t.Errorf("no deployment file runs %s (command lines found: %v)", b, perBinary)
		}
	}
}

// TestDeployedAdminListenersHaveTokens: every deployed admin listener off
// loopback has its bearer token file, or the binary would refuse to start
// (internal/telemetry.CheckAdminFlags).
func TestDeployedAdminListenersHaveTokens(t *testing.T) {
	n := 0
	for _, cl := range deployedCommandLines(t) {
		listen, ok := argValue(cl.argv, "admin-listen")
		if !ok {
			continue
		}
		n++
		_, hasToken := argValue(cl.argv, "metrics-token-file")
		if err := telemetry.CheckAdminFlags(listen, map[bool]string{true: "set"}[hasToken], false); err != nil {
			t.Errorf("%s: %v", cl.source, err)
		}
	}
	if n == 0 {
		t.Error("no deployed command line has --admin-listen; the check checked nothing")
	}
}

// argValue is the value of --name (or -name, =value or the next argument).
func argValue(argv []string, name string) (string, bool) {
	for i, a := range argv {
		a = strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v, true
		}
		if a == name && i+1 < len(argv) && strings.HasPrefix(argv[i], "-") {
			return argv[i+1], true
		}
	}
	return "", false
}

// TestCheckArgsFindsMistakes shows the check failing on the mistakes it
// exists for, against the real flag sets.
func TestCheckArgsFindsMistakes(t *testing.T) {
	tests := []struct {
		argv []string
		want string // in the one error; "" for none
	}{
		{[]string{"clodex-controlplane", "--listen", "0.0.0.0:17700", "--data-dir=/d", "--check-config"}, ""},
		{[]string{"/usr/local/bin/clodex-controlplane", "--listen-addr", "0.0.0.0:17700"}, "has no flag --listen-addr"},
		{[]string{"clodex-dataplane", "--control-plane"}, "--control-plane needs a value"},
		{[]string{"clodex-dataplane", "--version", "extra"}, `takes no arguments, got "extra"`},
		{[]string{"clodex-sim", "-listen=127.0.0.1:0", "--count-rejected"}, ""},
		{[]string{"clodexctl", "--control-plane", "cp:17700", "accounts", "-o", "json"}, ""},
		{[]string{"clodexctl", "set-rates", "acct", "1"}, `has no command "set-rates"`},
		{[]string{"redis-server", "--anything"}, ""},
	}
	for _, tt := range tests {
		errs := checkArgv(t, "test", tt.argv)
		switch {
		case tt.want == "" && len(errs) > 0:
			t.Errorf("checkArgv(%q) = %v, want no error", tt.argv, errs)
		case tt.want != "" && (len(errs) != 1 || !strings.Contains(errs[0].Error(), tt.want)):
			t.Errorf("checkArgv(%q) = %v, want one error containing %q", tt.argv, errs, tt.want)
		}
	}
}

// TestBinariesPrintTheirVersion: every binary, built as the image builds
// it, prints its name and the stamped version.
func TestBinariesPrintTheirVersion(t *testing.T) {
	for _, b := range clodexBinaries {
		if got, want := versionOf(t, b), b+" "+testVersion; got != want {
			t.Errorf("%s --version = %q, want %q", b, got, want)
		}
	}
}
