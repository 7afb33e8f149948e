package clienttest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeNPM is a stand-in for npm that answers `view` and `install` the way
// FAKE_NPM_MODE says and logs every call to FAKE_NPM_LOG.
const fakeNPM = `#!/bin/sh
echo "$*" >>"$FAKE_NPM_LOG"
case "$1" in
view)
	case "$FAKE_NPM_MODE" in
	unreachable)
		echo "npm error code ENOTFOUND" >&2
		echo "npm error network request to https://registry.invalid/@fake%2fpkg failed, reason: getaddrinfo ENOTFOUND registry.invalid" >&2
		exit 1 ;;
	refused)
		echo "npm error code ECONNREFUSED" >&2
		exit 1 ;;
	hang)
		exec sleep 30 ;;
	unknown)
		echo "npm error code E404" >&2
		echo "npm error 404 Not Found - GET https://registry.invalid/@fake%2fpkg - Not found" >&2
		exit 1 ;;
	noversion)
		exit 0 ;;
	*)
		echo "$FAKE_VERSION" ;;
	esac ;;
install)
	if [ "$FAKE_NPM_MODE" = installfail ]; then
		echo "npm error code 1" >&2
		echo "npm error command failed: node install.cjs" >&2
		exit 1
	fi
	mkdir -p node_modules/.bin
	printf '#!/bin/sh\necho "%s (Fake Client)"\n' "$FAKE_VERSION" >"node_modules/.bin/$FAKE_BIN"
	chmod +x "node_modules/.bin/$FAKE_BIN" ;;
*)
	echo "fake npm: unexpected command $1" >&2
	exit 2 ;;
esac
`

var fakeClient = client{product: "Fake Client", name: "fake", pkg: "@fake/pkg", version: "9.9.9", bin: "fake"}

type fakeEnv struct {
	in  installer
	log string
}

func newFakeInstaller(t *testing.T, mode string) fakeEnv {
	t.Helper()
	dir := t.TempDir()
	npm := filepath.Join(dir, "npm")
	if err := os.WriteFile(npm, []byte(fakeNPM), 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "npm.log")
	return fakeEnv{
		in: installer{
			cache: filepath.Join(dir, "cache"),
			npm:   npm,
			env: []string{
				"PATH=" + os.Getenv("PATH"),
				"FAKE_NPM_LOG=" + log,
				"FAKE_NPM_MODE=" + mode,
				"FAKE_VERSION=" + fakeClient.version,
				"FAKE_BIN=" + fakeClient.bin,
			},
			probeTimeout: 2 * time.Second,
		},
		log: log,
	}
}

// calls returns how many npm calls started with verb.
func (f fakeEnv) calls(t *testing.T, verb string) int {
	t.Helper()
	b, err := os.ReadFile(f.log)
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, verb+" ") {
			n++
		}
	}
	return n
}

func versionOutput(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", bin, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestInstallProbeFailures(t *testing.T) {
	tests := []struct {
		mode            string
		wantUnreachable bool
		wantErrContains string
	}{
		{mode: "unreachable", wantUnreachable: true, wantErrContains: "ENOTFOUND"},
		{mode: "refused", wantUnreachable: true, wantErrContains: "ECONNREFUSED"},
		{mode: "hang", wantUnreachable: true, wantErrContains: "no answer within 2s"},
		{mode: "unknown", wantUnreachable: false, wantErrContains: "E404"},
		{mode: "noversion", wantUnreachable: false, wantErrContains: "does not list this version"},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			f := newFakeInstaller(t, tt.mode)
			bin, err := f.in.install(t.Context(), fakeClient)
			if err == nil {
				t.Fatalf("install() = %q, nil; want an error", bin)
			}
			if got := errors.Is(err, ErrRegistryUnreachable); got != tt.wantUnreachable {
				t.Errorf("install() error %q: errors.Is(ErrRegistryUnreachable) = %v, want %v", err, got, tt.wantUnreachable)
			}
			if !strings.Contains(err.Error(), tt.wantErrContains) {
				t.Errorf("install() error %q does not contain %q", err, tt.wantErrContains)
			}
			if n := f.calls(t, "install"); n != 0 {
				t.Errorf("npm install ran %d times after a failed probe, want 0", n)
			}
		})
	}
}

func TestInstallFailureLeavesNothing(t *testing.T) {
	f := newFakeInstaller(t, "installfail")
	_, err := f.in.install(t.Context(), fakeClient)
	if err == nil || errors.Is(err, ErrRegistryUnreachable) {
		t.Fatalf("install() error = %v, want a non-registry install error", err)
	}
	if !strings.Contains(err.Error(), "node install.cjs") {
		t.Errorf("install() error %q does not show npm's output", err)
	}
	entries, err := os.ReadDir(f.in.cache)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != ".install.lock" {
			t.Errorf("cache holds %q after a failed install, want only .install.lock", e.Name())
		}
	}
}

func TestInstallIsIdempotentAndConcurrencySafe(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	// Leftover of an install that was killed half-way.
	stale := filepath.Join(f.in.cache, ".tmp-fake-9.9.9.123456")
	if err := os.MkdirAll(stale, 0o755); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(f.in.cache, "fake-9.9.9", "node_modules", ".bin", "fake")

	const n = 4
	var wg sync.WaitGroup
	bins := make([]string, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { bins[i], errs[i] = f.in.install(t.Context(), fakeClient) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || bins[i] != want {
			t.Errorf("install() #%d = %q, %v; want %q, nil", i, bins[i], errs[i], want)
		}
	}
	if got := f.calls(t, "install"); got != 1 {
		t.Errorf("npm install ran %d times for %d concurrent installs, want 1", got, n)
	}
	if got := versionOutput(t, want); got != "9.9.9 (Fake Client)" {
		t.Errorf("installed client --version = %q, want %q", got, "9.9.9 (Fake Client)")
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale temp install %s still there (stat error %v)", stale, err)
	}

	// Once installed, neither the registry nor npm install is asked again.
	views := f.calls(t, "view")
	if bin, err := f.in.install(t.Context(), fakeClient); err != nil || bin != want {
		t.Fatalf("second install() = %q, %v; want %q, nil", bin, err, want)
	}
	if got := f.calls(t, "view") + f.calls(t, "install"); got != views+1 {
		t.Errorf("second install() ran npm %d more times, want 0", got-views-1)
	}
}

func TestInstallReplacesWrongVersion(t *testing.T) {
	f := newFakeInstaller(t, "ok")
	binDir := filepath.Join(f.in.cache, "fake-9.9.9", "node_modules", ".bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(binDir, "fake"), []byte("#!/bin/sh\necho 1.0.0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := f.in.install(t.Context(), fakeClient)
	if err != nil {
		t.Fatalf("install() error = %v", err)
	}
	if got := versionOutput(t, bin); got != "9.9.9 (Fake Client)" {
		t.Errorf("client --version after reinstall = %q, want %q", got, "9.9.9 (Fake Client)")
	}
	if got := f.calls(t, "install"); got != 1 {
		t.Errorf("npm install ran %d times, want 1", got)
	}
}

func TestIsNetworkError(t *testing.T) {
	tests := []struct {
		out  string
		want bool
	}{
		{"npm error code ENOTFOUND\nnpm error network request to https://registry.npmjs.org/x failed", true},
		{"npm error code EAI_AGAIN", true},
		{"npm error code ETIMEDOUT", true},
		{"npm error code ECONNRESET", true},
		{"npm error network socket hang up", true},
		{"npm error code E404\nnpm error 404 Not Found", false},
		{"npm error code ETARGET\nnpm error notarget No matching version found for x@9.9.9.", false},
		{"npm error code EACCES\nnpm error syscall mkdir", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := isNetworkError(tt.out); got != tt.want {
			t.Errorf("isNetworkError(%q) = %v, want %v", tt.out, got, tt.want)
		}
	}
}
