package deploy

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unitEntry is one Key=Value line of a unit file.
type unitEntry struct {
	section, key, value string
	line                int
}

// parseUnit reads a systemd unit: sections, Key=Value lines, a trailing
// backslash continuing a line, # and ; comments.
func parseUnit(path string) ([]unitEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var (
		out     []unitEntry
		section string
		pending string
		start   int
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if pending == "" && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if pending == "" {
			start = n
		}
		if strings.HasSuffix(line, `\`) {
			pending += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		line, pending = pending+line, ""
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: %q is not Key=Value", path, start, line)
		}
		out = append(out, unitEntry{section: section, key: strings.TrimSpace(k), value: strings.TrimSpace(v), line: start})
	}
	return out, sc.Err()
}

func unitFiles(t *testing.T) []string {
	t.Helper()
	units, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy", "systemd", "*.service"))
	if err != nil || len(units) != 2 {
		t.Fatalf("deploy/systemd/*.service = %v, %v; want the control plane's and the data plane's", units, err)
	}
	return units
}

// execArgv splits an ExecStart= value into its argv (the units quote
// nothing), dropping systemd's prefixes (-, @, +, !, :).
func execArgv(v string) []string {
	argv := strings.Fields(v)
	if len(argv) > 0 {
		argv[0] = strings.TrimLeft(argv[0], "-@+!:")
	}
	return argv
}

// TestSystemdSandboxing checks what the issue asks of every unit: its own
// user, a read-only system with a state directory, no new privileges.
func TestSystemdSandboxing(t *testing.T) {
	for _, path := range unitFiles(t) {
		entries, err := parseUnit(path)
		if err != nil {
			t.Fatal(err)
		}
		get := func(key string) []string {
			var vs []string
			for _, e := range entries {
				if e.section == "Service" && e.key == key {
					vs = append(vs, e.value)
				}
			}
			return vs
		}
		name := filepath.Base(path)
		want := map[string]string{
			"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
			"PrivateDevices": "yes", "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "", "Restart": "on-failure",
		}
		for k, v := range want {
			if got := get(k); !slices.Equal(got, []string{v}) {
				t.Errorf("%s: %s = %q, want %q", name, k, got, v)
			}
		}
		if dyn, user := get("DynamicUser"), get("User"); !slices.Equal(dyn, []string{"yes"}) && (len(user) != 1 || user[0] == "root" || user[0] == "0") {
			t.Errorf("%s: neither DynamicUser=yes nor a dedicated User= (DynamicUser %q, User %q)", name, dyn, user)
		}
		if len(get("StateDirectory")) != 1 {
			t.Errorf("%s: no StateDirectory=", name)
		}
		// Tokens reach the service as credentials, never in its environment.
		for _, e := range get("Environment") {
			if strings.Contains(strings.ToUpper(e), "TOKEN=") {
				t.Errorf("%s: a token in Environment=%s; use LoadCredential=", name, e)
			}
		}
		exec := get("ExecStart")
		if len(exec) != 1 {
			t.Fatalf("%s: ExecStart = %q, want one", name, exec)
		}
		argv := execArgv(exec[0])
		if want := strings.TrimSuffix(name, ".service"); argv[0] != "/usr/local/bin/"+want {
			t.Errorf("%s: ExecStart runs %s, want /usr/local/bin/%s", name, argv[0], want)
		}
	}
}

// TestSystemdAnalyzeVerify runs systemd-analyze verify on each unit, with
// ExecStart pointed at the binary built from this tree (verify wants an
// executable there), and systemd-analyze security for the sandbox's
// exposure. Any output of verify is a finding: it reports unknown keys as
// warnings and still exits 0.
func TestSystemdAnalyzeVerify(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("systemd-analyze is not installed (Debian package systemd); CI must verify the units")
		}
		t.Skip("systemd-analyze is not installed (Debian package systemd): units not verified")
	}
	bins := binaries(t)
	dir := t.TempDir()
	for _, path := range unitFiles(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(path)
		bin := strings.TrimSuffix(name, ".service")
		text := strings.Replace(string(b), "/usr/local/bin/"+bin, filepath.Join(bins, bin), 1)
		unit := filepath.Join(dir, name)
		if err := os.WriteFile(unit, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", "--man=no", unit).CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatal(err)
		}
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", name, err, out)
		}
		// systemd's own exposure score of the sandbox, 0 (locked down) to
		// 10: both units score 1.5 ("OK"); fail above 2.0.
		out, err = exec.Command(sa, "security", "--offline=yes", "--threshold=20", "--no-pager", unit).CombinedOutput()
		if err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			t.Errorf("systemd-analyze security %s: %v; the sandbox is looser than exposure 2.0:\n%s", name, err, lines[len(lines)-1])
		}
	}
}
