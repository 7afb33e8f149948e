package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// The frame for two samples a minute apart: rates are the counter deltas
// per minute, agents count live ones of those serving the account.
func TestTopFrameGolden(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	k1, k2 := account.Key(acct1), account.Key("chatgpt-account-2")
	since := t0.Add(-time.Hour).UnixMilli()
	acct := func(key string, admits, waits, refusals, f403 int64, counted bool) *controlplanev1.Account {
		return &controlplanev1.Account{Key: key, RatePerMinute: 60, EffectiveRatePerMinute: 60, Burst: 10, Tokens: 4.5,
			Admits: admits, Waits: waits, Refusals: refusals, ForbiddenUpgrades: f403, Counted: counted, CountersSinceUnixMs: since}
	}
	store := &storeView{Kind: "redis", Address: "redis://r:6379/0", Replica: "cp-a", Replicas: 2}
	prev := &topSample{at: t0, store: store, accounts: []*controlplanev1.Account{acct(k1, 10, 2, 0, 1, true), acct(k2, 0, 0, 0, 0, false)}}
	cur1 := acct(k1, 40, 5, 3, 4, true)
	cur1.EffectiveRatePerMinute, cur1.Adaptive, cur1.Tokens = 42, true, -1.25
	cur := &topSample{at: t0.Add(30 * time.Second), store: store,
		accounts: []*controlplanev1.Account{cur1, acct(k2, 0, 0, 0, 0, false)},
		agents: []*controlplanev1.Agent{
			{Id: "a", Accounts: []string{k1, k2}, Live: true},
			{Id: "b", Accounts: []string{k1}, Live: false},
		}}
	var b strings.Builder
	writeTop(&b, "cp:17700", 2*time.Second, cur.at, topRows(prev, cur), cur, nil)
	golden(t, "top_frame", b.String())

	// While Redis is degraded the plan usage cannot be read: QUOTA says
	// so instead of showing none.
	degraded := *cur
	degraded.store = &storeView{Kind: "redis", Address: "redis://r:6379/0", Replica: "cp-a", Replicas: 2, Degraded: true}
	degraded.quotaErr = status.Error(codes.Unavailable, "quotas: store unavailable: redis r:6379 unreachable (redis breaker open)")
	b.Reset()
	writeTop(&b, "cp:17700", 2*time.Second, cur.at, topRows(prev, &degraded), &degraded, nil)
	golden(t, "top_frame_degraded", b.String())

	// Another replica's counters are not subtracted.
	other := *cur
	other.store = &storeView{Kind: "redis", Replica: "cp-b", Replicas: 2}
	if rows := topRows(prev, &other); rows[0].Admits != nil {
		t.Errorf("rates across replicas = %v, want none", *rows[0].Admits)
	}
}

func TestTopBadInput(t *testing.T) {
	srv := startServer(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"top", "--interval", "10ms"}, "--interval 10ms is out of range; allowed 500ms..1m"},
		{[]string{"top", "extra"}, `unexpected argument "extra"; top takes no arguments`},
		{[]string{"-o", "json", "top"}, "top prints a table only"},
	} {
		_, _, err := ctl(t, srv, tt.args...)
		if err == nil || !strings.Contains(err.Error(), tt.want) || exitCode(err) != 2 {
			t.Errorf("clodexctl %v = %v (exit %d), want exit 2 with %q", tt.args, err, exitCode(err), tt.want)
		}
	}
}

// top --once samples twice, one interval apart, and prints one frame.
func TestTopOnce(t *testing.T) {
	srv := startServer(t)
	admitN(t, srv, acct1, 3)
	out, errOut, err := ctl(t, srv, "top", "--once", "--interval", "500ms")
	if err != nil || errOut != "" {
		t.Fatalf("top --once: %v, stderr %q", err, errOut)
	}
	row := topRowOf(t, out, account.Key(acct1))
	if row["RATE/MIN"] != "60" || row["ADMITS/MIN"] != "0.0" || row["AGENTS"] != "0/0" || row["403 TOTAL"] != "0" {
		t.Errorf("top --once row = %v, want rate 60, 0.0 admits/min over the interval, agents 0/0, 403s 0\n%s", row, out)
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("top --once to a pipe wrote terminal escapes:\n%q", out)
	}
}

// topRowOf parses the frame's table and returns the account's row by
// column name.
func topRowOf(t *testing.T, frame, key string) map[string]string {
	t.Helper()
	var header []string
	for _, line := range strings.Split(frame, "\n") {
		f := splitColumns(line)
		if len(f) > 0 && f[0] == "ACCOUNT" {
			header = f
			continue
		}
		if header != nil && len(f) > 0 && f[0] == key {
			if len(f) != len(header) {
				t.Fatalf("row %q has %d columns, header %d", line, len(f), len(header))
			}
			row := map[string]string{}
			for i, h := range header {
				row[h] = f[i]
			}
			return row
		}
	}
	return nil
}

// splitColumns splits a table line on runs of two or more spaces (cells
// such as "42 (adaptive)" hold one).
func splitColumns(line string) []string {
	var out []string
	for _, c := range regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1) {
		if c != "" {
			out = append(out, c)
		}
	}
	return out
}

// TestTopInTmux runs the real clodexctl binary in a tmux pane against a
// control plane, then admits, registers an agent and reports 403s, and
// reads the screen until the account's row shows them.
func TestTopInTmux(t *testing.T) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("tmux is not installed (Debian package tmux); CI must run the top test")
		}
		t.Skip("tmux is not installed (Debian package tmux)")
	}
	if testing.Short() {
		t.Skip("-short: builds clodexctl and drives it in tmux")
	}
	bin := filepath.Join(t.TempDir(), "clodexctl")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build clodexctl: %v\n%s", err, out)
	}
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, FleetTick: time.Hour})
	key := account.Key(acct1)

	session := fmt.Sprintf("clodexctl-top-%d", os.Getpid())
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tm := func(args ...string) (string, error) {
		out, err := exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
		return string(out), err
	}
	cmd := fmt.Sprintf("%s --control-plane %s --token-file %s top --interval 500ms", bin, srv.Addr, srv.AdminTokenFile)
	if out, err := tm("new-session", "-d", "-s", session, "-x", "200", "-y", "30", cmd); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = tm("kill-server") })
	screen := func() string {
		out, _ := tm("capture-pane", "-p", "-t", session)
		return out
	}
	waitScreen := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			s := screen()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("the screen never showed %s; last screen:\n%s", what, s)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitScreen("the header and an empty table", func(s string) bool {
		return strings.Contains(s, "clodexctl top  "+srv.Addr) && strings.Contains(s, "no known accounts yet")
	})

	// Load arrives: 15 admissions (10 admit, 4 wait, 1 refuse at the
	// default 60/min burst 10), an agent serving the account, 3 reported
	// 403s.
	admitN(t, srv, acct1, 15)
	a := runAgent(t, srv, clk, "host-1-1-aa", key)
	for range 3 {
		a.Report403(key, 0)
	}

	s := waitScreen("the account with its agent and 403s", func(s string) bool {
		row := topRowOf(t, s, key)
		return row != nil && row["AGENTS"] == "1/1" && row["403 TOTAL"] == "3"
	})
	row := topRowOf(t, s, key)
	if row["RATE/MIN"] != "60" || row["EFFECTIVE"] != "30 (adaptive)" || row["QUOTA"] != "-" {
		t.Errorf("row = %v, want rate 60, effective 30 (adaptive: the 403s halved it), quota -\n%s", row, s)
	}
	if !strings.Contains(s, "agents: 1 live of 1 registered") {
		t.Errorf("header does not count the live agent:\n%s", s)
	}
	// The account appeared in that frame, so it has no rate yet; the next
	// frame has one (0.0 with no new load).
	waitScreen("per-minute numbers for the account", func(s string) bool {
		row := topRowOf(t, s, key)
		_, err := strconv.ParseFloat(row["ADMITS/MIN"], 64)
		return err == nil
	})
	// More load: 5 admissions (the bucket is empty: refused) and 2 more
	// 403s show as per-minute rates in some frame.
	admitN(t, srv, acct1, 5)
	a.Report403(key, 0)
	a.Report403(key, 0)
	waitScreen("refusals and 403s per minute", func(s string) bool {
		row := topRowOf(t, s, key)
		ref, err1 := strconv.ParseFloat(row["REFUSALS/MIN"], 64)
		f403, err2 := strconv.ParseFloat(row["403/MIN"], 64)
		return err1 == nil && err2 == nil && ref > 0 && f403 > 0
	})
	waitScreen("5 upstream 403s in all", func(s string) bool { return topRowOf(t, s, key)["403 TOTAL"] == "5" })
	if _, err := tm("send-keys", "-t", session, "C-c"); err != nil {
		t.Fatal(err)
	}
	waitScreen("the shell-less pane to end or the alternate screen to close", func(s string) bool {
		_, err := tm("has-session", "-t", session)
		return err != nil || !strings.Contains(s, "clodexctl top")
	})
}

func TestHealth(t *testing.T) {
	srv := startServer(t)
	out, _, err := ctl(t, srv, "health")
	if err != nil || out != srv.Addr+" SERVING\n" {
		t.Errorf("health = %q, %v; want %q", out, err, srv.Addr+" SERVING\n")
	}
	// No token is needed: a probe has none.
	var o strings.Builder
	if err := runEnv(t.Context(), []string{"--control-plane", srv.Addr, "health"}, envMap(nil), &o, &o); err != nil {
		t.Errorf("health without a token: %v (%s)", err, o.String())
	}

	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(ok.Close)
	if out, _, err := ctl(t, srv, "health", ok.URL+"/healthz"); err != nil || !strings.Contains(out, "200 OK") {
		t.Errorf("health URL = %q, %v; want 200 OK", out, err)
	}
	if _, _, err := ctl(t, srv, "health", ok.URL+"/nope"); err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "404") {
		t.Errorf("health on a 404 = %v, want exit 1 naming 404", err)
	}
	if _, _, err := ctl(t, srv, "health", "ftp://x"); err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "not an http:// or https:// URL") {
		t.Errorf("health ftp://x = %v, want a usage error", err)
	}
	down := &strings.Builder{}
	err = runEnv(t.Context(), []string{"--control-plane", "127.0.0.1:1", "--timeout", "2s", "health"}, envMap(nil), down, down)
	if err == nil || exitCode(err) != 1 {
		t.Errorf("health of a closed port = %v, want exit 1", err)
	}
}
