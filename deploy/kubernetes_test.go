package deploy

import (
	"bytes"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// k8sObject is one decoded manifest.
type k8sObject struct {
	source string // file and document, for errors
	kind   string
	obj    any
}

// newTyped returns an empty object of the API type for apiVersion and
// kind; a manifest of any other type is an error, so every new manifest
// is decoded strictly too.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, nil
	case "apps/v1 DaemonSet":
		return &appsv1.DaemonSet{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 Namespace":
		return &corev1.Namespace{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	}
	return nil, fmt.Errorf("no API type known for %s %s; add it to newTyped", apiVersion, kind)
}

// decodeManifests strictly decodes every document of a YAML stream into
// its Kubernetes API type: an unknown or duplicated field is an error.
func decodeManifests(source string, data []byte) ([]k8sObject, []error) {
	var (
		out  []k8sObject
		errs []error
	)
	for i, doc := range bytes.Split(data, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		src := fmt.Sprintf("%s (document %d)", source, i+1)
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		obj, err := newTyped(head.APIVersion, head.Kind)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", src, err))
			continue
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s %s: %w", src, head.APIVersion, head.Kind, err))
			continue
		}
		out = append(out, k8sObject{source: src, kind: head.Kind, obj: obj})
	}
	return out, errs
}

// manifestFiles are deploy/kubernetes's YAML files but the kustomizations
// (the JSON patches, *.patch.json, are checked through the rendered
// overlay).
func manifestFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	root := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(path, ".yaml") && d.Name() != "kustomization.yaml" {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 6 {
		t.Fatalf("deploy/kubernetes has %d manifests", len(files))
	}
	return files
}

// baseObjects decodes every manifest file (the base and the overlay's
// patches) strictly.
func baseObjects(t *testing.T) []k8sObject {
	t.Helper()
	var all []k8sObject
	for _, f := range manifestFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, errs := decodeManifests(rel(t, f), b)
		for _, err := range errs {
			t.Error(err)
		}
		all = append(all, objs...)
	}
	return all
}

// renderOverlay builds overlays/production with kustomize (in process,
// the library kubectl uses), with stand-in files for the Secrets the
// operator provides.
func renderOverlay(t *testing.T) []byte {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	root := filepath.Join(repoRoot(t), "deploy", "kubernetes")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path) //nolint:gosec // G122: the repository's own manifests, read by a test
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(root, path)
		return mem.WriteFile(filepath.Join("/k", r), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"admin.token", "agent.token", "metrics.token", "redis.url", "credential.key", "tls.crt", "tls.key", "ca.crt"} {
		if err := mem.WriteFile("/k/overlays/production/secrets/"+f, []byte("stand-in\n")); err != nil {
			t.Fatal(err)
		}
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, "/k/overlays/production")
	if err != nil {
		t.Fatalf("kustomize build overlays/production: %v", err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestKubernetesManifestsDecodeStrictly decodes every manifest file and the
// rendered overlay into the API types, and checks what the issue asks of
// them.
func TestKubernetesManifestsDecodeStrictly(t *testing.T) {
	baseObjects(t)
	objs, errs := decodeManifests("overlays/production rendered", renderOverlay(t))
	for _, err := range errs {
		t.Error(err)
	}
	byKind := map[string][]any{}
	secrets := map[string]*corev1.Secret{}
	sets := map[string]*appsv1.StatefulSet{}
	for _, o := range objs {
		byKind[o.kind] = append(byKind[o.kind], o.obj)
		if s, ok := o.obj.(*corev1.Secret); ok {
			secrets[s.Name] = s
		}
		if s, ok := o.obj.(*appsv1.StatefulSet); ok {
			sets[s.Name] = s
		}
	}
	for _, want := range []string{"StatefulSet", "DaemonSet", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "Secret", "Namespace"} {
		if len(byKind[want]) == 0 {
			t.Errorf("the rendered overlay has no %s", want)
		}
	}
	cp, redis := sets["clodex-controlplane"], sets["clodex-redis"]
	if cp == nil || redis == nil {
		t.Fatalf("the rendered overlay's StatefulSets are %v; want clodex-controlplane and clodex-redis", slices.Sorted(maps.Keys(sets)))
	}
	if t.Failed() {
		return
	}
	dp := byKind["DaemonSet"][0].(*appsv1.DaemonSet)
	if cp.Spec.Replicas == nil || *cp.Spec.Replicas != 2 {
		t.Errorf("control plane replicas = %v, want 2", cp.Spec.Replicas)
	}
	c := cp.Spec.Template.Spec.Containers[0]
	// The probes ask the gRPC health service: the kubelet's own gRPC
	// probe in plaintext, clodexctl health with the CA under TLS (the
	// kubelet's cannot speak TLS).
	_, tls := flagValue(c.Command, "tls-cert")
	if !tls {
		t.Error("the production overlay's control plane has no --tls-cert: the tokens would cross the network in clear")
	}
	for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe} {
		switch {
		case p == nil:
			t.Errorf("control plane has no %s probe", name)
		case !tls && (p.GRPC == nil || p.GRPC.Port != 17700):
			t.Errorf("control plane %s probe = %+v, want the gRPC health service on 17700", name, p)
		case tls && (p.Exec == nil || !slices.Contains(p.Exec.Command, "health") || !slices.ContainsFunc(p.Exec.Command, func(a string) bool { return strings.HasPrefix(a, "--tls-ca=") })):
			t.Errorf("control plane %s probe = %+v; with --tls-cert want clodexctl --tls-ca=... health", name, p)
		}
	}
	if _, ca := flagValue(dp.Spec.Template.Spec.Containers[0].Command, "tls-ca"); ca != tls {
		t.Errorf("control plane TLS %v but data plane --tls-ca %v: they must agree", tls, ca)
	}
	for _, o := range baseObjects(t) {
		if d, ok := o.obj.(*appsv1.StatefulSet); ok && strings.Contains(o.source, "/base/") && d.Name == "clodex-controlplane" {
			if p := d.Spec.Template.Spec.Containers[0].ReadinessProbe; p == nil || p.GRPC == nil || p.GRPC.Port != 17700 {
				t.Errorf("%s: the base control plane's readiness probe = %+v, want the kubelet's gRPC probe on 17700", o.source, p)
			}
		}
	}
	// Each replica keeps its backups on a volume of its own (a claim
	// template), mounted where --backup-dir points and writable by the
	// image's user.
	if dir, ok := flagValue(c.Command, "backup-dir"); !ok || !mountedFromClaim(cp, c, dir) {
		t.Errorf("the control plane's --backup-dir %q (given: %v) is not on a volume from its claim templates", dir, ok)
	}
	if sc := cp.Spec.Template.Spec.SecurityContext; sc == nil || sc.FSGroup == nil || *sc.FSGroup != 65532 {
		t.Error("the control plane's pods have no fsGroup 65532: the image's user could not write its backups volume")
	}
	// Redis keeps its data: appendonly yes, on a volume from a claim.
	rc := redis.Spec.Template.Spec.Containers[0]
	if v, _ := argValueAfter(rc.Command, "--appendonly"); v != "yes" {
		t.Errorf("redis command %q; want --appendonly yes", rc.Command)
	}
	if dir, _ := argValueAfter(rc.Command, "--dir"); !mountedFromClaim(redis, rc, dir) {
		t.Errorf("redis --dir %q is not on a volume from its claim templates", dir)
	}
	if _, ok := flagValue(c.Command, "redis"); ok {
		t.Error("the control plane passes --redis on its command line; the URL may hold a password: use CLODEX_REDIS_URL from the Secret")
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "CLODEX_REDIS_URL" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
	}) {
		t.Error("the control plane does not take CLODEX_REDIS_URL from a Secret")
	}
	pdb := byKind["PodDisruptionBudget"][0].(*policyv1.PodDisruptionBudget)
	if !selects(pdb.Spec.Selector.MatchLabels, cp.Spec.Template.Labels) || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("the PodDisruptionBudget does not keep one control plane: %+v", pdb.Spec)
	}
	guarded := map[string]bool{}
	for _, o := range byKind["NetworkPolicy"] {
		np := o.(*networkingv1.NetworkPolicy)
		for name, set := range sets {
			if selects(np.Spec.PodSelector.MatchLabels, set.Spec.Template.Labels) && len(np.Spec.Ingress) > 0 {
				guarded[name] = true
			}
		}
	}
	if !guarded["clodex-controlplane"] || !guarded["clodex-redis"] {
		t.Errorf("NetworkPolicies guard %v; want the control plane and Redis", guarded)
	}

	// The data plane: one per node, reachable only on its node.
	ds := dp.Spec.Template.Spec
	d := ds.Containers[0]
	if listen, _ := flagValue(d.Command, "listen"); !ds.HostNetwork || !strings.HasPrefix(listen, "127.0.0.1:") {
		t.Errorf("data plane: hostNetwork %v, --listen %q; want the node's loopback only", ds.HostNetwork, listen)
	}
	// Ready once it can serve a turn (/readyz: its token accepted and,
	// with the broker, an access token held); alive while it answers.
	if p := d.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Path != "/readyz" {
		t.Errorf("data plane readiness probe = %+v, want GET http://127.0.0.1:17645/readyz", p)
	}
	if p := d.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" || p.HTTPGet.Path != "/healthz" {
		t.Errorf("data plane liveness probe = %+v, want GET http://127.0.0.1:17645/healthz", p)
	}

	// Every Secret a workload names exists in the rendered overlay.
	for _, spec := range []corev1.PodSpec{cp.Spec.Template.Spec, ds, redis.Spec.Template.Spec} {
		for _, v := range spec.Volumes {
			if v.Secret != nil && secrets[v.Secret.SecretName] == nil {
				t.Errorf("volume %s names Secret %s, which the overlay does not make", v.Name, v.Secret.SecretName)
			}
		}
		for _, ctr := range spec.Containers {
			sc := ctr.SecurityContext
			if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("container %s: want a read-only root and no privilege escalation", ctr.Name)
			}
			for _, e := range ctr.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && secrets[e.ValueFrom.SecretKeyRef.Name] == nil {
					t.Errorf("env %s names Secret %s, which the overlay does not make", e.Name, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
		if spec.SecurityContext == nil || spec.SecurityContext.RunAsNonRoot == nil || !*spec.SecurityContext.RunAsNonRoot {
			t.Error("a pod may run as root; want runAsNonRoot")
		}
	}
	for _, name := range []string{"admin.token", "agent.token", "metrics.token"} {
		found := false
		for _, s := range secrets {
			_, found1 := s.Data[name]
			found = found || found1
		}
		if !found {
			t.Errorf("no Secret holds %s", name)
		}
	}

	// The ServiceMonitor's endpoints are ports of the Services it selects.
	sm := byKind["ServiceMonitor"][0].(*monitoringv1.ServiceMonitor)
	for _, ep := range sm.Spec.Endpoints {
		matched := 0
		for _, o := range byKind["Service"] {
			svc := o.(*corev1.Service)
			if selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
				if slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					matched++
				}
			}
		}
		if matched != 2 {
			t.Errorf("ServiceMonitor port %q is on %d selected Services; want the control plane's and the data planes'", ep.Port, matched)
		}
		// The admin listeners are off loopback: they require the bearer
		// token, which the scrape must send from a Secret the overlay
		// makes (its generated name, hash suffix included).
		if a := ep.Authorization; a == nil || a.Credentials == nil {
			t.Errorf("ServiceMonitor port %q sends no bearer token; the admin listeners require --metrics-token-file's", ep.Port)
		} else if sec := secrets[a.Credentials.Name]; sec == nil || sec.Data[a.Credentials.Key] == nil {
			t.Errorf("ServiceMonitor port %q takes its token from Secret %s key %s, which the overlay does not make", ep.Port, a.Credentials.Name, a.Credentials.Key)
		}
	}
}

// TestKubernetesStrictDecodeFindsMistakes shows the strict decoding fail
// on a misspelt field and an unknown kind.
func TestKubernetesStrictDecodeFindsMistakes(t *testing.T) {
	_, errs := decodeManifests("test", []byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "replica") {
		t.Errorf("a misspelt field: %v", errs)
	}
	_, errs = decodeManifests("test", []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n"))
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "no API type known") {
		t.Errorf("an unknown kind: %v", errs)
	}
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// kubernetesCommandLines returns the containers' commands and exec probes
// of every workload manifest, for the flag check.
func kubernetesCommandLines(t *testing.T) []commandLine {
	t.Helper()
	var out []commandLine
	rendered, errs := decodeManifests("overlays/production rendered", renderOverlay(t))
	for _, err := range errs {
		t.Error(err)
	}
	for _, o := range append(baseObjects(t), rendered...) {
		var spec *corev1.PodSpec
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			spec = &w.Spec.Template.Spec
		case *appsv1.StatefulSet:
			spec = &w.Spec.Template.Spec
		case *appsv1.DaemonSet:
			spec = &w.Spec.Template.Spec
		default:
			continue
		}
		for _, c := range spec.Containers {
			if argv := append(slices.Clone(c.Command), c.Args...); len(argv) > 0 {
				out = append(out, commandLine{o.source + " container " + c.Name, argv})
			}
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
				if p != nil && p.Exec != nil {
					out = append(out, commandLine{o.source + " container " + c.Name + " probe", p.Exec.Command})
				}
			}
		}
	}
	return out
}

// mountedFromClaim reports whether dir is the mount path of one of c's
// volumes that comes from one of set's claim templates.
func mountedFromClaim(set *appsv1.StatefulSet, c corev1.Container, dir string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath != dir || m.ReadOnly {
			continue
		}
		for _, tpl := range set.Spec.VolumeClaimTemplates {
			if tpl.Name == m.Name {
				return true
			}
		}
	}
	return false
}

// argValueAfter returns the argument after name in argv.
func argValueAfter(argv []string, name string) (string, bool) {
	for i, a := range argv {
		if a == name && i+1 < len(argv) {
			return argv[i+1], true
		}
	}
	return "", false
}
