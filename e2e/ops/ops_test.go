package ops

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/bench/fleet/cluster"
)

// TestWalkthrough runs docs/operations.md §1.1 as an operator would: every
// ```sh block as written, in order, in one bash, with the binaries built
// from this tree first on PATH and each port the blocks name replaced by a
// free one (the only change). A block whose command fails (a flag the
// binary does not have, a server that does not come up, a turn that is
// not answered) fails the test naming it. Then it checks what the blocks
// left: a turn answered by each data plane, the control planes' logs
// structured and free of every secret the blocks wrote.
func TestWalkthrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries and runs the set-up walkthrough; skipped with -short")
	}
	for _, tool := range []string{"bash", "redis-server", "curl"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is not installed (CI=true requires it: the walkthrough of docs/operations.md §1.1 uses it): %v", tool, err)
			}
			t.Skipf("%s is not installed: %v", tool, err)
		}
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := shellBlocks(string(doc), setupHeading)
	if err != nil {
		t.Fatalf("docs/operations.md: %v", err)
	}
	// The walkthrough covers a team's whole set-up: a section that lost a
	// step must not pass by running less.
	all := strings.Join(blocks, "\n")
	for _, want := range []struct {
		what string
		n    int
	}{
		{"etc/admin.token", 1}, {"etc/agent.token", 1}, {"etc/credential.key", 1},
		{"redis-server ", 1}, {"clodex-controlplane ", 2}, {"clodexctl account import", 1},
		{"clodexctl set-rate", 1}, {"clodexctl agent create", 3}, {"clodex-dataplane ", 3},
		{"/v1/messages", 1}, {"clodexctl top", 1}, {"clodexctl health", 1}, {"clodexctl agents", 1},
	} {
		if got := strings.Count(all, want.what); got < want.n {
			t.Errorf("docs/operations.md §1.1 names %q %d times; the walkthrough wants at least %d", want.what, got, want.n)
		}
	}
	if t.Failed() {
		return
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	buildStart := time.Now()
	goBin, err := exec.LookPath("go") // go test puts the go command that runs it first on PATH
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	binDir := t.TempDir()
	if _, err := cluster.Build(ctx, goBin, root, binDir); err != nil {
		t.Fatal(err)
	}
	built := time.Since(buildStart)

	blocks, ports, err := substitutePorts(blocks, freePort)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	home := filepath.Join(dir, ".home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + home, "LANG=C.UTF-8"}
	if v := os.Getenv("TMPDIR"); v != "" {
		env = append(env, "TMPDIR="+v)
	}

	start := time.Now()
	res, err := walk(ctx, dir, env, blocks)
	ran := time.Since(start)
	if err != nil {
		t.Errorf("docs/operations.md §1.1 (ports %v): %v", ports, err)
		dumpLogs(t, dir)
		return
	}
	t.Logf("walkthrough: %d blocks in %v (build %v), per block %v; what an operator would see:\n%s",
		len(blocks), ran.Round(time.Millisecond), built.Round(time.Millisecond), rounded(res.took), res.output)

	// A turn answered by each data plane: the emulator's reply, three times.
	if n := strings.Count(res.output, "Hello from clodex-sim. You said: Say hello"); n != 3 {
		t.Errorf("the turns through the three data planes printed the emulator's answer %d times; want 3:\n%s", n, res.output)
	}
	// The control planes' logs are structured, and no secret the blocks
	// wrote reaches any log.
	var secrets []string
	for _, f := range []string{"admin.token", "agent.token", "credential.key", "host-1.token", "host-2.token", "host-3.token"} {
		b, err := os.ReadFile(filepath.Join(dir, "etc", f))
		if err != nil {
			t.Errorf("the walkthrough wrote no etc/%s: %v", f, err)
			continue
		}
		secrets = append(secrets, strings.TrimSpace(string(b)))
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range secrets {
			if s != "" && strings.Contains(string(b), s) {
				t.Errorf("%s holds a secret the walkthrough wrote", filepath.Base(l))
			}
		}
		if !strings.HasPrefix(filepath.Base(l), "cp-") {
			continue
		}
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			if !strings.HasPrefix(line, "time=") {
				t.Errorf("%s has a line outside the structured log: %q", filepath.Base(l), line)
			}
		}
	}
	if t.Failed() {
		dumpLogs(t, dir)
	}
}

// A block whose command fails stops the walkthrough there, naming the
// block; the blocks after it do not run.
func TestWalkthroughStopsAtAWrongCommand(t *testing.T) {
	md := "# x\n\n### 1.1 Steps\n\n```sh\necho one > one.txt\n```\n\ntext\n\n```sh\nclodexctl-no-such-command --flag\n```\n\n```sh\necho three > three.txt\n```\n\n## 2. Next\n\n```sh\necho never\n```\n"
	blocks, err := shellBlocks(md, setupHeading)
	if err != nil || len(blocks) != 3 {
		t.Fatalf("shellBlocks = %q, %v; want the section's 3 blocks", blocks, err)
	}
	dir := t.TempDir()
	_, err = walk(t.Context(), dir, []string{"PATH=" + os.Getenv("PATH")}, blocks)
	var we *walkError
	if err == nil || !asWalkError(err, &we) || we.block != 2 || !strings.Contains(err.Error(), "clodexctl-no-such-command") {
		t.Fatalf("walk = %v; want block 2 named as failed", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "one.txt")); err != nil {
		t.Errorf("block 1 did not run: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "three.txt")); err == nil {
		t.Error("block 3 ran after block 2 failed")
	}

	// Ports are replaced wherever the number stands as a word, and only
	// those the blocks name as ports.
	in := []string{"srv --listen 127.0.0.1:17700 > a.log &\nfor p in 17700 17701; do x --burst 10 :$p; done", "redis-server --port 6379 && use redis://127.0.0.1:6379/0"}
	next := 40000
	got, ports, err := substitutePorts(in, func() (int, error) { next++; return next, nil })
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"srv --listen 127.0.0.1:40001 > a.log &\nfor p in 40001 17701; do x --burst 10 :$p; done", "redis-server --port 40002 && use redis://127.0.0.1:40002/0"}
	if !slices.Equal(got, want) || len(ports) != 2 {
		t.Errorf("substitutePorts = %q (%v); want %q", got, ports, want)
	}
}

func asWalkError(err error, target **walkError) bool {
	we, ok := err.(*walkError)
	if ok {
		*target = we
	}
	return ok
}

// freePort is a loopback port nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func dumpLogs(t *testing.T, dir string) {
	t.Helper()
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		t.Logf("---- %s ----\n%s", filepath.Base(l), lastLines(string(b), 25))
	}
}

func rounded(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}
