package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/tlsconfig"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// clock is a fixed clock, so bucket levels in golden files are exact.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

const acct1 = "chatgpt-account-1"

func startServer(t *testing.T) *controlplanetest.Server {
	t.Helper()
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	return controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
}

// admitN admits n times for account id with the admin token: an
// operator's Admit needs no data plane to have registered the account.
func admitN(t *testing.T, srv *controlplanetest.Server, id string, n int) {
	t.Helper()
	client := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, nil))
	for range n {
		if _, err := client.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: account.Key(id)}); err != nil {
			t.Fatal(err)
		}
	}
}

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// ctl runs clodexctl in-process against srv with the admin token file.
func ctl(t *testing.T, srv *controlplanetest.Server, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb bytes.Buffer
	full := append([]string{"--control-plane", srv.Addr, "--token-file", srv.AdminTokenFile}, args...)
	err = runEnv(t.Context(), full, envMap(nil), &out, &errb)
	return out.String(), errb.String(), err
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestGolden(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, srv *controlplanetest.Server)
		args  []string
	}{
		{"get_table", func(t *testing.T, srv *controlplanetest.Server) { admitN(t, srv, acct1, 3) }, []string{"get", acct1}},
		{"get_json", func(t *testing.T, srv *controlplanetest.Server) { admitN(t, srv, acct1, 12) }, []string{"get", acct1, "-o", "json"}},
		{"get_key_json", func(t *testing.T, srv *controlplanetest.Server) { admitN(t, srv, acct1, 1) }, []string{"-o", "json", "get", "--key", account.Key(acct1)}},
		{"set_rate_table", nil, []string{"set-rate", acct1, "120", "--burst", "20"}},
		{"set_rate_zero_json", nil, []string{"set-rate", "--key", account.Key(acct1), "0", "-o", "json"}},
		{"set_budget_json", nil, []string{"set-budget", acct1, "--idle-timeout", "60s", "--max-retries", "3", "-o", "json"}},
		{"accounts_table", func(t *testing.T, srv *controlplanetest.Server) {
			admitN(t, srv, acct1, 2)
			admitN(t, srv, "chatgpt-account-2", 11)
			if _, _, err := ctl(t, srv, "set-rate", "chatgpt-account-3", "30"); err != nil {
				t.Fatal(err)
			}
		}, []string{"accounts"}},
		{"accounts_json", func(t *testing.T, srv *controlplanetest.Server) {
			admitN(t, srv, acct1, 2)
			admitN(t, srv, "chatgpt-account-2", 1)
		}, []string{"accounts", "-o", "json"}},
		{"accounts_empty_json", nil, []string{"-o", "json", "accounts"}},
		{"set_adaptive_table", nil, []string{"set-adaptive", acct1, "on"}},
		{"set_adaptive_off_json", nil, []string{"set-adaptive", "--key", account.Key(acct1), "off", "-o", "json"}},
		{"agents_empty_table", nil, []string{"agents"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startServer(t)
			if tt.setup != nil {
				tt.setup(t, srv)
			}
			out, errOut, err := ctl(t, srv, tt.args...)
			if err != nil || errOut != "" {
				t.Fatalf("clodexctl %v: %v, stderr %q", tt.args, err, errOut)
			}
			golden(t, tt.name, strings.ReplaceAll(out, srv.DataDir, "DATA_DIR"))
		})
	}
}

// get -o json prints one object with the keys scripts rely on, as JSON numbers.
func TestGetJSONContract(t *testing.T) {
	srv := startServer(t)
	admitN(t, srv, acct1, 1)
	out, _, err := ctl(t, srv, "get", acct1, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, out)
	}
	if dec.More() {
		t.Errorf("output holds more than one JSON value:\n%s", out)
	}
	// printf chatgpt-account-1 | sha256sum | cut -c1-16
	if m["account"] != acct1 || m["key"] != "acct_989eff5c06c62dbc" {
		t.Errorf("account, key = %v, %v", m["account"], m["key"])
	}
	want := map[string]string{"rate_per_minute": "60", "burst": "10", "tokens": "9", "wait_bound_ms": "4833",
		"idle_timeout_ms": "120000", "total_timeout_ms": "600000", "max_retries": "5", "effective_rate_per_minute": "60"}
	for k, v := range want {
		n, ok := m[k].(json.Number)
		if !ok || n.String() != v {
			t.Errorf("%s = %#v, want the JSON number %s", k, m[k], v)
		}
	}
}

func TestBadInput(t *testing.T) {
	srv := startServer(t)
	admitN(t, srv, acct1, 1)
	tests := []struct {
		name     string
		args     []string
		want     string
		exitCode int
	}{
		{"rate 601", []string{"set-rate", acct1, "601"}, "set-rate: rate_per_minute 601 is out of range; allowed 0..600", 2},
		{"rate abc", []string{"set-rate", acct1, "abc"}, `set-rate: RATE "abc" is not an integer; allowed 0..600`, 2},
		{"rate -1", []string{"set-rate", acct1, "-1"}, "set-rate: rate_per_minute -1 is out of range; allowed 0..600", 2},
		{"rate missing", []string{"set-rate", acct1}, "set-rate: missing RATE", 2},
		{"rate extra", []string{"set-rate", acct1, "5", "6"}, `set-rate: unexpected argument "6"`, 2},
		{"burst 0", []string{"set-rate", acct1, "60", "--burst", "0"}, `set-rate: invalid value "0" for flag -burst: out of range; allowed 1..1000`, 2},
		{"burst -1", []string{"set-rate", acct1, "60", "--burst", "-1"}, `invalid value "-1" for flag -burst: out of range; allowed 1..1000`, 2},
		{"burst abc", []string{"set-rate", acct1, "60", "--burst=abc"}, `invalid value "abc" for flag -burst: not an integer; allowed 1..1000`, 2},
		{"unknown account", []string{"get", "nobody"}, "get: account nobody is unknown to the control plane (key " + account.Key("nobody") + ")", 1},
		{"bad key", []string{"get", "--key", "acct_XYZ"}, `get: --key "acct_XYZ" is not an account key; want acct_ followed by 16 lowercase hex digits`, 2},
		{"no account", []string{"get"}, "get: missing ACCOUNT (the ChatGPT account id) or --key KEY", 2},
		{"unknown command", []string{"frob"}, `unknown command "frob"; allowed: set-rate, set-budget, set-adaptive, get, accounts, quota, usage, account, agents, agent, member, top, health`, 2},
		{"adaptive missing", []string{"set-adaptive", acct1}, "set-adaptive: missing on|off", 2},
		{"adaptive bad value", []string{"set-adaptive", acct1, "maybe"}, `set-adaptive: adaptive mode "maybe" is invalid; allowed on, off`, 2},
		{"adaptive extra", []string{"set-adaptive", acct1, "on", "x"}, `set-adaptive: unexpected argument "x"`, 2},
		{"adaptive bad key", []string{"set-adaptive", "--key", "acct_1", "on"}, `set-adaptive: --key "acct_1" is not an account key`, 2},
		{"agents extra", []string{"agents", "x"}, `agents: unexpected argument "x"; agents takes no arguments`, 2},
		{"unknown flag", []string{"get", acct1, "--frob"}, "get: flag provided but not defined: -frob", 2},
		{"bad output", []string{"accounts", "-o", "yaml"}, `accounts: -o "yaml" is invalid; allowed table, json`, 2},
		{"budget nothing", []string{"set-budget", acct1}, "set-budget: nothing to set; give at least one of --idle-timeout (10s..1h)", 2},
		{"budget idle", []string{"set-budget", acct1, "--idle-timeout", "5s"}, "set-budget: --idle-timeout 5s is out of range; allowed 10s..1h", 2},
		{"budget idle unit", []string{"set-budget", acct1, "--idle-timeout", "120"}, `invalid value "120" for flag -idle-timeout: not a duration; want a duration like 90s or 2m, 10s..1h`, 2},
		{"budget retries", []string{"set-budget", acct1, "--max-retries", "-1"}, "set-budget: --max-retries -1 is out of range; allowed 0..10", 2},
		{"budget retries abc", []string{"set-budget", acct1, "--max-retries", "abc"}, "not an integer; allowed 0..10", 2},
		{"budget retries do not fit", []string{"set-budget", acct1, "--idle-timeout", "10s", "--max-retries", "5"}, "set-budget: max_retries 5 does not fit the 10000ms idle timeout: its backoff ladder takes 62000ms; the largest that fits is 2", 2},
		{"budget total below idle", []string{"set-budget", acct1, "--total-timeout", "60s"}, "set-budget: budget idle_timeout_ms=120000 total_timeout_ms=60000 max_retries=5 is inconsistent and is not clamped", 2},
		{"accounts extra", []string{"accounts", "x"}, `accounts: unexpected argument "x"; accounts takes no arguments`, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := ctl(t, srv, tt.args...)
			if err == nil {
				t.Fatalf("clodexctl %v succeeded:\n%s", tt.args, out)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q\nwant it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
			if got := exitCode(err); got != tt.exitCode {
				t.Errorf("exit code = %d, want %d", got, tt.exitCode)
			}
			if out != "" {
				t.Errorf("stdout = %q, want nothing", out)
			}
		})
	}
	// Nothing changed on the server.
	out, _, err := ctl(t, srv, "get", acct1, "-o", "json")
	if err != nil || !strings.Contains(out, `"policy_version": 0`) {
		t.Errorf("after bad input: %v\n%s", err, out)
	}
}

func TestTokenProblems(t *testing.T) {
	srv := startServer(t)
	dir := t.TempDir()
	wrong := filepath.Join(dir, "wrong")
	if err := os.WriteFile(wrong, []byte("nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(env map[string]string, args ...string) error {
		return runEnv(t.Context(), args, envMap(env), &bytes.Buffer{}, &bytes.Buffer{})
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"no token", nil, []string{"--control-plane", srv.Addr, "accounts"}, "accounts: no admin token; pass --token-file FILE or set CLODEX_ADMIN_TOKEN"},
		{"wrong token", nil, []string{"--control-plane", srv.Addr, "--token-file", wrong, "accounts"}, "refused the token (Unauthenticated)"},
		{"agent token", nil, []string{"--control-plane", srv.Addr, "--token-file", srv.AgentTokenFile, "accounts"}, "denied the call (PermissionDenied): the token is not the admin token"},
		{"missing token file", nil, []string{"--control-plane", srv.Addr, "--token-file", filepath.Join(dir, "nope"), "accounts"}, "read token file: open"},
		{"unreachable", map[string]string{"CLODEX_ADMIN_TOKEN": "x"}, []string{"--control-plane", "127.0.0.1:1", "accounts"}, "the control plane at 127.0.0.1:1 is unavailable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(tt.env, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v\nwant it to contain %q", err, tt.want)
			}
			for _, tok := range []string{srv.AdminToken.Reveal(), srv.AgentToken.Reveal()} {
				if err != nil && strings.Contains(err.Error(), tok) {
					t.Errorf("error leaks a token: %v", err)
				}
			}
		})
	}
	// The environment alone is enough.
	env := map[string]string{"CLODEX_CONTROL_PLANE": srv.Addr, "CLODEX_ADMIN_TOKEN": srv.AdminToken.Reveal()}
	if err := run(env, "accounts"); err != nil {
		t.Errorf("accounts with CLODEX_CONTROL_PLANE and CLODEX_ADMIN_TOKEN: %v", err)
	}
}

func TestTLS(t *testing.T) {
	certs := controlplanetest.WriteCerts(t)
	serverTLS, err := tlsconfig.Server(certs.ServerCert, certs.ServerKey, certs.CA)
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplanetest.Start(t, &controlplanetest.Options{TLS: serverTLS})
	var out bytes.Buffer
	args := []string{"--control-plane", srv.Addr, "--token-file", srv.AdminTokenFile, "--tls-ca", certs.CA,
		"--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey, "-o", "json", "accounts"}
	if err := runEnv(t.Context(), args, envMap(nil), &out, &bytes.Buffer{}); err != nil || strings.TrimSpace(out.String()) != "[]" {
		t.Errorf("accounts over mutual TLS = %q, %v", out.String(), err)
	}
	args = []string{"--control-plane", srv.Addr, "--token-file", srv.AdminTokenFile, "--tls-ca", certs.CA, "--tls-cert", certs.ClientCert, "accounts"}
	if err := runEnv(t.Context(), args, envMap(nil), &out, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "--tls-cert and --tls-key must be given together") {
		t.Errorf("cert without key: %v", err)
	}
}

func TestHelpAndVersion(t *testing.T) {
	var out bytes.Buffer
	if err := runEnv(t.Context(), []string{"--version"}, envMap(nil), &out, &bytes.Buffer{}); err != nil || out.String() != "clodexctl dev\n" {
		t.Errorf("--version = %q, %v", out.String(), err)
	}
	out.Reset()
	if err := runEnv(t.Context(), []string{"help"}, envMap(nil), &out, &bytes.Buffer{}); err != nil || !strings.Contains(out.String(), "set-rate ACCOUNT RATE [--burst N]") {
		t.Errorf("help = %q, %v", out.String(), err)
	}
	var errOut bytes.Buffer
	err := runEnv(t.Context(), nil, envMap(nil), &out, &errOut)
	if err == nil || exitCode(err) != 2 || !strings.Contains(errOut.String(), "Usage: clodexctl") {
		t.Errorf("no command: %v, stderr %q", err, errOut.String())
	}
}

// The built binary against a real server: exit codes and streams as a
// script sees them.
func TestBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := filepath.Join(t.TempDir(), "clodexctl")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	srv := startServer(t)
	admitN(t, srv, acct1, 1)
	exe := func(args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(os.Environ(), "CLODEX_CONTROL_PLANE="+srv.Addr, "CLODEX_ADMIN_TOKEN="+srv.AdminToken.Reveal())
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return out.String(), errb.String(), code
	}
	out, errOut, code := exe("get", acct1, "-o", "json")
	var v map[string]any
	if code != 0 || errOut != "" || json.Unmarshal([]byte(out), &v) != nil || v["key"] != account.Key(acct1) {
		t.Errorf("get: code %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = exe("set-rate", acct1, "601")
	if code == 0 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "allowed 0..600") {
		t.Errorf("set-rate 601: code %d, stdout %q, stderr %q; want one line naming 0..600 and a non-zero exit", code, out, errOut)
	}
	_, errOut, code = exe("get", "unknown-account")
	if code == 0 || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "unknown to the control plane") {
		t.Errorf("get unknown: code %d, stderr %q", code, errOut)
	}
}

// clodexctl must not link the server: it talks to it only over gRPC.
func TestNoServerDeps(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	bad := map[string]bool{
		"github.com/clodex/clodex/controlplane":                  true,
		"github.com/clodex/clodex/controlplane/store":            true,
		"github.com/clodex/clodex/controlplane/store/redisstore": true,
		"testing": true,
	}
	for _, pkg := range strings.Fields(string(out)) {
		if bad[pkg] || strings.HasSuffix(pkg, "test") && strings.HasPrefix(pkg, "github.com/clodex/") {
			t.Errorf("clodexctl depends on %s", pkg)
		}
	}
}

// set-budget with only --idle-timeout lowers the retries by the budget
// rule; an explicit --max-retries that does not fit is refused (exit 2)
// naming the largest that fits.
func TestSetBudgetDerivesRetries(t *testing.T) {
	srv := startServer(t)
	out, _, err := ctl(t, srv, "set-budget", acct1, "--idle-timeout", "30s", "-o", "json")
	if err != nil {
		t.Fatalf("set-budget --idle-timeout 30s: %v", err)
	}
	var v struct {
		MaxRetries  int   `json:"max_retries"`
		IdleMs      int64 `json:"idle_timeout_ms"`
		WaitBoundMs int64 `json:"wait_bound_ms"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.MaxRetries != 3 || v.IdleMs != 30000 || v.WaitBoundMs != 2000 {
		t.Errorf("set-budget --idle-timeout 30s = %+v, want max_retries 3, idle 30000, wait bound 2000", v)
	}
	_, _, err = ctl(t, srv, "set-budget", acct1, "--idle-timeout", "30s", "--max-retries", "4")
	if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), "the largest that fits is 3") {
		t.Errorf("set-budget --idle-timeout 30s --max-retries 4 = %v (exit %d), want exit 2 naming 3", err, exitCode(err))
	}
}

// get and accounts name the Redis store, its address and the replica.
func TestStoreShownForRedis(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, RedisURL: rs.URL, Replica: "cp-7"})
	admitN(t, srv, acct1, 1)
	// redistest's redis-server keeps nothing on disk: every answer says so.
	want := "redis redis://" + rs.Addr + ", replica cp-7 of 1 live; WARNING: redis keeps no copy of its data on disk (appendonly no, save \"\")"
	out, _, err := ctl(t, srv, "get", acct1)
	if err != nil || !strings.Contains(out, "STORE           "+want) {
		t.Errorf("get = %v\n%s\nwant a STORE row %q", err, out, want)
	}
	out, _, err = ctl(t, srv, "accounts")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); err != nil || !strings.HasPrefix(lines[len(lines)-1], "store: "+want) {
		t.Errorf("accounts = %v\n%s\nwant a last line %q", err, out, "store: "+want)
	}
}
