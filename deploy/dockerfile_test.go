package deploy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"go/version"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// dockerStage is one FROM ... stage of the Dockerfile.
type dockerStage struct {
	from, name string
	nodes      []*parser.Node // the instructions after FROM
}

// parseDockerfile parses the repository's Dockerfile with BuildKit's own
// parser and splits it into stages.
func parseDockerfile(t *testing.T) (args map[string]string, stages []dockerStage) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := parser.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse Dockerfile: %v", err)
	}
	for _, w := range res.Warnings {
		t.Errorf("Dockerfile: %s", w.Short)
	}
	args = map[string]string{}
	for _, n := range res.AST.Children {
		switch strings.ToLower(n.Value) {
		case "from":
			s := dockerStage{from: n.Next.Value}
			if as := n.Next.Next; as != nil && strings.EqualFold(as.Value, "as") && as.Next != nil {
				s.name = as.Next.Value
			}
			stages = append(stages, s)
		case "arg":
			if len(stages) == 0 {
				k, v, _ := strings.Cut(n.Next.Value, "=")
				args[k] = v
				continue
			}
			fallthrough
		default:
			if len(stages) == 0 {
				t.Fatalf("Dockerfile line %d: %s before the first FROM", n.StartLine, n.Value)
			}
			stages[len(stages)-1].nodes = append(stages[len(stages)-1].nodes, n)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("Dockerfile has %d stages; want a build stage and a final stage", len(stages))
	}
	return args, stages
}

func words(n *parser.Node) []string {
	var out []string
	for w := n.Next; w != nil; w = w.Next {
		out = append(out, w.Value)
	}
	return out
}

// TestDockerfile checks the image statically (no Docker engine runs
// here): a build stage that builds with scripts/build.sh as make build
// does, on a Go at least as new as go.mod asks; a final stage from
// scratch, so no shell or package exists at run time, with only COPY from
// the build stage, a non-root numeric USER and exec-form commands.
func TestDockerfile(t *testing.T) {
	args, stages := parseDockerfile(t)
	build, final := stages[0], stages[len(stages)-1]

	goVersion := args["GO_VERSION"]
	if !regexp.MustCompile(`^1\.\d+\.\d+$`).MatchString(goVersion) {
		t.Errorf("ARG GO_VERSION=%q; want a full release such as 1.26.8 (a moving tag is not reproducible)", goVersion)
	}
	gomod, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	if version.Compare("go"+goVersion, "go"+string(m[1])) < 0 {
		t.Errorf("ARG GO_VERSION=%s is older than go.mod's go %s", goVersion, m[1])
	}
	// The image is built with the release make build and make test use:
	// go.mod's toolchain line (the standard library's security fixes).
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindSubmatch(gomod); tc == nil {
		t.Error("go.mod has no toolchain line; the Makefile and scripts take the project's Go release from it")
	} else if goVersion != string(tc[1]) {
		t.Errorf("ARG GO_VERSION=%s; want go.mod's toolchain %s, the release the binaries are tested with", goVersion, tc[1])
	}
	if build.from != "docker.io/library/golang:${GO_VERSION}-bookworm" {
		t.Errorf("build stage FROM %s; want docker.io/library/golang:${GO_VERSION}-bookworm", build.from)
	}
	var buildRun string
	for _, n := range build.nodes {
		if strings.EqualFold(n.Value, "run") && strings.Contains(n.Original, "scripts/build.sh") {
			buildRun = n.Original
		}
	}
	if !strings.Contains(buildRun, `./scripts/build.sh /out/usr/local/bin "$VERSION"`) {
		t.Errorf("no build-stage RUN calls ./scripts/build.sh /out/usr/local/bin \"$VERSION\" (got %q)", buildRun)
	}
	mk, err := os.ReadFile(filepath.Join(repoRoot(t), "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^build:.*\n\t@?GO=\$\(GO\) \./scripts/build\.sh bin \$\(VERSION\)$`).Match(mk) {
		t.Error("the Makefile's build target does not run ./scripts/build.sh bin $(VERSION): the image and make build must share one build command")
	}
	if !regexp.MustCompile(`(?m)^image:.*\n\tdocker build --build-arg VERSION=\$\(VERSION\)`).Match(mk) {
		t.Error("the Makefile has no image target running docker build with VERSION")
	}

	if final.from != "scratch" {
		t.Errorf("final stage FROM %s; want scratch (no shell, nothing but the binaries)", final.from)
	}
	var user string
	var cmd *parser.Node
	copied := map[string]bool{}
	for _, n := range final.nodes {
		switch strings.ToLower(n.Value) {
		case "run":
			t.Errorf("final stage line %d: RUN needs a shell; the final stage has none", n.StartLine)
		case "user":
			user = n.Next.Value
		case "copy":
			if !slicesContainsPrefix(n.Flags, "--from=") {
				t.Errorf("final stage line %d: COPY from the build context; copy only from the build stage", n.StartLine)
			}
			w := words(n)
			copied[w[len(w)-1]] = true
		case "cmd", "entrypoint":
			cmd = n
		}
	}
	if !regexp.MustCompile(`^[1-9][0-9]*(:[1-9][0-9]*)?$`).MatchString(user) {
		t.Errorf("final stage USER %q; want a numeric non-root uid[:gid] (no /etc/passwd in scratch)", user)
	}
	if !copied["/usr/local/bin/"] || !copied["/etc/ssl/certs/ca-certificates.crt"] {
		t.Errorf("final stage copies %v; want the binaries into /usr/local/bin/ and the CA bundle", copied)
	}
	if cmd == nil || !cmd.Attributes["json"] {
		t.Error("final stage CMD is missing or in shell form; scratch has no shell, use [\"binary\", \"arg\"]")
	}

	ignore, err := os.ReadFile(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", "bin"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(want) + `$`).Match(ignore) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}

func slicesContainsPrefix(ss []string, prefix string) bool {
	for _, s := range ss {
		if strings.HasPrefix(s, prefix) {
			return true
		}
	}
	return false
}

// dockerfileCommandLines returns the final stage's CMD for the flag check.
func dockerfileCommandLines(t *testing.T) []commandLine {
	t.Helper()
	_, stages := parseDockerfile(t)
	var out []commandLine
	for _, n := range stages[len(stages)-1].nodes {
		if v := strings.ToLower(n.Value); v == "cmd" || v == "entrypoint" {
			out = append(out, commandLine{source: "Dockerfile:" + strconv.Itoa(n.StartLine) + " " + strings.ToUpper(v), argv: words(n)})
		}
	}
	return out
}

// TestReproducibleBuild builds the binaries twice the way the image does,
// the second time from a copy of the source tree at another path with an
// empty build cache, and compares their SHA-256 digests.
func TestReproducibleBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a second build from an empty cache takes minutes")
	}
	first := binaries(t)
	root := repoRoot(t)
	copyRoot := filepath.Join(t.TempDir(), "elsewhere", "clodex")
	copyTree(t, root, copyRoot)
	second := t.TempDir()
	if err := buildWith(copyRoot, second, "GOCACHE="+t.TempDir(), "GOFLAGS=-mod=readonly"); err != nil {
		t.Fatal(err)
	}
	for _, b := range clodexBinaries {
		a, c := digest(t, filepath.Join(first, b)), digest(t, filepath.Join(second, b))
		if a != c {
			t.Errorf("%s: sha256 %s from %s, %s from %s: the build is not reproducible", b, a, root, c, copyRoot)
		}
	}
}

// copyTree copies the files git would see (tracked and untracked but not
// ignored) from src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		from := filepath.Join(src, name)
		info, err := os.Lstat(from)
		if err != nil || !info.Mode().IsRegular() {
			continue // deleted in the work tree, or not a file
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(from)
		if err != nil {
			t.Fatal(err)
		}
		o, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			in.Close()
			t.Fatal(err)
		}
		_, err = io.Copy(o, in)
		in.Close()
		if cerr := o.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func digest(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// fullyQualified reports whether an image reference names its registry:
// podman (and any engine configured without a default registry) refuses
// a short name such as golang:1.26 ("short-name resolution enforced").
func fullyQualified(ref string) bool {
	first, _, found := strings.Cut(ref, "/")
	return found && (strings.ContainsAny(first, ".:") || first == "localhost")
}

// Every image the Dockerfile and compose pull names its registry, so
// podman builds and runs them as Docker does; the clodex image compose
// builds itself is the exception.
func TestImagesFullyQualified(t *testing.T) {
	for _, bad := range []string{"golang:1.26", "library/golang:1.26", "prom/prometheus:v3"} {
		if fullyQualified(bad) {
			t.Errorf("fullyQualified(%q) = true; want false", bad)
		}
	}
	_, stages := parseDockerfile(t)
	names := map[string]bool{"scratch": true}
	for _, s := range stages {
		if !names[s.from] && !fullyQualified(s.from) {
			t.Errorf("Dockerfile FROM %s is a short name; want the registry named, such as docker.io/library/%s", s.from, s.from)
		}
		if s.name != "" {
			names[s.name] = true
		}
	}
	for name, s := range readCompose(t).Services {
		if s.Build == nil && !fullyQualified(s.Image) {
			t.Errorf("compose service %s: image %s is a short name; want the registry named (docker.io/...)", name, s.Image)
		}
	}
}
