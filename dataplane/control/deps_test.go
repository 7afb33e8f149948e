package control_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoControlPlaneImports pins the rule that the data plane never
// imports the control plane (only its generated API and internal/...).
func TestNoControlPlaneImports(t *testing.T) {
	// go test puts the go command that runs it first on PATH.
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		// Fail, not skip: a skip here would hide the rule it checks.
		t.Fatalf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "testing" || strings.HasPrefix(pkg, "github.com/clodex/clodex/controlplane") {
			t.Errorf("dataplane/control depends on %s", pkg)
		}
	}
}
