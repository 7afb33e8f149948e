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
	"testing"
	"time"
)

// Pinned client versions. A plain `npm install` of Claude Code resolves an
// older version on these machines, so installs always name the exact version.
const (
	ClaudeCodeVersion = "2.1.332"
	CodexCLIVersion   = "0.171.0"
	OpencodeVersion   = "1.18.33"
)

// ErrRegistryUnreachable reports that a client is not in the cache and the npm
// registry cannot be reached to install it.
var ErrRegistryUnreachable = errors.New("npm registry unreachable")

// errNoNPM reports that a client must be installed and npm is not in PATH.
var errNoNPM = errors.New("npm not found in PATH")

const (
	probeTimeout = 60 * time.Second
	// installTimeout bounds one npm install (installer.installTimeout).
	installTimeout = 15 * time.Minute
	versionTimeout = 60 * time.Second
)

// client is one pinned npm client: an executable, or a set of libraries
// (libs) that node scripts import.
type client struct {
	product string // what users call it, e.g. "Claude Code"
	name    string // cache folder prefix
	pkg     string // npm package name
	version string // exact version (of a library set: its lock file's digest)
	bin     string // executable name in node_modules/.bin
	libs    *libSet
}

var (
	claudeCodeClient = client{product: "Claude Code", name: "claude-code", pkg: "@anthropic-ai/claude-code", version: ClaudeCodeVersion, bin: "claude"}
	codexCLIClient   = client{product: "Codex CLI", name: "codex", pkg: "@openai/codex", version: CodexCLIVersion, bin: "codex"}
	opencodeClient   = client{product: "opencode", name: "opencode", pkg: "opencode-ai", version: OpencodeVersion, bin: "opencode"}
)

// spec is what npm installs: the package at its version, or a library
// set's pinned packages.
func (c client) spec() string {
	if c.libs != nil {
		return c.libs.specs()
	}
	return c.pkg + "@" + c.version
}

// probeSpec is what `npm view` asks the registry for.
func (c client) probeSpec() string {
	if c.libs != nil {
		return c.libs.pins[0].spec()
	}
	return c.spec()
}

// path is what install returns for c installed in dir: the executable, or
// a library set's node_modules folder.
func (c client) path(dir string) string {
	if c.libs != nil {
		return filepath.Join(dir, "node_modules")
	}
	return c.binPath(dir)
}

// check verifies c installed in dir: the executable's --version shows the
// pinned version, or every pinned library has its version.
func (c client) check(ctx context.Context, dir string) error {
	if c.libs != nil {
		return c.libs.check(dir)
	}
	return verifyVersion(ctx, c.binPath(dir), c.version)
}

// title is the product and version, e.g. "Claude Code 2.1.332".
func (c client) title() string { return c.product + " " + c.version }

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
// installing it into the cache first if needed. When it cannot, t fails
// with one line saying why and how to fix it; only when the npm registry
// cannot be reached and neither CI nor CLODEX_REQUIRE_CLIENTS requires the
// clients is t skipped instead. The outcome is remembered for the rest of
// the test process.
func ClaudeCode(t testing.TB) string {
	t.Helper()
	return ensure(t, claudeCodeClient)
}

// CodexCLI returns the absolute path of the pinned Codex CLI executable,
// installing it into the cache first if needed; failures are handled as in
// [ClaudeCode].
func CodexCLI(t testing.TB) string {
	t.Helper()
	return ensure(t, codexCLIClient)
}

func ensure(t testing.TB, c client) string {
	t.Helper()
	cache, err := CacheDir()
	if err != nil {
		t.Fatalf("clienttest: %s: %v", c.title(), err)
	}
	return clients.ensure(t, c, installer{cache: cache, lockTimeout: within(t, installLockTimeout), installTimeout: within(t, installTimeout)}, os.LookupEnv)
}

// installer installs clients into cache with npm.
type installer struct {
	cache string
	npm   string   // npm executable; "" = look up "npm" in PATH when an install is needed
	env   []string // environment for npm; nil = os.Environ()
	// probeTimeout bounds `npm view`; 0 = probeTimeout.
	probeTimeout time.Duration
	// now is the clock that dates and ages the registry marker; nil =
	// time.Now.
	now func() time.Time
	// lockTimeout bounds the wait for another process's install, and
	// installTimeout the npm install; 0 = installLockTimeout and
	// installTimeout.
	lockTimeout, installTimeout time.Duration
	// say gets the lines that tell what an install waits for; nil =
	// stderr.
	say func(string)
}

func (in installer) tell(msg string) {
	if in.say != nil {
		in.say(msg)
		return
	}
	sayStderr(msg)
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (in installer) clock() time.Time {
	if in.now != nil {
		return in.now()
	}
	return time.Now()
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
// registry cannot be reached, or when a fresh marker in the cache (see
// markerTTL) says an earlier probe found it so; then npm is not run at all.
// An unreachable registry writes the marker, a reachable one removes it.
func (in installer) install(ctx context.Context, c client) (string, error) {
	dir := in.dir(c)
	bin := c.path(dir)
	// Fast path without the lock: the folder only ever appears by rename,
	// complete and verified.
	if c.check(ctx, dir) == nil {
		return bin, nil
	}
	if err := os.MkdirAll(in.cache, 0o755); err != nil { //nolint:gosec // G301: the cache holds public npm packages, readable like any npm install
		return "", fmt.Errorf("create client cache: %w", err)
	}
	unlock, err := waitLock(ctx, filepath.Join(in.cache, ".install.lock"), "installing "+c.title(), orDefault(in.lockTimeout, installLockTimeout), in.tell)
	if err != nil {
		return "", err
	}
	defer unlock()
	// Another process may have installed it while we waited for the lock.
	if c.check(ctx, dir) == nil {
		return bin, nil
	}
	if m, ok := readMarker(in.cache, in.clock()); ok {
		return "", fmt.Errorf("%w: recorded at %s in %s (trusted until %s; delete the file to probe again): %s",
			ErrRegistryUnreachable, m.at.UTC().Format(time.RFC3339), filepath.Join(in.cache, markerName),
			m.at.Add(markerTTL).UTC().Format(time.RFC3339), m.reason)
	}
	npm := in.npm
	if npm == "" {
		npm, err = exec.LookPath("npm")
		if err != nil {
			return "", fmt.Errorf("%w (install Node.js and npm): %w", errNoNPM, err)
		}
	}
	if err := in.probe(ctx, npm, c); err != nil {
		if errors.Is(err, ErrRegistryUnreachable) {
			if merr := writeMarker(in.cache, in.clock(), err.Error()); merr != nil {
				return "", errors.Join(err, merr)
			}
		}
		return "", err
	}
	removeMarker(in.cache)
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
	args := []string{"install", "--no-audit", "--no-fund", "--loglevel=error", c.spec()}
	if c.libs != nil {
		// The set's own package.json and lock: npm ci installs exactly the
		// locked tree, without optional platform binaries (the Agent SDK's
		// bundled Claude Code: the tests hand it the pinned one).
		pkgJSON = c.libs.packageJSON
		if err := os.WriteFile(filepath.Join(tmp, "package-lock.json"), c.libs.lock, 0o644); err != nil { //nolint:gosec // G306: public metadata, as npm writes it
			return "", fmt.Errorf("write package-lock.json: %w", err)
		}
		args = []string{"ci", "--omit=optional", "--no-audit", "--no-fund", "--loglevel=error"}
	}
	if err := os.WriteFile(filepath.Join(tmp, "package.json"), pkgJSON, 0o644); err != nil { //nolint:gosec // G306: public metadata, as npm writes it
		return "", fmt.Errorf("write package.json: %w", err)
	}
	limit := orDefault(in.installTimeout, installTimeout)
	in.tell(fmt.Sprintf("installing %s (npm %s) into %s: up to %v, usually a minute or two", c.title(), c.spec(), dir, limit))
	start := time.Now()
	ictx, cancel := context.WithTimeoutCause(ctx, limit, errDeadline)
	out, err := in.npmCmd(ictx, npm, tmp, args...)
	cancel()
	if err != nil {
		if ctx.Err() == nil && errors.Is(context.Cause(ictx), errDeadline) {
			return "", fmt.Errorf("npm %s %s: %w: no result within %v (the install's limit); its output so far: %s",
				args[0], c.spec(), errDeadline, limit, firstLines(out, 10))
		}
		if ctx.Err() == nil && isNetworkError(out) {
			err := fmt.Errorf("npm install %s: %w: %s", c.spec(), ErrRegistryUnreachable, networkReason(out))
			if merr := writeMarker(in.cache, in.clock(), err.Error()); merr != nil {
				return "", errors.Join(err, merr)
			}
			return "", err
		}
		return "", fmt.Errorf("npm install %s: %w: %s", c.spec(), err, firstLines(out, 20))
	}
	if err := c.check(ctx, tmp); err != nil {
		return "", fmt.Errorf("check installed %s: %w", c.spec(), err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil { //nolint:gosec // G302: MkdirTemp makes it 0700; an npm install folder holds nothing private
		return "", fmt.Errorf("chmod install dir: %w", err)
	}
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("remove broken install: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("move install into place: %w", err)
	}
	if err := c.check(ctx, dir); err != nil {
		return "", fmt.Errorf("check installed %s: %w", c.spec(), err)
	}
	in.tell(fmt.Sprintf("installed %s in %v: %s", c.title(), time.Since(start).Round(time.Second), bin))
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
	spec := c.probeSpec()
	out, err := in.npmCmd(pctx, npm, in.cache, "view", spec, "version")
	switch {
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("npm view %s: %w", spec, ctx.Err())
	case err != nil && pctx.Err() != nil:
		return fmt.Errorf("npm view %s: %w: no answer within %v", spec, ErrRegistryUnreachable, limit)
	case err != nil && isNetworkError(out):
		return fmt.Errorf("npm view %s: %w: %s", spec, ErrRegistryUnreachable, networkReason(out))
	case err != nil:
		return fmt.Errorf("npm view %s: %w: %s", spec, err, firstLines(out, 10))
	case !strings.Contains(out, spec[strings.LastIndex(spec, "@")+1:]):
		return fmt.Errorf("npm view %s: the registry does not list this version (answer %q)", spec, firstLines(out, 3))
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

// networkReason is the line of npm's output that says which request failed
// and why ("request to https://registry.npmjs.org/… failed, reason:
// getaddrinfo ENOTFOUND …"), without npm's prefix; the first lines of the
// output when there is no such line.
func networkReason(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "reason:") || strings.Contains(l, "network request to") {
			l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "npm error"))
			return strings.TrimPrefix(l, "FetchError: ")
		}
	}
	return firstLines(out, 5)
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
