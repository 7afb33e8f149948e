package clienttest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/filelock"
)

// Pinned client versions. A plain `npm install` of Claude Code resolves an
// older version on these machines, so installs always name the exact version.
const (
	ClaudeCodeVersion = "2.1.332"
	CodexCLIVersion   = "0.171.0"
)

// ErrRegistryUnreachable reports that a client is not in the cache and the npm
// registry cannot be reached to install it.
var ErrRegistryUnreachable = errors.New("npm registry unreachable")

const (
	probeTimeout   = 60 * time.Second
	installTimeout = 15 * time.Minute
	versionTimeout = 60 * time.Second
)

// client is one pinned npm client.
type client struct {
	name    string // cache folder prefix
	pkg     string // npm package name
	version string // exact version
	bin     string // executable name in node_modules/.bin
}

var (
	claudeCodeClient = client{name: "claude-code", pkg: "@anthropic-ai/claude-code", version: ClaudeCodeVersion, bin: "claude"}
	codexCLIClient   = client{name: "codex", pkg: "@openai/codex", version: CodexCLIVersion, bin: "codex"}
)

func (c client) spec() string { return c.pkg + "@" + c.version }

// CacheDir returns the folder the clients are cached in:
// $CLODEX_CLIENT_CACHE, or $HOME/.cache/clodex/clients.
func CacheDir() (string, error) {
	if d := os.Getenv("CLODEX_CLIENT_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("client cache dir: set CLODEX_CLIENT_CACHE or HOME: %w", err)
	}
	return filepath.Join(home, ".cache", "clodex", "clients"), nil
}

// ClaudeCode returns the absolute path of the pinned Claude Code executable,
// installing it into the cache first if needed. It skips t only when the
// client is not cached and the npm registry cannot be reached; any other
// problem fails t.
func ClaudeCode(t testing.TB) string {
	t.Helper()
	return ensure(t, claudeCodeClient)
}

// CodexCLI returns the absolute path of the pinned Codex CLI executable,
// installing it into the cache first if needed. It skips t only when the
// client is not cached and the npm registry cannot be reached; any other
// problem fails t.
func CodexCLI(t testing.TB) string {
	t.Helper()
	return ensure(t, codexCLIClient)
}

var (
	installedMu sync.Mutex
	installed   = map[string]string{} // cache dir + client name -> verified executable
)

func ensure(t testing.TB, c client) string {
	t.Helper()
	cache, err := CacheDir()
	if err != nil {
		t.Fatalf("%s: %v", c.spec(), err)
	}
	key := cache + "\x00" + c.name
	installedMu.Lock()
	defer installedMu.Unlock()
	if bin, ok := installed[key]; ok {
		return bin
	}
	ctx, cancel := context.WithTimeout(t.Context(), installTimeout)
	defer cancel()
	in := installer{cache: cache}
	bin, err := in.install(ctx, c)
	switch {
	case errors.Is(err, ErrRegistryUnreachable):
		t.Skipf("skipping: %s is not installed in %s and the npm registry cannot be reached (%v); run scripts/install-clients.sh once the registry is reachable", c.spec(), cache, err)
	case err != nil:
		t.Fatalf("install %s: %v", c.spec(), err)
	}
	installed[key] = bin
	return bin
}

// installer installs clients into cache with npm.
type installer struct {
	cache string
	npm   string   // npm executable; "" = look up "npm" in PATH when an install is needed
	env   []string // environment for npm; nil = os.Environ()
	// probeTimeout bounds `npm view`; 0 = probeTimeout.
	probeTimeout time.Duration
}

// binPath is where c's executable lives once installed in dir.
func (c client) binPath(dir string) string {
	return filepath.Join(dir, "node_modules", ".bin", c.bin)
}

func (in installer) dir(c client) string {
	return filepath.Join(in.cache, c.name+"-"+c.version)
}

// install makes sure c is in the cache and returns its executable. It returns
// an error wrapping ErrRegistryUnreachable when c must be installed and the
// registry cannot be reached.
func (in installer) install(ctx context.Context, c client) (string, error) {
	dir := in.dir(c)
	bin := c.binPath(dir)
	// Fast path without the lock: the folder only ever appears by rename,
	// complete and verified.
	if verifyVersion(ctx, bin, c.version) == nil {
		return bin, nil
	}
	if err := os.MkdirAll(in.cache, 0o755); err != nil {
		return "", fmt.Errorf("create client cache: %w", err)
	}
	lock, err := filelock.Acquire(ctx, filepath.Join(in.cache, ".install.lock"))
	if err != nil {
		return "", err
	}
	defer lock.Close()
	// Another process may have installed it while we waited for the lock.
	if verifyVersion(ctx, bin, c.version) == nil {
		return bin, nil
	}
	npm := in.npm
	if npm == "" {
		npm, err = exec.LookPath("npm")
		if err != nil {
			return "", fmt.Errorf("npm not found in PATH (install Node.js and npm): %w", err)
		}
	}
	if err := in.probe(ctx, npm, c); err != nil {
		return "", err
	}
	// Leftovers of installs that were killed half-way; nobody else can be
	// using them while we hold the lock.
	stale, _ := filepath.Glob(filepath.Join(in.cache, ".tmp-*"))
	for _, s := range stale {
		_ = os.RemoveAll(s)
	}
	tmp, err := os.MkdirTemp(in.cache, ".tmp-"+c.name+"-"+c.version+".")
	if err != nil {
		return "", fmt.Errorf("create install dir: %w", err)
	}
	defer os.RemoveAll(tmp) // no-op after the rename
	// What `npm init -y` writes, minus the name it would derive from the
	// folder (a dot-folder name is not a valid package name).
	pkgJSON := []byte(`{"name":"clodex-client-cache","version":"1.0.0","private":true}` + "\n")
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), pkgJSON, 0o644); err != nil {
		return "", fmt.Errorf("write package.json: %w", err)
	}
	out, err := in.npmCmd(ctx, npm, tmp, "install", "--no-audit", "--no-fund", "--loglevel=error", c.spec())
	if err != nil {
		if ctx.Err() == nil && isNetworkError(out) {
			return "", fmt.Errorf("npm install %s: %w: %s", c.spec(), ErrRegistryUnreachable, firstLines(out, 5))
		}
		return "", fmt.Errorf("npm install %s: %w: %s", c.spec(), err, firstLines(out, 20))
	}
	if err := verifyVersion(ctx, c.binPath(tmp), c.version); err != nil {
		return "", fmt.Errorf("check installed %s: %w", c.spec(), err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { // MkdirTemp makes it 0700
		return "", fmt.Errorf("chmod install dir: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("remove broken install: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("move install into place: %w", err)
	}
	if err := verifyVersion(ctx, bin, c.version); err != nil {
		return "", fmt.Errorf("check installed %s: %w", c.spec(), err)
	}
	return bin, nil
}

// probe asks the registry for c's version. It returns an error wrapping
// ErrRegistryUnreachable for network errors and time-outs, and another error
// when the registry answers but does not know the version.
func (in installer) probe(ctx context.Context, npm string, c client) error {
	limit := in.probeTimeout
	if limit <= 0 {
		limit = probeTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	out, err := in.npmCmd(pctx, npm, in.cache, "view", c.spec(), "version")
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("npm view %s: %w", c.spec(), ctx.Err())
	case err != nil && pctx.Err() != nil:
		return fmt.Errorf("npm view %s: %w: no answer within %v", c.spec(), ErrRegistryUnreachable, limit)
	case err != nil && isNetworkError(out):
		return fmt.Errorf("npm view %s: %w: %s", c.spec(), ErrRegistryUnreachable, firstLines(out, 5))
	case err != nil:
		return fmt.Errorf("npm view %s: %w: %s", c.spec(), err, firstLines(out, 10))
	case !strings.Contains(out, c.version):
		return fmt.Errorf("npm view %s: the registry does not list this version (answer %q)", c.spec(), firstLines(out, 3))
	}
	return nil
}

// npmCmd runs npm in dir and returns its combined output.
func (in installer) npmCmd(ctx context.Context, npm, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, npm, args...)
	cmd.Dir = dir
	env := in.env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(env[:len(env):len(env)], "npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
	cmd.WaitDelay = 5 * time.Second
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	return buf.String(), err
}

// networkErrorMarkers are what npm prints when it cannot talk to the registry.
var networkErrorMarkers = []string{
	"ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET",
	"ENETUNREACH", "EHOSTUNREACH", "ENETDOWN", "ESOCKETTIMEDOUT",
	"socket hang up", "network request to", "code ERR_SOCKET_TIMEOUT",
}

// isNetworkError reports whether npm output shows that the registry could not
// be reached (as opposed to, say, an unknown package or a failing script).
func isNetworkError(out string) bool {
	for _, m := range networkErrorMarkers {
		if strings.Contains(out, m) {
			return true
		}
	}
	return false
}

// verifyVersion runs `bin --version` with an environment built from scratch
// and checks that it prints version.
func verifyVersion(ctx context.Context, bin, version string) error {
	if _, err := os.Stat(bin); err != nil {
		return err
	}
	home, err := os.MkdirTemp("", "clienttest-version-")
	if err != nil {
		return fmt.Errorf("create scratch home: %w", err)
	}
	defer os.RemoveAll(home)
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"CODEX_HOME=" + home,
		"TERM=dumb",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
	}
	cmd.Dir = home
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w: %s", bin, err, firstLines(string(out), 5))
	}
	if !strings.Contains(string(out), version) {
		return fmt.Errorf("%s --version printed %q, want version %s", bin, strings.TrimSpace(string(out)), version)
	}
	return nil
}

// firstLines returns at most n lines of s, trimmed.
func firstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], fmt.Sprintf("… (%d more lines)", len(lines)-n))
	}
	return strings.Join(lines, "\n")
}
