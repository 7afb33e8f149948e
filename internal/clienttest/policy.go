package clienttest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/clodex/clodex/internal/atomicfile"
)

// Environment variables that decide whether a missing client fails or
// skips a test.
const (
	// EnvCI is set to true by CI systems; real clients are then required.
	EnvCI = "CI"
	// EnvRequireClients=1 requires the real clients outside CI too.
	EnvRequireClients = "CLODEX_REQUIRE_CLIENTS"
)

// markerName is the file in the client cache that records that the npm
// registry could not be reached, so the test processes of one run do not
// each probe it again. scripts/install-clients.sh writes it in the same
// format: the Unix time of the probe on the first line, the reason on the
// second.
const markerName = ".registry-unreachable"

// markerTTL is how long a marker is trusted. A marker older than this (or
// dated in the future) is ignored and the registry is probed again, so a
// registry that came back is noticed within this bound; a successful probe
// or install removes the marker at once.
const markerTTL = 10 * time.Minute

// requirement reports whether the environment requires the real clients,
// and why ("CI=true", "CLODEX_REQUIRE_CLIENTS=1"); why is "" when it does
// not. A malformed value is an error naming the variable.
func requirement(lookupEnv func(string) (string, bool)) (why string, err error) {
	if v, ok := lookupEnv(EnvRequireClients); ok && v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", fmt.Errorf("%s=%q is not a boolean; want 1 (the real clients are required) or 0", EnvRequireClients, v)
		}
		if b {
			return EnvRequireClients + "=" + v, nil
		}
	}
	if v, ok := lookupEnv(EnvCI); ok && v != "" {
		// CI systems spell it true, 1, yes; anything that is not clearly
		// off counts as on, so a CI run can never skip by a typo.
		switch strings.ToLower(v) {
		case "0", "false", "no", "off":
		default:
			return EnvCI + "=" + v, nil
		}
	}
	return "", nil
}

// marker is a recorded registry failure.
type marker struct {
	at     time.Time
	reason string
}

// readMarker returns the marker in cache if there is one that is fresh at
// now: at most markerTTL old and not dated in the future.
func readMarker(cache string, now time.Time) (marker, bool) {
	b, err := os.ReadFile(filepath.Join(cache, markerName))
	if err != nil {
		return marker{}, false
	}
	first, reason, _ := strings.Cut(string(b), "\n")
	secs, err := strconv.ParseInt(strings.TrimSpace(first), 10, 64)
	if err != nil {
		return marker{}, false
	}
	m := marker{at: time.Unix(secs, 0), reason: strings.TrimSpace(reason)}
	if age := now.Sub(m.at); age < -time.Second || age > markerTTL {
		return marker{}, false
	}
	return m, true
}

// writeMarker records at now that the registry could not be reached,
// atomically.
func writeMarker(cache string, now time.Time, reason string) error {
	data := fmt.Sprintf("%d\n%s\n", now.Unix(), oneLine(reason, 400))
	if err := atomicfile.WriteFile(filepath.Join(cache, markerName), []byte(data), 0o644); err != nil {
		return fmt.Errorf("write registry marker: %w", err)
	}
	return nil
}

// removeMarker forgets a recorded registry failure.
func removeMarker(cache string) {
	_ = os.Remove(filepath.Join(cache, markerName))
}

// clientSet remembers, per cache folder and client, the executable once it
// is verified and the failure once one happened, for the life of the test
// process: each test gets the answer of the first at no cost.
type clientSet struct {
	mu        sync.Mutex // guards the following fields; held during an install
	installed map[string]string
	failed    map[string]*failure
}

// failure is a client that could not be had in this process.
type failure struct {
	err       error
	firstTest string // the test that reported it in full
}

// clients is the process's clientSet, behind ClaudeCode and CodexCLI.
var clients = &clientSet{}

// ensure returns c's executable from in.cache, installing it if needed. A
// failure fails t with one line naming the client, the cache, what failed
// and how to fix it, except that, when the environment does not require
// the clients, an unreachable npm registry skips t: with the whole reason
// the first time in this process, with a short pointer to that test after.
func (s *clientSet) ensure(t testing.TB, c client, in installer, lookupEnv func(string) (string, bool)) string {
	t.Helper()
	why, err := requirement(lookupEnv)
	if err != nil {
		t.Fatalf("clienttest: %v", err)
	}
	key := in.cache + "\x00" + c.name
	if !s.mu.TryLock() {
		// Another test of this process is getting a client; its waits
		// and its install have their own deadlines.
		in.tell(fmt.Sprintf("%s waits for another test of this process that is getting a client", t.Name()))
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if bin, ok := s.installed[key]; ok {
		return bin
	}
	f, seen := s.failed[key]
	if !seen {
		bin, err := in.install(t.Context(), c)
		if err == nil {
			if s.installed == nil {
				s.installed = make(map[string]string)
			}
			s.installed[key] = bin
			return bin
		}
		if t.Context().Err() != nil { // the test ended; nothing to remember
			t.Fatalf("clienttest: %s: %v", c.title(), err)
		}
		f = &failure{err: err, firstTest: t.Name()}
		if s.failed == nil {
			s.failed = make(map[string]*failure)
		}
		s.failed[key] = f
	}
	msg := unavailableMessage(c, in.cache, f.err)
	switch {
	case why != "":
		t.Fatalf("clienttest: %s [%s: the real clients are required, so this fails instead of skipping]", msg, why)
	case !errors.Is(f.err, ErrRegistryUnreachable):
		t.Fatalf("clienttest: %s", msg)
	case seen:
		t.Skipf("skipping: %s is unavailable (npm registry unreachable); the skip of %s says why", c.title(), f.firstTest)
	default:
		t.Skipf("skipping: %s (with CI=true or %s=1 this fails)", msg, EnvRequireClients)
	}
	return ""
}

// unavailableMessage is one line: which client, where it was looked for,
// what failed and how to fix it.
func unavailableMessage(c client, cache string, err error) string {
	var fix string
	switch {
	case errors.Is(err, ErrRegistryUnreachable):
		fix = "make the npm registry reachable (`npm config get registry`; npm_config_registry overrides it), then run scripts/install-clients.sh"
	case errors.Is(err, errNoNPM):
		fix = "install Node.js 20 with npm, then run scripts/install-clients.sh"
	case errors.Is(err, errDeadline):
		fix = "see what it waited for above; run scripts/install-clients.sh alone to watch npm, then run the tests again"
	default:
		fix = "run scripts/install-clients.sh to see npm's whole output"
	}
	return fmt.Sprintf("%s (npm %s) is not installed in %s and cannot be installed: %s; fix: %s",
		c.title(), c.spec(), cache, oneLine(err.Error(), 600), fix)
}

// oneLine joins the non-empty lines of s with " | " and cuts the result at
// max bytes.
func oneLine(s string, max int) string {
	var parts []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	out := strings.Join(parts, " | ")
	if len(out) > max {
		for max > 0 && !utf8.RuneStart(out[max]) {
			max--
		}
		out = out[:max] + "…"
	}
	return out
}

// Tool returns the absolute path of the program name found in PATH, which
// a test needs besides the clients (tmux, say). When it is missing, t fails
// under CI=true or CLODEX_REQUIRE_CLIENTS=1 and is skipped otherwise; either
// way one line says so and how to install it (install, e.g. "apt-get
// install tmux").
func Tool(t testing.TB, name, install string) string {
	t.Helper()
	return tool(t, name, install, os.LookupEnv)
}

func tool(t testing.TB, name, install string, lookupEnv func(string) (string, bool)) string {
	t.Helper()
	why, err := requirement(lookupEnv)
	if err != nil {
		t.Fatalf("clienttest: %v", err)
	}
	path, err := exec.LookPath(name)
	if err == nil {
		return path
	}
	msg := fmt.Sprintf("%s is not installed (not found in PATH); fix: %s", name, install)
	if why != "" {
		t.Fatalf("clienttest: %s [%s: required, so this fails instead of skipping]", msg, why)
	}
	t.Skipf("skipping: %s (with CI=true or %s=1 this fails)", msg, EnvRequireClients)
	return ""
}
