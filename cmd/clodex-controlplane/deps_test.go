package main

import (
	"os/exec"
	"strings"
	"testing"
)

// The control plane's packages and binary never import the data plane's
// (what both planes need lives under internal/), nor the data plane's
// assembly, nor test code.
func TestDependencies(t *testing.T) {
	// go test puts the go command that runs it first on PATH.
	out, err := exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}", ".", "../../controlplane/...").Output()
	if err != nil {
		// Fail, not skip: a skip here would hide the rule it checks.
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch {
		case strings.HasPrefix(dep, "github.com/clodex/clodex/dataplane"),
			strings.HasPrefix(dep, "github.com/clodex/clodex/internal/node"):
			t.Errorf("the control plane imports %s", dep)
		}
	}
	out, err = exec.CommandContext(t.Context(), "go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "testing" {
			t.Errorf("clodex-controlplane links %s", dep)
		}
	}
}
