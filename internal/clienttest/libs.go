package clienttest

import (
	"crypto/sha256"
	_ "embed" // the library set's package.json and lock
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The client libraries that node scripts import, pinned by nodelibs/package.json and
// nodelibs/package-lock.json: the Vercel AI SDK (ai, @ai-sdk/anthropic), the Claude Agent
// SDK, LangChain's @langchain/anthropic with @langchain/core, and zod.
var (
	//go:embed nodelibs/package.json
	nodeLibsPackageJSON []byte
	//go:embed nodelibs/package-lock.json
	nodeLibsLock []byte
)

// libSet is a pinned set of npm libraries, installed with npm ci from its own package.json
// and lock file.
type libSet struct {
	packageJSON, lock []byte
	pins              []pin // the direct dependencies, in package.json's order
}

// pin is one package at its exact version.
type pin struct{ pkg, version string }

func (p pin) spec() string { return p.pkg + "@" + p.version }

// nodeLibsClient is the library set; its cache folder is keyed by the lock file's digest
// (node-libs-<first 12 hex digits of its SHA-256>), which scripts/install-clients.sh
// computes the same way, so a changed pin installs afresh.
var nodeLibsClient = func() client {
	set := &libSet{packageJSON: nodeLibsPackageJSON, lock: nodeLibsLock}
	var pkg struct {
		Dependencies json.RawMessage `json:"dependencies"`
	}
	if err := json.Unmarshal(nodeLibsPackageJSON, &pkg); err != nil {
		panic(fmt.Sprintf("clienttest: nodelibs/package.json: %v", err)) // an embedded file: a build-time mistake
	}
	var deps map[string]string
	if err := json.Unmarshal(pkg.Dependencies, &deps); err != nil {
		panic(fmt.Sprintf("clienttest: nodelibs/package.json dependencies: %v", err))
	}
	for _, k := range objectKeys(pkg.Dependencies) {
		set.pins = append(set.pins, pin{pkg: k, version: deps[k]})
	}
	if len(set.pins) == 0 {
		panic("clienttest: nodelibs/package.json pins no dependencies")
	}
	sum := sha256.Sum256(nodeLibsLock)
	return client{product: "the client libraries", name: "node-libs", pkg: set.pins[0].pkg, version: hex.EncodeToString(sum[:])[:12], libs: set}
}()

// specs lists the pinned packages, e.g. "ai@7.0.173 zod@4.6.7".
func (s *libSet) specs() string {
	out := make([]string, len(s.pins))
	for i, p := range s.pins {
		out[i] = p.spec()
	}
	return strings.Join(out, " ")
}

// check verifies that every pinned package is installed in dir at its version.
func (s *libSet) check(dir string) error {
	for _, p := range s.pins {
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", p.pkg, "package.json"))
		if err != nil {
			return fmt.Errorf("%s: %w", p.spec(), err)
		}
		var got struct {
			Version string `json:"version"`
		}
		if err := json.Unmarshal(b, &got); err != nil || got.Version != p.version {
			return fmt.Errorf("%s: installed version %q (%v), want %s", p.pkg, got.Version, err, p.version)
		}
	}
	return nil
}

// NodeLibraries returns the node_modules folder of the pinned client libraries
// (nodelibs/package.json: the Vercel AI SDK, the Claude Agent SDK, LangChain, zod),
// installing them into the cache first if needed; failures are handled as in
// [ClaudeCode]. [RunNode] runs a script that imports them.
func NodeLibraries(t testing.TB) string {
	t.Helper()
	return ensure(t, nodeLibsClient)
}

// Opencode returns the absolute path of the pinned opencode executable (npm opencode-ai),
// installing it into the cache first if needed; failures are handled as in [ClaudeCode].
func Opencode(t testing.TB) string {
	t.Helper()
	return ensure(t, opencodeClient)
}

// objectKeys returns the keys of a JSON object in their order ("" for none).
func objectKeys(raw json.RawMessage) []string {
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return keys
		}
		k, _ := tok.(string)
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return keys
		}
		keys = append(keys, k)
	}
	return keys
}
