package deploy

import (
	"os"
	"path/filepath"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

// Every deployment caps the control plane's memory, the cap it derives
// its soft memory limit from (docs/operations.md §11): the Kubernetes
// container's limits.memory, compose's mem_limit, the systemd unit's
// MemoryMax=.
func TestControlPlaneMemoryCapped(t *testing.T) {
	found := false
	for _, o := range baseObjects(t) {
		d, ok := o.obj.(*appsv1.StatefulSet)
		if !ok || d.Name != "clodex-controlplane" {
			continue
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if c.Name != "controlplane" {
				continue
			}
			if _, ok := c.Resources.Limits["memory"]; !ok {
				t.Errorf("%s: container controlplane has no resources.limits.memory", o.source)
			}
			found = true
		}
	}
	if !found {
		t.Error("no clodex-controlplane StatefulSet with a controlplane container")
	}

	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "compose", "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			MemLimit string `json:"mem_limit"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"controlplane-1", "controlplane-2"} {
		if c.Services[name].MemLimit == "" {
			t.Errorf("compose service %s has no mem_limit", name)
		}
	}

	unit := filepath.Join(repoRoot(t), "deploy", "systemd", "clodex-controlplane.service")
	entries, err := parseUnit(unit)
	if err != nil {
		t.Fatal(err)
	}
	memMax := ""
	for _, e := range entries {
		if e.section == "Service" && e.key == "MemoryMax" {
			memMax = e.value
		}
	}
	if memMax == "" || memMax == "infinity" {
		t.Errorf("%s: [Service] MemoryMax=%q; want a cap", unit, memMax)
	}
}
