package clienttest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// NodeRun describes one run of a node script that imports the pinned client libraries.
type NodeRun struct {
	// Script is the script file (an .mjs module); it is run from a copy in a scratch
	// folder whose node_modules is Libraries, so its imports resolve to the pinned set.
	Script string
	// Libraries is the node_modules folder, from [NodeLibraries].
	Libraries string
	// BaseURL becomes ANTHROPIC_BASE_URL; it must point at a loopback address.
	BaseURL string
	// APIKey becomes ANTHROPIC_API_KEY; "test-key" when empty.
	APIKey string
	// ExtraEnv entries ("KEY=value") are added last.
	ExtraEnv []string
	// Timeout bounds the run; DefaultRunTimeout when zero.
	Timeout time.Duration
	// Locked says the caller holds the client run lock ([LockClientRun]) for a group of
	// runs it starts together; otherwise the run takes it.
	Locked bool
}

// NodeResult is what a node script printed.
type NodeResult struct {
	// Lines are the JSON objects of stdout, in order.
	Lines []map[string]any
	// Other are the stdout lines that are not JSON objects.
	Other []string
	// Stderr is everything the script wrote to stderr.
	Stderr string
	// ExitCode is the exit status; -1 when the run was stopped at its timeout.
	ExitCode int
}

// RunNode runs `node SCRIPT` with stdin from /dev/null, in a scratch folder holding a copy
// of the script and a node_modules link to r.Libraries, and an environment built from
// scratch: PATH, a fresh HOME, TERM=dumb, NO_COLOR=1, ANTHROPIC_BASE_URL,
// ANTHROPIC_API_KEY, then r.ExtraEnv. Bad input fails t; a run stopped at its timeout is
// reported with t.Errorf and ExitCode -1. A non-zero exit is not a test failure.
func RunNode(ctx context.Context, t testing.TB, r NodeRun) NodeResult {
	t.Helper()
	if err := checkLoopback(r.BaseURL); err != nil {
		t.Fatalf("RunNode: %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("RunNode: node is not in PATH (install Node.js 20): %v", err)
	}
	src, err := os.ReadFile(r.Script)
	if err != nil {
		t.Fatalf("RunNode: read script: %v", err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, filepath.Base(r.Script))
	if err := os.WriteFile(script, src, 0o600); err != nil { //nolint:gosec // G703: the test's own script, copied into its scratch folder
		t.Fatalf("RunNode: copy script: %v", err)
	}
	if err := os.Symlink(r.Libraries, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatalf("RunNode: link node_modules: %v", err)
	}
	if r.APIKey == "" {
		r.APIKey = "test-key"
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultRunTimeout
	}
	env := append(baseEnv(t.TempDir()), "ANTHROPIC_BASE_URL="+r.BaseURL, "ANTHROPIC_API_KEY="+r.APIKey)
	env = append(env, r.ExtraEnv...)
	if !r.Locked {
		defer LockClientRun(ctx, t)()
	}
	res := process{bin: node, args: []string{script}, env: env, dir: dir, timeout: r.Timeout}.run(ctx)
	out := NodeResult{Stderr: string(res.stderr), ExitCode: res.exitCode}
	out.Lines, out.Other = jsonLines(res.stdout)
	if res.err != nil {
		t.Errorf("RunNode %s: %v\nstderr (last lines):\n%s", filepath.Base(r.Script), res.err, tail(out.Stderr, 20))
	}
	return out
}

// Case returns the last line whose "case" is name, or nil.
func (r NodeResult) Case(name string) map[string]any {
	var found map[string]any
	for _, l := range r.Lines {
		if l["case"] == name {
			found = l
		}
	}
	return found
}
