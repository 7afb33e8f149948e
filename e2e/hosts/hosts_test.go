//go:build linux

package hosts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/atomicfile"
)

const (
	// outage is how long the control plane's links stay down.
	outage = 20 * time.Second
	// fanOut is the number of simultaneous new conversations per data
	// plane in the fan-out.
	fanOut = 6
	// What a data plane logs when it falls back to its local bucket, and
	// when the control plane answers again.
	fallbackLog = "control plane unreachable; admitting locally"
	centralLog  = "control plane reachable again; admission is central"
	// testBound bounds the whole test.
	testBound = 3 * time.Minute
)

// requireHosts skips the test, saying why, where it cannot run: with
// -short or without root. Under CI=true as root a missing tool fails it.
func requireHosts(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: starts real processes in network namespaces")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and veth pairs (run as root, as CI does)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		fail(t, "iproute2's ip is not installed (Debian package iproute2)")
	}
}

// fail fails the test; outside CI it skips with the reason instead (the
// machine may forbid namespaces, e.g. in an unprivileged container).
func fail(t *testing.T, reason string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(reason + " (required under CI=true on Linux as root)")
	}
	t.Skip(reason)
}

// host is one network namespace.
type host struct {
	ns   string // namespace name
	path string // /run/netns/<ns>
}

// topology is the four hosts and the names of the control plane's link
// ends (the ones the outage takes down).
type topology struct {
	cp, sim, dp1, dp2 host
	cpLinks           []string // interfaces in cp's namespace
}

func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// makeTopology creates the namespaces and links; cleanup deletes them.
func makeTopology(ctx context.Context, t *testing.T) *topology {
	t.Helper()
	prefix := fmt.Sprintf("clx%d", os.Getpid()%100000)
	mk := func(role string) host {
		ns := prefix + role
		return host{ns: ns, path: "/run/netns/" + ns}
	}
	topo := &topology{cp: mk("cp"), sim: mk("sim"), dp1: mk("dp1"), dp2: mk("dp2")}
	for _, h := range []host{topo.cp, topo.sim, topo.dp1, topo.dp2} {
		if err := ip(ctx, "netns", "add", h.ns); err != nil {
			fail(t, "cannot create a network namespace: "+err.Error())
		}
		t.Cleanup(func() { _ = ip(context.WithoutCancel(ctx), "netns", "del", h.ns) })
		if err := ip(ctx, "-n", h.ns, "link", "set", "lo", "up"); err != nil {
			t.Fatal(err)
		}
	}
	// link joins a and b with a veth pair: a gets aAddr, b gets bAddr (/30).
	link := func(a host, aIf, aAddr string, b host, bIf, bAddr string) {
		if err := ip(ctx, "link", "add", aIf, "netns", a.ns, "type", "veth", "peer", "name", bIf, "netns", b.ns); err != nil {
			fail(t, "cannot create a veth pair: "+err.Error())
		}
		for _, s := range []struct {
			h         host
			ifc, addr string
		}{{a, aIf, aAddr}, {b, bIf, bAddr}} {
			if err := ip(ctx, "-n", s.h.ns, "addr", "add", s.addr+"/30", "dev", s.ifc); err != nil {
				t.Fatal(err)
			}
			if err := ip(ctx, "-n", s.h.ns, "link", "set", s.ifc, "up"); err != nil {
				t.Fatal(err)
			}
		}
	}
	link(topo.cp, "cp-dp1", "10.201.1.1", topo.dp1, "dp1-cp", "10.201.1.2")
	link(topo.cp, "cp-dp2", "10.201.2.1", topo.dp2, "dp2-cp", "10.201.2.2")
	link(topo.sim, "sim-dp1", "10.202.1.1", topo.dp1, "dp1-sim", "10.202.1.2")
	link(topo.sim, "sim-dp2", "10.202.2.1", topo.dp2, "dp2-sim", "10.202.2.2")
	topo.cpLinks = []string{"cp-dp1", "cp-dp2"}
	return topo
}

// inNS runs fn on an OS thread switched into the namespace at path; a
// socket created there stays in that namespace.
func inNS(path string, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("open own netns: %w", err)
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("enter netns %s: %w", path, err)
	}
	ferr := fn()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread is in the wrong namespace: never let it run anything
		// else (UnlockOSThread is skipped; the runtime ends the thread).
		runtime.Goexit()
	}
	return ferr
}

// clientIn is an HTTP client whose connections are made inside h, so it
// reaches listeners on h's loopback.
func clientIn(h host) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := inNS(h.path, func() error {
				var d net.Dialer
				c, err := d.DialContext(ctx, network, addr)
				conn = c
				return err
			})
			return conn, err
		},
		MaxIdleConnsPerHost: 32,
	}}
}

// proc is one process started in a namespace with ip netns exec.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs bin with args inside h. Its output goes to a log file in
// dir; cleanup stops it with SIGTERM (SIGKILL after 10 s).
func start(t *testing.T, dir string, h host, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.ns, bin}, args...)...)
	cmd.Env = []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH")} // nothing else leaks in
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("---- %s ----\n%s", name, lastLines(string(b), 30))
		}
	})
	return p
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 100 ms until it holds, p exits, or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, procs []*proc, cond func() bool) {
	t.Helper()
	for !cond() {
		for _, p := range procs {
			select {
			case <-p.done:
				t.Fatalf("%s: %s exited; log %s", what, p.name, p.log)
			default:
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

type simStats struct {
	Upgrades    int64 `json:"upgrades"`
	Upgrade403s int64 `json:"upgrade_403s"`
}

func TestHostsOverVeth(t *testing.T) {
	requireHosts(t)
	ctx, cancel := context.WithTimeout(t.Context(), testBound)
	defer cancel()

	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go") // go test puts the go command that runs it first on PATH
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	bins, err := cluster.Build(ctx, goBin, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	topo := makeTopology(ctx, t)
	dir := t.TempDir()

	adminToken, agentToken := filepath.Join(dir, "admin.token"), filepath.Join(dir, "agent.token")
	for path, tok := range map[string]string{adminToken: "hosts-admin-token-0123456789", agentToken: "hosts-agent-token-0123456789"} {
		if err := atomicfile.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sim := start(t, dir, topo.sim, "clodex-sim", bins.Sim, "--listen", "0.0.0.0:17800",
		"--accept-token", cluster.Token+"="+cluster.Account, "--log-level", "warn")
	cp := start(t, dir, topo.cp, "clodex-controlplane", bins.ControlPlane, "--listen", "0.0.0.0:17700",
		"--data-dir", filepath.Join(dir, "cpdata"), "--admin-token-file", adminToken, "--agent-token-file", agentToken)
	procs := []*proc{sim, cp}
	var dps []*proc
	for i, h := range []host{topo.dp1, topo.dp2} {
		n := i + 1
		auth := filepath.Join(dir, fmt.Sprintf("dp%d-auth.json", n))
		if err := atomicfile.WriteFile(auth, cluster.AuthJSON(cluster.Token, cluster.Account), 0o600); err != nil {
			t.Fatal(err)
		}
		dp := start(t, dir, h, fmt.Sprintf("clodex-dataplane-%d", n), bins.DataPlane,
			"--listen", "127.0.0.1:17645",
			"--control-plane", fmt.Sprintf("10.201.%d.1:17700", n), "--agent-token-file", agentToken,
			"--upstream-url", fmt.Sprintf("ws://10.202.%d.1:17800/backend-api/codex/responses", n),
			"--codex-auth", auth, "--refresh", "never")
		dps = append(dps, dp)
		procs = append(procs, dp)
	}

	// Both data planes registered with the control plane over their links.
	liveAgents := func() int {
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", topo.cp.ns, bins.Ctl,
			"--control-plane", "127.0.0.1:17700", "--token-file", adminToken, "-o", "json", "agents").Output()
		if err != nil {
			return -1
		}
		var agents []struct {
			Live bool `json:"live"`
		}
		if json.Unmarshal(out, &agents) != nil {
			return -1
		}
		live := 0
		for _, a := range agents {
			if a.Live {
				live++
			}
		}
		return live
	}
	waitFor(ctx, t, "both data planes register", procs, func() bool { return liveAgents() == 2 })

	clients := []*http.Client{clientIn(topo.dp1), clientIn(topo.dp2)}
	for _, c := range clients {
		t.Cleanup(c.CloseIdleConnections)
	}
	simClient := clientIn(topo.sim)
	t.Cleanup(simClient.CloseIdleConnections)
	stats := func(t *testing.T) simStats {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:17800/sim/stats", nil)
		resp, err := simClient.Do(req)
		if err != nil {
			t.Fatalf("read clodex-sim stats: %v", err)
		}
		defer resp.Body.Close()
		var s simStats
		if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
			t.Fatalf("decode clodex-sim stats: %v", err)
		}
		return s
	}
	ready := func(c *http.Client) func() bool {
		return func() bool {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:17645/healthz", nil)
			resp, err := c.Do(req)
			if err != nil {
				return false
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
	}
	for _, c := range clients {
		waitFor(ctx, t, "data plane answers /healthz", procs, ready(c))
	}

	retry := cluster.Retry{MaxRetries: 6}
	runTurns := func(turns *[]cluster.TurnResult, mu *sync.Mutex, dp int) {
		r := cluster.RunTurn(ctx, clients[dp], "http://127.0.0.1:17645", retry, rand.Float64)
		r.DataPlane = dp + 1
		mu.Lock()
		*turns = append(*turns, r)
		mu.Unlock()
	}
	checkTurns := func(t *testing.T, phase string, turns []cluster.TurnResult) {
		t.Helper()
		per := map[int]int{}
		for _, r := range turns {
			if !r.OK {
				t.Errorf("%s: a turn through data plane %d failed after %d attempts: %s", phase, r.DataPlane, r.Attempts, r.Reason)
			}
			per[r.DataPlane]++
		}
		if per[1] == 0 || per[2] == 0 {
			t.Errorf("%s: turns per data plane %v; want both to serve", phase, per)
		}
		t.Logf("%s: %d turns, per data plane %v", phase, len(turns), per)
	}

	// 1. The fan-out: fanOut new conversations at once on each data plane.
	t.Run("FanOut", func(t *testing.T) {
		var (
			mu    sync.Mutex
			turns []cluster.TurnResult
			wg    sync.WaitGroup
		)
		for dp := range clients {
			for range fanOut {
				wg.Go(func() { runTurns(&turns, &mu, dp) })
			}
		}
		wg.Wait()
		checkTurns(t, "fan-out", turns)
		if s := stats(t); s.Upgrade403s != 0 || s.Upgrades < int64(2*fanOut) {
			t.Errorf("clodex-sim: %d upgrades, %d upstream 403s; want at least %d upgrades and no 403", s.Upgrades, s.Upgrade403s, 2*fanOut)
		}
	})

	// 2. The control plane's links go down for the outage while each
	// data plane starts a new conversation every second.
	t.Run("ControlPlaneCutFor20s", func(t *testing.T) {
		for _, l := range topo.cpLinks {
			if err := ip(ctx, "-n", topo.cp.ns, "link", "set", l, "down"); err != nil {
				t.Fatal(err)
			}
		}
		cut := time.Now()
		var (
			mu    sync.Mutex
			turns []cluster.TurnResult
			wg    sync.WaitGroup
		)
		tick := time.NewTicker(time.Second)
		for time.Since(cut) < outage {
			for dp := range clients {
				wg.Go(func() { runTurns(&turns, &mu, dp) })
			}
			<-tick.C
		}
		tick.Stop()
		for _, l := range topo.cpLinks {
			if err := ip(ctx, "-n", topo.cp.ns, "link", "set", l, "up"); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()
		checkTurns(t, "control plane cut", turns)
		if s := stats(t); s.Upgrade403s != 0 {
			t.Errorf("clodex-sim counted %d upstream 403s; want none", s.Upgrade403s)
		}
		// Each data plane felt the cut: it said it admitted locally.
		for _, dp := range dps {
			if b, _ := os.ReadFile(dp.log); !strings.Contains(string(b), fallbackLog) {
				t.Errorf("%s never logged %q: the cut did not reach it", dp.name, fallbackLog)
			}
		}
		// The links are back: both agents register again and admission is
		// central again on both.
		waitFor(ctx, t, "both data planes re-register after the cut", procs, func() bool { return liveAgents() == 2 })
		for _, dp := range dps {
			waitFor(ctx, t, dp.name+" returns to central admission", procs, func() bool {
				b, _ := os.ReadFile(dp.log)
				i := strings.LastIndex(string(b), fallbackLog)
				return i >= 0 && strings.Contains(string(b[i:]), centralLog)
			})
		}
	})
}
