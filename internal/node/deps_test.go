package node_test

import (
	"os/exec"
	"strings"
	"testing"
)

// internal/node sits above every other package: only commands (package
// main) and test helpers (packages named ...test) import it, never a
// package of either plane.
func TestOnlyCommandsImportNode(t *testing.T) {
	// go test puts the go command that runs it first on PATH.
	out, err := exec.CommandContext(t.Context(), "go", "list", "-f", "{{.ImportPath}} {{.Name}} {{join .Imports \" \"}}", "../../...").Output()
	if err != nil {
		// Fail, not skip: a skip here would hide the rule it checks.
		t.Fatalf("go list: %v", err)
	}
	const node = "github.com/clodex/clodex/internal/node"
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		pkg, name, imports := f[0], f[1], f[2:]
		if name == "main" || strings.HasSuffix(name, "test") {
			continue
		}
		for _, imp := range imports {
			if imp == node || strings.HasPrefix(imp, node+"/") {
				t.Errorf("%s (package %s) imports %s; only commands and test helpers may", pkg, name, imp)
			}
		}
	}
}
