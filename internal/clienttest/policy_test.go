package clienttest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// outcomeTB records how a helper ended a test: "fatal", "skip" or ""
// (returned normally), with the message. Fatal and Skip stop the calling
// goroutine as testing.T does.
type outcomeTB struct {
	testing.TB
	name string
	kind string
	msg  string
}

func (o *outcomeTB) Name() string { return o.name }
func (o *outcomeTB) Fatal(args ...any) {
	o.kind, o.msg = "fatal", fmt.Sprint(args...)
	runtime.Goexit()
}
func (o *outcomeTB) Fatalf(format string, args ...any) {
	o.kind, o.msg = "fatal", fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (o *outcomeTB) Skip(args ...any) {
	o.kind, o.msg = "skip", fmt.Sprint(args...)
	runtime.Goexit()
}
func (o *outcomeTB) Skipf(format string, args ...any) {
	o.kind, o.msg = "skip", fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// outcome runs fn with an outcomeTB named name in its own goroutine.
func outcome(t *testing.T, name string, fn func(tb testing.TB) string) (kind, msg, bin string) {
	t.Helper()
	o := &outcomeTB{TB: t, name: name}
	done := make(chan struct{})
	go func() {
		defer close(done)
		bin = fn(o)
	}()
	<-done
	return o.kind, o.msg, bin
}

func TestRequirement(t *testing.T) {
	tests := []struct {
		env     map[string]string
		want    string
		wantErr string
	}{
		{env: nil, want: ""},
		{env: map[string]string{"CI": "true"}, want: "CI=true"},
		{env: map[string]string{"CI": "1"}, want: "CI=1"},
		{env: map[string]string{"CI": "yes"}, want: "CI=yes"},
		{env: map[string]string{"CI": "false"}, want: ""},
		{env: map[string]string{"CI": "0"}, want: ""},
		{env: map[string]string{"CI": ""}, want: ""},
		{env: map[string]string{"CLODEX_REQUIRE_CLIENTS": "1"}, want: "CLODEX_REQUIRE_CLIENTS=1"},
		{env: map[string]string{"CLODEX_REQUIRE_CLIENTS": "0"}, want: ""},
		// CI cannot be turned off: a CI run never skips.
		{env: map[string]string{"CLODEX_REQUIRE_CLIENTS": "0", "CI": "true"}, want: "CI=true"},
		{env: map[string]string{"CLODEX_REQUIRE_CLIENTS": "sometimes"}, wantErr: `CLODEX_REQUIRE_CLIENTS="sometimes" is not a boolean; want 1`},
	}
	for _, tt := range tests {
		got, err := requirement(envLookup(tt.env))
		switch {
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("requirement(%v) error = %v, want one containing %q", tt.env, err, tt.wantErr)
		case tt.wantErr == "" && err != nil:
			t.Errorf("requirement(%v) error = %v, want nil", tt.env, err)
		case got != tt.want:
			t.Errorf("requirement(%v) = %q, want %q", tt.env, got, tt.want)
		}
	}
}

func envLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// fakeClock is a settable clock for the installer.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestMarkerIsTrustedForABoundedTime(t *testing.T) {
	f := newFakeInstaller(t, "unreachable")
	clk := &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	f.in.now = clk.now

	// The first install probes and records the failure.
	if _, err := f.in.install(t.Context(), fakeClient); !errors.Is(err, ErrRegistryUnreachable) {
		t.Fatalf("install() error = %v, want ErrRegistryUnreachable", err)
	}
	b, err := os.ReadFile(filepath.Join(f.in.cache, ".registry-unreachable"))
	if err != nil {
		t.Fatalf("no marker after an unreachable registry: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 2 || lines[0] != strconv.FormatInt(clk.t.Unix(), 10) || !strings.Contains(lines[1], "ENOTFOUND") {
		t.Errorf("marker = %q, want the probe's Unix time %d and a reason mentioning ENOTFOUND", b, clk.t.Unix())
	}

	// Within ten minutes nobody asks npm again.
	clk.t = clk.t.Add(10 * time.Minute)
	_, err = f.in.install(t.Context(), fakeClient)
	if !errors.Is(err, ErrRegistryUnreachable) || !strings.Contains(err.Error(), "recorded at 2026-03-01T12:00:00Z") ||
		!strings.Contains(err.Error(), "ENOTFOUND") {
		t.Errorf("install() within the bound = %v, want ErrRegistryUnreachable recorded at 2026-03-01T12:00:00Z with the reason", err)
	}
	if n := f.calls(t, "view"); n != 1 {
		t.Errorf("npm view ran %d times, want 1 (the marker is trusted for ten minutes)", n)
	}

	// After that the registry is probed again: it is back, the client is
	// installed and the marker is gone.
	clk.t = clk.t.Add(time.Second)
	f.in.env = append(f.in.env, "FAKE_NPM_MODE=ok")
	bin, err := f.in.install(t.Context(), fakeClient)
	if err != nil {
		t.Fatalf("install() after the bound = %v, want the client installed", err)
	}
	if got := versionOutput(t, bin); got != "9.9.9 (Fake Client)" {
		t.Errorf("installed client --version = %q", got)
	}
	if n := f.calls(t, "view"); n != 2 {
		t.Errorf("npm view ran %d times, want 2 (the stale marker must not be trusted)", n)
	}
	if _, err := os.Stat(filepath.Join(f.in.cache, ".registry-unreachable")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("marker still there after a successful probe (stat error %v)", err)
	}
}

func TestMarkerFromTheFutureIsIgnored(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.in.now = func() time.Time { return now }
	if err := os.MkdirAll(f.in.cache, 0o755); err != nil {
		t.Fatal(err)
	}
	future := fmt.Sprintf("%d\nnpm view: ENOTFOUND\n", now.Add(time.Hour).Unix())
	if err := os.WriteFile(filepath.Join(f.in.cache, ".registry-unreachable"), []byte(future), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.in.install(t.Context(), fakeClient); err != nil {
		t.Errorf("install() with a marker dated an hour ahead = %v, want the registry probed and the client installed", err)
	}
}

func TestMalformedMarkerIsIgnored(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	if err := os.MkdirAll(f.in.cache, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.in.cache, ".registry-unreachable"), []byte("yesterday\nENOTFOUND\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.in.install(t.Context(), fakeClient); err != nil {
		t.Errorf("install() with a malformed marker = %v, want the registry probed and the client installed", err)
	}
}

func TestEnsureSkipsOnceOutsideCI(t *testing.T) {
	f := newFakeInstaller(t, "unreachable")
	var s clientSet
	env := envLookup(nil)

	kind, msg, _ := outcome(t, "TestFirst", func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, env) })
	if kind != "skip" {
		t.Fatalf("first ensure() ended with %q %q, want a skip", kind, msg)
	}
	for _, want := range []string{"Fake Client 9.9.9", "@fake/pkg@9.9.9", f.in.cache, "npm registry unreachable", "ENOTFOUND",
		"fix: make the npm registry reachable", "scripts/install-clients.sh", "with CI=true or CLODEX_REQUIRE_CLIENTS=1 this fails"} {
		if !strings.Contains(msg, want) {
			t.Errorf("first skip %q does not mention %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("first skip is not one line: %q", msg)
	}

	kind, msg, _ = outcome(t, "TestSecond", func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, env) })
	want := "skipping: Fake Client 9.9.9 is unavailable (npm registry unreachable); the skip of TestFirst says why"
	if kind != "skip" || msg != want {
		t.Errorf("second ensure() = %q %q, want skip %q", kind, msg, want)
	}
	if n := f.calls(t, "view"); n != 1 {
		t.Errorf("npm view ran %d times for two tests, want 1", n)
	}
}

func TestEnsureFailsUnderCI(t *testing.T) {
	for _, env := range []map[string]string{{"CI": "true"}, {"CLODEX_REQUIRE_CLIENTS": "1"}} {
		t.Run(fmt.Sprint(env), func(t *testing.T) {
			f := newFakeInstaller(t, "unreachable")
			var s clientSet
			for i, name := range []string{"TestFirst", "TestSecond"} {
				kind, msg, _ := outcome(t, name, func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, envLookup(env)) })
				if kind != "fatal" {
					t.Fatalf("ensure() #%d ended with %q %q, want a failure", i+1, kind, msg)
				}
				for _, want := range []string{"clienttest: Fake Client 9.9.9 (npm @fake/pkg@9.9.9) is not installed in " + f.in.cache,
					"npm registry unreachable", "ENOTFOUND", "fix: make the npm registry reachable", "the real clients are required"} {
					if !strings.Contains(msg, want) {
						t.Errorf("failure #%d %q does not mention %q", i+1, msg, want)
					}
				}
				if strings.Contains(msg, "\n") {
					t.Errorf("failure #%d is not one line: %q", i+1, msg)
				}
			}
			if n := f.calls(t, "view"); n != 1 {
				t.Errorf("npm view ran %d times for two tests, want 1", n)
			}
		})
	}
}

func TestEnsureFailsOnOtherProblems(t *testing.T) {
	tests := []struct {
		mode string
		npm  string // replaces the fake npm when set
		want []string
	}{
		{mode: "unknown", want: []string{"E404", "fix: run scripts/install-clients.sh to see npm's whole output"}},
		{mode: "installfail", want: []string{"node install.cjs", "fix: run scripts/install-clients.sh"}},
		{mode: "ok", npm: "/nonexistent/npm", want: []string{"/nonexistent/npm"}},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			f := newFakeInstaller(t, tt.mode)
			if tt.npm != "" {
				f.in.npm = tt.npm
			}
			var s clientSet
			kind, msg, _ := outcome(t, t.Name(), func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, envLookup(nil)) })
			if kind != "fatal" {
				t.Fatalf("ensure() ended with %q %q, want a failure even outside CI", kind, msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("failure %q does not mention %q", msg, w)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("failure is not one line: %q", msg)
			}
		})
	}
}

func TestEnsureMissingNPM(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	f.in.npm = ""
	t.Setenv("PATH", t.TempDir()) // no npm anywhere
	var s clientSet
	kind, msg, _ := outcome(t, t.Name(), func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, envLookup(nil)) })
	if kind != "fatal" || !strings.Contains(msg, "npm not found in PATH") || !strings.Contains(msg, "fix: install Node.js 20 with npm") {
		t.Errorf("ensure() without npm = %q %q, want a failure saying npm is missing and how to get it", kind, msg)
	}
}

func TestEnsureRemembersTheExecutable(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	var s clientSet
	want := filepath.Join(f.in.cache, "fake-9.9.9", "node_modules", ".bin", "fake")
	for i := range 2 {
		kind, msg, bin := outcome(t, t.Name(), func(tb testing.TB) string { return s.ensure(tb, fakeClient, f.in, envLookup(nil)) })
		if kind != "" || bin != want {
			t.Errorf("ensure() #%d = %q (%s %s), want %q", i+1, bin, kind, msg, want)
		}
	}
	if n := f.calls(t, "view"); n != 1 {
		t.Errorf("npm view ran %d times, want 1", n)
	}
}

func TestEnsureBadRequirement(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	var s clientSet
	kind, msg, _ := outcome(t, t.Name(), func(tb testing.TB) string {
		return s.ensure(tb, fakeClient, f.in, envLookup(map[string]string{"CLODEX_REQUIRE_CLIENTS": "maybe"}))
	})
	if kind != "fatal" || !strings.Contains(msg, `CLODEX_REQUIRE_CLIENTS="maybe" is not a boolean`) {
		t.Errorf("ensure() = %q %q, want a failure naming CLODEX_REQUIRE_CLIENTS", kind, msg)
	}
	if n := f.calls(t, "view"); n != 0 {
		t.Errorf("npm view ran %d times, want 0", n)
	}
}

// unreachableRegistryEnv is the environment of a real npm whose registry is
// a closed port on 127.0.0.1, with an empty cache of its own and no
// retries, so it fails at once with ECONNREFUSED.
func unreachableRegistryEnv(t *testing.T) []string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(strings.ToLower(k), "npm_config_") || k == "CI" || k == "CLODEX_REQUIRE_CLIENTS" || k == "CLODEX_CLIENT_CACHE" {
			continue
		}
		env = append(env, kv)
	}
	return append(env,
		"npm_config_registry=http://"+addr+"/",
		"npm_config_cache="+t.TempDir(),
		"npm_config_fetch_retries=0",
		"npm_config_offline=false",
	)
}

func realNPM(t *testing.T) string {
	t.Helper()
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("npm is not in PATH; the real-client tests need Node.js 20 with npm: %v", err)
	}
	return npm
}

// The real npm against a registry that refuses connections: the installer
// reports ErrRegistryUnreachable, records it, and the next install trusts
// the record without running npm.
func TestRealNPMUnreachableRegistry(t *testing.T) {
	in := installer{cache: filepath.Join(t.TempDir(), "cache"), npm: realNPM(t), env: unreachableRegistryEnv(t)}
	_, err := in.install(t.Context(), claudeCodeClient)
	if !errors.Is(err, ErrRegistryUnreachable) || !strings.Contains(err.Error(), "ECONNREFUSED") {
		t.Fatalf("install() against a closed registry port = %v, want ErrRegistryUnreachable (ECONNREFUSED)", err)
	}
	in.npm = "/nonexistent/npm" // would fail differently if npm were run again
	_, err = in.install(t.Context(), claudeCodeClient)
	if !errors.Is(err, ErrRegistryUnreachable) || !strings.Contains(err.Error(), "recorded at") {
		t.Errorf("second install() = %v, want the recorded ErrRegistryUnreachable", err)
	}
}

// scriptPath is scripts/install-clients.sh of this repository.
func scriptPath(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs("../../scripts/install-clients.sh")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// scripts/install-clients.sh against an unreachable registry: outside CI it
// reports the problem, exits 0 and records it for the tests; under CI it
// exits 1 with one line per missing client saying why and how to fix it.
func TestInstallScriptUnreachableRegistry(t *testing.T) {
	realNPM(t)
	tests := []struct {
		name     string
		env      []string
		wantExit int
		want     []string
	}{
		{name: "outside CI", wantExit: 0, want: []string{
			"install-clients: Claude Code 2.1.332 (npm @anthropic-ai/claude-code@2.1.332) is not installed in",
			"the npm registry is unreachable", "ECONNREFUSED", "the tests that need it will skip (with CI=true they fail)",
			"install-clients: Codex CLI 0.171.0 (npm @openai/codex@0.171.0) is not installed in",
			"install-clients: opencode 1.18.33 (npm opencode-ai@1.18.33) is not installed in",
			"install-clients: the client libraries (npm ai@7.0.173 and the rest of ",
		}},
		{name: "CI", env: []string{"CI=true"}, wantExit: 1, want: []string{
			"install-clients: Claude Code 2.1.332 (npm @anthropic-ai/claude-code@2.1.332) is not installed in",
			"fix: make the npm registry reachable", "[CI=true: required]",
			"install-clients: Codex CLI 0.171.0 (npm @openai/codex@0.171.0) is not installed in",
		}},
		{name: "CLODEX_REQUIRE_CLIENTS", env: []string{"CLODEX_REQUIRE_CLIENTS=1"}, wantExit: 1, want: []string{
			"[CLODEX_REQUIRE_CLIENTS=1: required]",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			cmd := exec.CommandContext(t.Context(), "bash", scriptPath(t))
			cmd.Env = append(unreachableRegistryEnv(t), append([]string{"CLODEX_CLIENT_CACHE=" + cache}, tt.env...)...)
			before := time.Now().Unix()
			out, err := cmd.CombinedOutput()
			after := time.Now().Unix()
			if code := cmd.ProcessState.ExitCode(); code != tt.wantExit {
				t.Fatalf("install-clients.sh exit %d (%v), want %d; output:\n%s", code, err, tt.wantExit, out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("install-clients.sh output does not mention %q:\n%s", w, out)
				}
			}
			// One line per missing client, and one probe per run: the
			// other clients reuse the first one's answer.
			for _, prefix := range []string{"install-clients: Claude Code 2.1.332 ", "install-clients: Codex CLI 0.171.0 ",
				"install-clients: opencode 1.18.33 ", "install-clients: the client libraries "} {
				if n := strings.Count(string(out), prefix); n != 1 {
					t.Errorf("output has %d lines starting %q, want 1:\n%s", n, prefix, out)
				}
			}
			if n := strings.Count(string(out), "npm view @anthropic-ai/claude-code@2.1.332: request to http://127.0.0.1:"); n != 4 {
				t.Errorf("output quotes the Claude Code probe's failed request %d times, want 4 (every client reports the one probe):\n%s", n, out)
			}

			b, err := os.ReadFile(filepath.Join(cache, ".registry-unreachable"))
			if err != nil {
				t.Fatalf("the script left no marker: %v", err)
			}
			first, _, _ := strings.Cut(string(b), "\n")
			at, err := strconv.ParseInt(first, 10, 64)
			if err != nil || at < before || at > after {
				t.Errorf("marker time %q, want a Unix time in [%d, %d]", first, before, after)
			}
			// The Go side trusts what the script recorded: no npm is run.
			in := installer{cache: cache, npm: "/nonexistent/npm"}
			if _, err := in.install(t.Context(), claudeCodeClient); !errors.Is(err, ErrRegistryUnreachable) || !strings.Contains(err.Error(), "ECONNREFUSED") {
				t.Errorf("install() after the script = %v, want the script's recorded ErrRegistryUnreachable (ECONNREFUSED)", err)
			}
		})
	}
}

func TestTool(t *testing.T) {
	kind, msg, path := outcome(t, t.Name(), func(tb testing.TB) string { return tool(tb, "sh", "install a shell", envLookup(nil)) })
	if kind != "" || !filepath.IsAbs(path) {
		t.Errorf("tool(sh) = %q (%s %s), want an absolute path", path, kind, msg)
	}
	const missing = "clodex-no-such-tool"
	kind, msg, _ = outcome(t, t.Name(), func(tb testing.TB) string { return tool(tb, missing, "apt-get install it", envLookup(nil)) })
	want := "skipping: clodex-no-such-tool is not installed (not found in PATH); fix: apt-get install it (with CI=true or CLODEX_REQUIRE_CLIENTS=1 this fails)"
	if kind != "skip" || msg != want {
		t.Errorf("tool(missing) outside CI = %s %q, want skip %q", kind, msg, want)
	}
	kind, msg, _ = outcome(t, t.Name(), func(tb testing.TB) string {
		return tool(tb, missing, "apt-get install it", envLookup(map[string]string{"CI": "true"}))
	})
	if kind != "fatal" || !strings.Contains(msg, "clodex-no-such-tool is not installed") || !strings.Contains(msg, "[CI=true: required") {
		t.Errorf("tool(missing) under CI = %s %q, want a failure naming the tool and CI=true", kind, msg)
	}
}
