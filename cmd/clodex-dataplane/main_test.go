package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/clienttest"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// envMap is an injected environment.
func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"unknown flag", []string{"--nope"}, nil, []string{"flag provided but not defined: -nope", "--help"}},
		{"stray argument", []string{"serve"}, nil, []string{`unexpected argument "serve"`}},
		{"every bad value at once", []string{"--listen", "nocolon", "--upstream-url", "ftp://x", "--log-level", "loud", "--admin-listen", "bad", "--refresh", "sometimes"}, nil,
			[]string{"--listen \"nocolon\"", "--upstream-url \"ftp://x\"", "--log-level \"loud\" is invalid; choices are debug, info, warn, error",
				"--admin-listen \"bad\"", "--refresh \"sometimes\" is invalid; choices are auto, never"}},
		{"network listener without key", []string{"--listen", "0.0.0.0:17645"}, nil, []string{"--api-key-file or --member-keys is required"}},
		{"bad token endpoint", []string{"--token-endpoint", "nope"}, nil, []string{"--token-endpoint \"nope\""}},
		{"bad shutdown grace", []string{"--shutdown-grace", "-1s"}, nil, []string{"--shutdown-grace -1s must be positive"}},
		{"fleet without token", []string{"--control-plane", "cp:17700"}, nil,
			[]string{"--control-plane needs the agent token: pass --agent-token-file FILE or set CLODEX_AGENT_TOKEN"}},
		{"fleet with a bad address and a data dir", []string{"--control-plane", "cp", "--data-dir", "/tmp/x"}, map[string]string{"CLODEX_AGENT_TOKEN": "t"},
			[]string{`--control-plane: control plane address 1 of 1 ("cp"): not host:port`, "--data-dir applies only to the embedded control plane"}},
		{"half a client certificate", []string{"--control-plane", "cp:1", "--agent-token-file", "f", "--tls-cert", "c.pem"}, nil,
			[]string{"--tls-cert and --tls-key must be given together"}},
		{"fleet flags without a fleet", []string{"--agent-token-file", "f", "--tls-ca", "ca.pem", "--tls-cert", "c", "--tls-key", "k"}, nil,
			[]string{"--agent-token-file applies only with --control-plane", "--tls-ca applies only with --control-plane",
				"--tls-cert applies only with --control-plane", "--tls-key applies only with --control-plane"}},
		{"token file from the environment without a fleet", nil, map[string]string{"CLODEX_AGENT_TOKEN_FILE": "f"},
			[]string{"--agent-token-file applies only with --control-plane"}},
		{"negative failure retries", []string{"--failure-retries", "-1"}, nil, []string{"--failure-retries -1 is out of range; allowed: 0..10"}},
		{"too many failure retries", []string{"--failure-retries", "11"}, nil, []string{"--failure-retries 11 is out of range; allowed: 0..10"}},
		{"usage-limit hold too short", []string{"--usage-limit-hold", "5s"}, nil, []string{"--usage-limit-hold 5s is out of range; allowed 10s..24h"}},
		{"usage-limit hold zero", []string{"--usage-limit-hold", "0s"}, nil, []string{"--usage-limit-hold 0s is out of range; allowed 10s..24h"}},
		{"usage-limit hold too long", []string{"--usage-limit-hold", "25h"}, nil, []string{"--usage-limit-hold 25h0m0s is out of range; allowed 10s..24h"}},
		{"usage-limit hold not a duration", []string{"--usage-limit-hold", "5"}, nil, []string{`invalid value "5" for flag -usage-limit-hold: not a duration; want e.g. 5m or 90s, allowed 10s..24h`}},
		{"usage-limit hold from a bad environment", nil, map[string]string{"CLODEX_USAGE_LIMIT_HOLD": "soon"},
			[]string{`CLODEX_USAGE_LIMIT_HOLD="soon" is not a duration; want e.g. 5m or 90s, allowed 10s..24h`}},
		{"usage-limit hold from the environment out of range", nil, map[string]string{"CLODEX_USAGE_LIMIT_HOLD": "48h"},
			[]string{"CLODEX_USAGE_LIMIT_HOLD=48h is out of range; allowed 10s..24h"}},
		{"member keys without a fleet", []string{"--member-keys"}, nil,
			[]string{"--member-keys needs --control-plane ADDR: the members and their keys live on the fleet's control plane"}},
		{"member keys from the environment without a fleet", nil, map[string]string{"CLODEX_MEMBER_KEYS": "true"},
			[]string{"--member-keys needs --control-plane ADDR"}},
		{"member keys with an API key", []string{"--member-keys", "--api-key-file", "k", "--control-plane", "cp:1", "--agent-token-file", "f"}, nil,
			[]string{"--member-keys and --api-key-file exclude each other"}},
		{"bad member keys variable", nil, map[string]string{"CLODEX_MEMBER_KEYS": "maybe"},
			[]string{`CLODEX_MEMBER_KEYS="maybe" is invalid; want true or false`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			err := runEnv(t.Context(), tt.args, envMap(tt.env), &stdout, &stderr)
			if err == nil {
				t.Fatal("run: no error")
			}
			if _, ok := err.(*usageError); !ok {
				t.Errorf("run error %T, want *usageError (exit 2)", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("run error %q, want it to mention %q", err, w)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
		})
	}
}

// --failure-retries N is N retries inside the data plane; 0 leaves them
// all to the client; the default is one.
func TestFailureRetriesFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, retry.DefaultFailureRetries},
		{[]string{"--failure-retries", "0"}, retry.NoFailureRetries},
		{[]string{"--failure-retries", "5"}, 5},
	} {
		cfg, err := loadConfig(tt.args, envMap(nil), io.Discard)
		if err != nil {
			t.Fatalf("loadConfig(%q): %v", tt.args, err)
		}
		if cfg.FailureRetries != tt.want {
			t.Errorf("loadConfig(%q).FailureRetries = %d, want %d", tt.args, cfg.FailureRetries, tt.want)
		}
	}
	cfg, err := loadConfig([]string{"--model-passthrough"}, envMap(nil), io.Discard)
	if err != nil || !cfg.ModelPassthrough {
		t.Errorf("--model-passthrough: %v, ModelPassthrough %v; want it set", err, cfg != nil && cfg.ModelPassthrough)
	}
}

// --usage-limit-hold (or CLODEX_USAGE_LIMIT_HOLD; the flag wins) is how
// long an account at a usage limit with no reset time is held out; 5m by
// default.
func TestUsageLimitHoldFlag(t *testing.T) {
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want time.Duration
	}{
		{nil, nil, 5 * time.Minute},
		{[]string{"--usage-limit-hold", "90s"}, nil, 90 * time.Second},
		{nil, map[string]string{"CLODEX_USAGE_LIMIT_HOLD": "20m"}, 20 * time.Minute},
		{[]string{"--usage-limit-hold", "1h"}, map[string]string{"CLODEX_USAGE_LIMIT_HOLD": "20m"}, time.Hour},
		{[]string{"--usage-limit-hold", "1h"}, map[string]string{"CLODEX_USAGE_LIMIT_HOLD": "garbage"}, time.Hour},
	} {
		cfg, err := loadConfig(tt.args, envMap(tt.env), io.Discard)
		if err != nil {
			t.Fatalf("loadConfig(%q, %v): %v", tt.args, tt.env, err)
		}
		if cfg.UsageLimitHold != tt.want {
			t.Errorf("loadConfig(%q, %v).UsageLimitHold = %v, want %v", tt.args, tt.env, cfg.UsageLimitHold, tt.want)
		}
	}
}

func TestRefreshDefault(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, "auto"},
		{[]string{"--control-plane", "cp:17700", "--agent-token-file", "f"}, "never"},
		{[]string{"--control-plane", "cp:17700", "--agent-token-file", "f", "--refresh", "auto"}, "auto"},
		{[]string{"--refresh", "never"}, "never"},
	}
	for _, tt := range tests {
		cfg, err := loadConfig(tt.args, envMap(nil), io.Discard)
		if err != nil {
			t.Fatalf("loadConfig(%q): %v", tt.args, err)
		}
		if cfg.Refresh != tt.want {
			t.Errorf("loadConfig(%q).Refresh = %q, want %q", tt.args, cfg.Refresh, tt.want)
		}
	}
}

func TestMissingAuthFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "auth.json")
	err := runEnv(t.Context(), []string{"--codex-auth", p, "--listen", "127.0.0.1:0"}, envMap(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("run = %v, want an error naming the missing %s", err, p)
	}
}

// A start that fails half-way (the API port is taken) closes what it had
// built: the embedded control plane, the agent (TestMain checks for leaked
// goroutines).
func TestListenerInUse(t *testing.T) {
	s := startSim(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	err = runEnv(t.Context(), append(s.args(), "--listen", l.Addr().String()), envMap(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "listen on --listen "+l.Addr().String()) {
		t.Errorf("run on a taken port = %v, want an error naming --listen %s", err, l.Addr())
	}
}

func TestDefaultCodexAuth(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"CODEX_HOME": "/opt/codex", "HOME": "/home/u"}, "/opt/codex/auth.json"},
		{map[string]string{"HOME": "/home/u"}, "/home/u/.codex/auth.json"},
	}
	for _, tt := range tests {
		if got := defaultCodexAuth(envMap(tt.env)); got != tt.want {
			t.Errorf("defaultCodexAuth(%v) = %q, want %q", tt.env, got, tt.want)
		}
	}
}

func TestVersion(t *testing.T) {
	var out strings.Builder
	if err := run(t.Context(), []string{"--version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if out.String() != "clodex-dataplane dev\n" {
		t.Errorf("--version printed %q, want \"clodex-dataplane dev\\n\"", out.String())
	}
}

// syncBuffer is a goroutine-safe stderr for run.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lineWriter hands the first line written to stdout to the test.
type lineWriter struct{ lines chan string }

func (w *lineWriter) Write(b []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		select {
		case w.lines <- l:
		default:
		}
	}
	return len(b), nil
}

// sim is an in-process clodex-sim accepting tok-cmd for acct-cmd, and an
// auth.json holding that token.
type sim struct {
	*codexsim.Server
	URL      string // http://127.0.0.1:port
	AuthFile string
}

const simAccount = "acct-cmd"

func startSim(t *testing.T) *sim { return startSimConfig(t, codexsim.Config{}) }

func startSimConfig(t *testing.T, cfg codexsim.Config) *sim {
	t.Helper()
	cfg.AcceptTokens = map[string]string{"tok-cmd": simAccount}
	s, err := codexsim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { ts.Close(); s.Close() })
	auth := filepath.Join(t.TempDir(), "auth.json")
	if err := os.WriteFile(auth, []byte(`{"auth_mode":"chatgpt","tokens":{"access_token":"tok-cmd","account_id":"`+simAccount+`"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	return &sim{Server: s, URL: ts.URL, AuthFile: auth}
}

func (s *sim) args() []string {
	return []string{"--codex-auth", s.AuthFile, "--upstream-url", "ws" + strings.TrimPrefix(s.URL, "http") + codexsim.ChatGPTPath,
		"--token-endpoint", s.URL + "/oauth/token"}
}

// running is a run in a goroutine.
type running struct {
	base   string // http://127.0.0.1:port
	stderr *syncBuffer
	cancel context.CancelFunc
	errc   chan error
}

// startRun runs the data plane until the test ends (or stop) and waits for
// its export line.
func startRun(t *testing.T, env map[string]string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{stderr: &syncBuffer{}, cancel: cancel, errc: make(chan error, 1)}
	stdout := &lineWriter{lines: make(chan string, 1)}
	go func() {
		r.errc <- runEnv(ctx, append([]string{"--listen", "127.0.0.1:0"}, args...), envMap(env), stdout, r.stderr)
	}()
	t.Cleanup(func() {
		if err := r.stop(t); err != nil {
			t.Errorf("run after cancel: %v\nstderr:\n%s", err, r.stderr)
		}
	})
	var line string
	select {
	case line = <-stdout.lines:
	case err := <-r.errc:
		t.Fatalf("run exited early: %v\nstderr:\n%s", err, r.stderr)
	}
	base, _, ok := strings.Cut(strings.TrimPrefix(line, "export ANTHROPIC_BASE_URL="), "  #")
	if !strings.HasPrefix(line, "export ANTHROPIC_BASE_URL=http://127.0.0.1:") || !ok ||
		!strings.Contains(line, "any ANTHROPIC_API_KEY works on loopback") && !strings.Contains(line, "set ANTHROPIC_API_KEY to your member key") {
		t.Fatalf("first stdout line = %q, want the export line for Claude Code", line)
	}
	r.base = base
	return r
}

// stop cancels the run and returns its error (once; later calls return nil).
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	err, ok := <-r.errc
	if ok {
		close(r.errc)
	}
	return err
}

// turn sends one non-streaming turn and returns the reply's text.
func turn(t *testing.T, base, prompt string) string {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	body := `{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":` + jsonString(prompt) + `}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages?beta=true", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "anything")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var msg struct{ Content []struct{ Text string } }
	if err := json.Unmarshal(raw, &msg); err != nil || resp.StatusCode != 200 || len(msg.Content) != 1 {
		t.Fatalf("POST /v1/messages = %d %s, want 200 with one text block", resp.StatusCode, raw)
	}
	return msg.Content[0].Text
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

var adminAddrRE = regexp.MustCompile(`msg="admin listener" addr=(\S+)`)

// metric returns the lines of the admin listener's /metrics starting with name.
func metric(t *testing.T, stderr, name string) []string {
	t.Helper()
	m := adminAddrRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no admin listener address in the log:\n%s", stderr)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + m[1] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), name) {
			lines = append(lines, sc.Text())
		}
	}
	return lines
}

// One command, no control plane configured: the embedded control plane
// admits the turn's new socket over gRPC, the turn is answered end to end,
// and the environment's notices are printed once.
func TestEmbeddedTurn(t *testing.T) {
	s := startSim(t)
	env := map[string]string{
		"CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN": "fast",
		"CLODEX_UPSTREAM_MAX_RETRIES":           "lots",
		"CLODEX_WS_MAX_CONNECTIONS":             "-3",
	}
	r := startRun(t, env, append(s.args(), "--admin-listen", "127.0.0.1:0")...)
	if got := turn(t, r.base, "#sim reply through the binary"); got != "through the binary" {
		t.Errorf("reply = %q, want \"through the binary\"", got)
	}
	if got, want := metric(t, r.stderr.String(), `clodex_controlplane_admissions_total{decision="admit"}`),
		[]string{`clodex_controlplane_admissions_total{decision="admit"} 1`}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("embedded control plane admissions = %q, want %q", got, want)
	}
	if s.Stats().Upgrades != 1 {
		t.Errorf("sim upgrades = %d, want 1", s.Stats().Upgrades)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	out := r.stderr.String()
	for _, w := range []string{
		`clodex-dataplane: ignoring CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN="fast"`,
		`clodex-dataplane: ignoring CLODEX_UPSTREAM_MAX_RETRIES="lots"`,
		`clodex-dataplane: ignoring CLODEX_WS_MAX_CONNECTIONS`,
	} {
		if n := strings.Count(out, w); n != 1 {
			t.Errorf("stderr has %q %d times, want once:\n%s", w, n, out)
		}
	}
}

// An upgrade the backend refuses with 403 reaches the control plane as the
// agent's upstream-403 report.
func TestUpstream403Reported(t *testing.T) {
	s := startSimConfig(t, codexsim.Config{UpgradeLimit: 1})
	env := map[string]string{"CLODEX_UPSTREAM_MAX_RETRIES": "0"}
	r := startRun(t, env, append(s.args(), "--admin-listen", "127.0.0.1:0")...)
	turn(t, r.base, "#sim reply first")
	resp := post(t, r.base, `{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":"#sim reply second"}]}`)
	if resp.StatusCode == 200 {
		t.Fatalf("second turn = 200, want the throttled upgrade's error")
	}
	if s.Stats().Upgrade403s != 1 {
		t.Fatalf("sim 403s = %d, want 1", s.Stats().Upgrade403s)
	}
	const want = "clodex_controlplane_upstream_403_total 1"
	var got []string
	waitFor(t, func() bool { // the report travels on the agent's stream
		got = metric(t, r.stderr.String(), "clodex_controlplane_upstream_403_total")
		return strings.Join(got, "\n") == want
	}, func() string { return fmt.Sprintf("embedded control plane 403 reports = %q, want %q", got, want) })
}

// waitFor polls cond until it holds, failing with msg() after 30 s: for
// effects that travel asynchronously (the agent's stream).
func waitFor(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// post sends body to /v1/messages and returns the response, body read.
func post(t *testing.T, base, body string) *http.Response {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatalf("read the response to POST /v1/messages: %v", err)
	}
	resp.Body.Close()
	return resp
}

// --data-dir: the embedded control plane loads its policies from
// DIR/policy.json (creating DIR) and pushes them to the data plane; a
// malformed file is an error naming it.
func TestEmbeddedDataDir(t *testing.T) {
	s := startSim(t)
	dir := filepath.Join(t.TempDir(), "state", "clodex")
	r := startRun(t, nil, append(s.args(), "--data-dir", dir)...)
	turn(t, r.base, "#sim reply ok")
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("--data-dir %s: %v, %v; want a directory with mode 0700", dir, fi, err)
	}

	key := account.Key(simAccount)
	policy := `{"format":1,"version":1,"accounts":{"` + key + `":{"version":1,"rate_per_minute":7,"burst":3,` +
		`"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`
	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	r = startRun(t, nil, append(s.args(), "--data-dir", dir)...)
	pushed := fmt.Sprintf(`msg="policy from the control plane" account=%s rate_per_minute=7 burst=3`, key)
	waitFor(t, func() bool { return strings.Contains(r.stderr.String(), pushed) },
		func() string { return fmt.Sprintf("log has no %q:\n%s", pushed, r.stderr) })
	if got := turn(t, r.base, "#sim reply again"); got != "again" {
		t.Errorf("reply = %q, want \"again\"", got)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}

	if err := os.WriteFile(filepath.Join(dir, "policy.json"), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := runEnv(t.Context(), append(s.args(), "--listen", "127.0.0.1:0", "--data-dir", dir), envMap(nil), io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--data-dir") || !strings.Contains(err.Error(), "policy.json") {
		t.Errorf("run with a malformed policy.json = %v, want an error naming --data-dir and the file", err)
	}
}

// In a fleet: the remote control plane admits the turn, lists this data
// plane as an agent serving the account while it runs, and drops it when
// it stops (goodbye). auth.json is not refreshed by default.
func TestRemoteControlPlane(t *testing.T) {
	s := startSim(t)
	cp := controlplanetest.Start(t, nil)
	r := startRun(t, nil, append(s.args(), "--control-plane", cp.Addr, "--agent-token-file", cp.AgentTokenFile)...)
	if got := turn(t, r.base, "#sim reply fleet"); got != "fleet" {
		t.Errorf("reply = %q, want \"fleet\"", got)
	}
	key := account.Key(simAccount)
	acct, err := cp.Store().Account(t.Context(), key, time.Now())
	if err != nil {
		t.Fatalf("remote control plane has no account %s after a turn: %v", key, err)
	}
	if acct.Tokens >= float64(acct.Policy.Burst) {
		t.Errorf("remote bucket holds %v tokens of %d, want one spent by the Admit", acct.Tokens, acct.Policy.Burst)
	}
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	var agents *controlplanev1.ListAgentsResponse
	waitFor(t, func() bool { // the agent's stream is opened beside the turn; wait for its hello
		if agents, err = admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{}); err != nil {
			t.Fatal(err)
		}
		return len(agents.GetAgents()) > 0
	}, func() string { return "the remote control plane lists no agent" })
	if a := agents.GetAgents(); len(a) != 1 || a[0].GetVersion() != "dev" || strings.Join(a[0].GetAccounts(), ",") != key {
		t.Errorf("agents = %v, want this data plane serving %s", a, key)
	}
	// A policy the operator sets is pushed to this data plane (its local
	// fallback paces at it while the control plane is away).
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 7, Burst: proto.Int32(3)}); err != nil {
		t.Fatal(err)
	}
	pushed := fmt.Sprintf(`msg="policy from the control plane" account=%s rate_per_minute=7 burst=3 live_agents=1`, key)
	waitFor(t, func() bool { return strings.Contains(r.stderr.String(), pushed) },
		func() string { return fmt.Sprintf("log has no %q:\n%s", pushed, r.stderr) })
	if !strings.Contains(r.stderr.String(), "refresh=never") {
		t.Errorf("log does not say refresh=never in a fleet:\n%s", r.stderr)
	}
	if err := r.stop(t); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	agents, err = admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(agents.GetAgents()) != 0 {
		t.Errorf("agents after shutdown = %v, want none (the data plane deregisters)", agents.GetAgents())
	}
}

// A fleet whose control plane is down is not an outage: turns are admitted
// locally and the user is told once.
func TestRemoteControlPlaneDown(t *testing.T) {
	s := startSim(t)
	tok := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(tok, []byte("secret-agent-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, nil, append(s.args(), "--control-plane", freeAddr(t), "--agent-token-file", tok)...)
	for _, want := range []string{"one", "two"} {
		if got := turn(t, r.base, "#sim reply "+want); got != want {
			t.Errorf("reply = %q, want %q", got, want)
		}
	}
	if err := r.stop(t); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	out := r.stderr.String()
	if n := strings.Count(out, "admitting new upstream connections locally"); n != 1 {
		t.Errorf("the local-admission notice appears %d times, want once:\n%s", n, out)
	}
	if strings.Contains(out, "secret-agent-token") {
		t.Errorf("the agent token reached the log:\n%s", out)
	}
}

// The control plane over mutual TLS, with the clodexctl-style flags.
func TestRemoteControlPlaneTLS(t *testing.T) {
	certs := controlplanetest.WriteCerts(t)
	serverTLS, err := tlsconfig.Server(certs.ServerCert, certs.ServerKey, certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	s := startSim(t)
	cp := controlplanetest.Start(t, &controlplanetest.Options{TLS: serverTLS})
	r := startRun(t, nil, append(s.args(), "--control-plane", cp.Addr, "--agent-token-file", cp.AgentTokenFile,
		"--tls-ca", certs.CA, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)...)
	turn(t, r.base, "#sim reply tls")
	if _, err := cp.Store().Account(t.Context(), account.Key(simAccount), time.Now()); err != nil {
		t.Errorf("the TLS control plane saw no Admit: %v\nstderr:\n%s", err, r.stderr)
	}
	if strings.Contains(r.stderr.String(), "locally") {
		t.Errorf("admission fell back to the local bucket:\n%s", r.stderr)
	}
}

// --ws-diagnostics appends one ws_head_decision line per request to its file.
func TestWSDiagnostics(t *testing.T) {
	s := startSim(t)
	path := filepath.Join(t.TempDir(), "ws.jsonl")
	r := startRun(t, nil, append(s.args(), "--ws-diagnostics", path, "--log-level", "error")...)
	turn(t, r.base, "#sim reply one")
	turn(t, r.base, "#sim reply two")
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), `"ws_head_decision"`); n != 2 {
		t.Errorf("%s has %d ws_head_decision lines, want 2:\n%s", path, n, b)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s mode = %v, %v; want 0600", path, fi.Mode().Perm(), err)
	}
}

// Several data planes on one host run side by side: each embedded control
// plane is in-process, and nothing else listens by default.
func TestSideBySide(t *testing.T) {
	s := startSim(t)
	a := startRun(t, nil, append(s.args(), "--log-level", "error")...)
	b := startRun(t, nil, append(s.args(), "--log-level", "error")...)
	if a.base == b.base {
		t.Fatalf("both data planes listen on %s", a.base)
	}
	if got := turn(t, a.base, "#sim reply a"); got != "a" {
		t.Errorf("first data plane replied %q, want \"a\"", got)
	}
	if got := turn(t, b.base, "#sim reply b"); got != "b" {
		t.Errorf("second data plane replied %q, want \"b\"", got)
	}
}

// On shutdown a turn still in flight after --shutdown-grace is ended: the
// client gets 503 and the upstream socket is closed (the sim sees it go).
func TestShutdownEndsStalledTurn(t *testing.T) {
	s := startSim(t)
	r := startRun(t, nil, append(s.args(), "--shutdown-grace", "50ms", "--log-level", "error")...)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, r.base+"/v1/messages",
		strings.NewReader(`{"model":"gpt-5.5","max_tokens":100,"stream":true,"messages":[{"role":"user","content":"#sim stall"}]}`))
	req.Header.Set("Content-Type", "application/json")
	respc := make(chan *http.Response, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Errorf("POST: %v", err)
		}
		respc <- resp
	}()
	waitFor(t, func() bool { return s.Stats().Responses > 0 }, // the turn is in flight upstream
		func() string { return "the turn never reached the emulator" })
	r.cancel()
	if resp := <-respc; resp != nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), "shutting down") {
			t.Errorf("in-flight turn got %d %s, want an error naming the shutdown", resp.StatusCode, body)
		}
	}
	if err := r.stop(t); err != nil {
		t.Errorf("run = %v, want nil", err)
	}
	waitFor(t, func() bool { return s.Stats().OpenSockets == 0 },
		func() string {
			return fmt.Sprintf("%d upstream sockets still open after shutdown", s.Stats().OpenSockets)
		})
}

// buildBinary builds clodex-dataplane into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "clodex-dataplane")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// The real binary: --version, then one turn against the sim and a clean
// exit on SIGTERM.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || string(out) != "clodex-dataplane dev\n" {
		t.Fatalf("clodex-dataplane --version = %q, %v; want \"clodex-dataplane dev\\n\"", out, err)
	}

	s := startSim(t)
	cmd := exec.Command(bin, append(s.args(), "--listen", "127.0.0.1:0", "--log-level", "error")...)
	cmd.Env = append(os.Environ(), "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=0")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }() // fails only when it has already exited
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("read the export line: %v\nstderr:\n%s", err, stderr.String())
	}
	base, _, _ := strings.Cut(strings.TrimPrefix(line, "export ANTHROPIC_BASE_URL="), "  #")
	if got := turn(t, base, "#sim reply from the binary"); got != "from the binary" {
		t.Errorf("reply = %q, want \"from the binary\"", got)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM clodex-dataplane: %v\nstderr:\n%s", err, stderr.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("clodex-dataplane after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
	}
	if n := strings.Count(stderr.String(), "not pacing new OpenAI connections: CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=0"); n != 1 {
		t.Errorf("the pacing-off notice was printed %d times, want once:\n%s", n, stderr.String())
	}
}

// `make run` from a fresh HOME: scripts/run.sh builds, starts clodex-sim
// with its own credentials, prints the export line, and answers a turn.
func TestRunScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary")
	}
	clienttest.Tool(t, "make", "apt-get install make") // fails under CI, skips otherwise
	// A fresh HOME (no ~/.codex/auth.json), but Go's caches stay where they
	// are so `make build` does not download or rebuild everything.
	goenv, err := exec.Command("go", "env", "GOCACHE", "GOMODCACHE", "GOPATH").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	dirs := strings.Split(strings.TrimSpace(string(goenv)), "\n")
	if len(dirs) != 3 {
		t.Fatalf("go env printed %q, want three lines", goenv)
	}
	home := t.TempDir()
	cmd := exec.Command("bash", "../../scripts/run.sh", "--log-level", "error")
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_STATE_HOME="+filepath.Join(home, "state"), "CODEX_HOME=",
		"GOCACHE="+dirs[0], "GOMODCACHE="+dirs[1], "GOPATH="+dirs[2],
		"CLODEX_LISTEN="+freeAddr(t), "CLODEX_SIM_LISTEN="+freeAddr(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		// The script, clodex-sim and clodex-dataplane. Kill fails only when
		// the whole group has exited; Wait then says how.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		return cmd.Wait()
	}
	defer func() { // after a failure; the passing path checks stop below
		if err := stop(); err != nil {
			t.Errorf("run.sh after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
		}
	}()
	sc := bufio.NewScanner(stdout)
	var lines []string
	var base string
	for base == "" && sc.Scan() {
		lines = append(lines, sc.Text())
		if b, ok := strings.CutPrefix(sc.Text(), "export ANTHROPIC_BASE_URL="); ok {
			base, _, _ = strings.Cut(b, "  #")
		}
	}
	if base == "" {
		t.Fatalf("run.sh printed no export line; stdout:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), stderr.String())
	}
	if !strings.Contains(strings.Join(lines, "\n"), "starting clodex-sim") {
		t.Errorf("run.sh did not say it uses the emulator; stdout:\n%s", strings.Join(lines, "\n"))
	}
	go func() { _, _ = io.Copy(io.Discard, stdout) }() // ends when Wait closes the pipe
	if got := turn(t, base, "#sim reply from make run"); got != "from make run" {
		t.Errorf("reply = %q, want \"from make run\"", got)
	}
	if err := stop(); err != nil {
		t.Errorf("run.sh after SIGTERM: %v\nstderr:\n%s", err, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(home, "state", "clodex", "sim", "auth.json")); err != nil {
		t.Errorf("the emulator's credentials are not in the private state folder: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// The data plane's packages never import the control plane's (embedded
// mode is wired in internal/node, outside dataplane/), and neither the
// assembly nor the binary links test code.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "../../dataplane/...").Output()
	if err != nil {
		t.Fatalf("go list dataplane: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/clodex/clodex/controlplane") || strings.HasPrefix(dep, "github.com/clodex/clodex/internal/node") {
			t.Errorf("a package under dataplane/ imports %s", dep)
		}
	}
	for _, pkg := range []string{".", "../../internal/node"} {
		out, err = exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		for _, dep := range deps {
			if dep == "testing" || strings.HasPrefix(dep, "github.com/clodex/clodex/internal/codexsim") ||
				strings.HasPrefix(dep, "github.com/clodex/clodex/controlplane/controlplanetest") {
				t.Errorf("%s imports %s", pkg, dep)
			}
		}
		for _, want := range []string{"github.com/clodex/clodex/controlplane", "google.golang.org/grpc/test/bufconn"} {
			if !strings.Contains(" "+strings.Join(deps, " ")+" ", " "+want+" ") {
				t.Errorf("%s does not import %s; the embedded control plane is missing", pkg, want)
			}
		}
	}
}

// --codex-auth may be repeated: the first file is CodexAuth, the others
// ExtraCodexAuth, in order.
func TestRepeatedCodexAuth(t *testing.T) {
	cfg, err := loadConfig([]string{"--codex-auth", "/a/auth.json", "--codex-auth", "/b/auth.json", "--codex-auth", "/c/auth.json"}, envMap(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CodexAuth != "/a/auth.json" || len(cfg.ExtraCodexAuth) != 2 || cfg.ExtraCodexAuth[0] != "/b/auth.json" || cfg.ExtraCodexAuth[1] != "/c/auth.json" {
		t.Fatalf("CodexAuth %q, ExtraCodexAuth %q; want /a/auth.json then [/b/auth.json /c/auth.json]", cfg.CodexAuth, cfg.ExtraCodexAuth)
	}
}
