package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/memlimit"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func noEnv(string) (string, bool) { return "", false }

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// syncBuffer is a bytes.Buffer safe for the server's concurrent logging.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type running struct {
	grpcAddr, adminAddr string
	stderr              *syncBuffer
	stop                func() error
}

func start(t *testing.T, args []string, env func(string) (string, bool)) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	r := &running{stderr: &syncBuffer{}}
	addrs := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- runEnv(ctx, args, env, io.Discard, r.stderr, func(g, a string) { addrs <- [2]string{g, a} })
	}()
	select {
	case a := <-addrs:
		r.grpcAddr, r.adminAddr = a[0], a[1]
	case err := <-done:
		cancel()
		t.Fatalf("run returned before listening: %v\n%s", err, r.stderr.String())
	}
	var once sync.Once
	var stopErr error
	r.stop = func() error {
		once.Do(func() {
			cancel() // what SIGTERM does through signal.NotifyContext
			stopErr = <-done
		})
		return stopErr
	}
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func dial(t *testing.T, addr, token string) *grpc.ClientConn {
	t.Helper()
	tok, err := bearer.Parse(token)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func TestRunServesAndStops(t *testing.T) {
	dir := t.TempDir()
	adminFile := writeFile(t, dir, "admin.token", "admin-secret-1\n", 0o600)
	agentFile := writeFile(t, dir, "agent.token", "  agent-secret-1  ", 0o644) // loose mode: a warning
	dataDir := filepath.Join(dir, "data")
	args := []string{"--listen", "127.0.0.1:0", "--data-dir", dataDir, "--admin-token-file", adminFile,
		"--agent-token-file", agentFile, "--admin-listen", "127.0.0.1:0", "--shutdown-grace", "2s",
		"--cold-start", "0"} // buckets start full, so the first Admit is admitted at once
	r := start(t, args, noEnv)

	key := "acct_0123456789abcdef"
	admin := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "admin-secret-1"))
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 42, Burst: proto.Int32(7)}); err != nil {
		t.Fatal(err)
	}
	admission := controlplanev1.NewAdmissionServiceClient(dial(t, r.grpcAddr, "agent-secret-1"))
	resp, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetDecision() != controlplanev1.Decision_DECISION_ADMIT || resp.GetPolicyVersion() != 1 {
		t.Errorf("Admit = %v, want ADMIT under policy version 1", resp)
	}
	if _, err := healthpb.NewHealthClient(dial(t, r.grpcAddr, "agent-secret-1")).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("health: %v", err)
	}

	httpResp, err := http.Get("http://" + r.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(httpResp.Body)
	httpResp.Body.Close()
	for _, want := range []string{`clodex_controlplane_admissions_total{decision="admit"} 1`, `clodex_controlplane_account_rate_per_minute{account="` + key + `"} 42`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if err := r.stop(); err != nil {
		t.Errorf("run after cancel = %v, want nil", err)
	}
	logs := r.stderr.String()
	if !strings.Contains(logs, "readable by group or others") {
		t.Errorf("no warning about the agent token file's mode in:\n%s", logs)
	}
	for _, secret := range []string{"admin-secret-1", "agent-secret-1"} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs leak a token:\n%s", logs)
		}
	}
	if !strings.Contains(logs, "shutting down") {
		t.Errorf("no shutdown log in:\n%s", logs)
	}

	// The policy survives a restart of the binary's run.
	r2 := start(t, args, noEnv)
	admin = controlplanev1.NewAdminServiceClient(dial(t, r2.grpcAddr, "admin-secret-1"))
	got, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAccount().GetRatePerMinute() != 42 || got.GetAccount().GetBurst() != 7 || got.GetAccount().GetPolicyVersion() != 1 {
		t.Errorf("after restart = %v, want 42/min burst 7 version 1", got.GetAccount())
	}
}

// TestRunAdminListenerToken: an admin listener on 0.0.0.0 starts only with
// --metrics-token-file, and then /metrics requires the token; pprof is
// off unless asked for.
func TestRunAdminListenerToken(t *testing.T) {
	dir := t.TempDir()
	metrics := writeFile(t, dir, "metrics.token", "metrics-secret-1\n", 0o644) // loose mode: a warning
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "a", "CLODEX_AGENT_TOKEN": "b"})
	r := start(t, []string{"--listen", "127.0.0.1:0", "--data-dir", dir, "--admin-listen", "0.0.0.0:0", "--metrics-token-file", metrics}, env)
	_, port, _ := net.SplitHostPort(r.adminAddr)
	get := func(path, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://127.0.0.1:"+port+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/metrics", ""); code != http.StatusUnauthorized || !strings.Contains(body, "--metrics-token-file") {
		t.Errorf("/metrics without the token = %d %q; want 401 naming --metrics-token-file", code, body)
	}
	if code, _ := get("/metrics", "admin-secret-1"); code != http.StatusUnauthorized {
		t.Errorf("/metrics with a wrong token = %d; want 401", code)
	}
	if code, body := get("/metrics", "metrics-secret-1"); code != http.StatusOK || !strings.Contains(body, "clodex_controlplane_") {
		t.Errorf("/metrics with the token = %d %.200q; want 200 with the control plane's metrics", code, body)
	}
	if code, _ := get("/debug/pprof/", "metrics-secret-1"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof = %d; want 404", code)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	logs := r.stderr.String()
	if !strings.Contains(logs, "--metrics-token-file: token file") || strings.Contains(logs, "metrics-secret-1") {
		t.Errorf("want a mode warning and no token in the log:\n%s", logs)
	}
}

func TestRunTokensFromEnv(t *testing.T) {
	env := envMap(map[string]string{
		"CLODEX_ADMIN_TOKEN": " env-admin ", "CLODEX_AGENT_TOKEN": "env-agent",
		"CLODEX_DATA_DIR": t.TempDir(), "CLODEX_CONTROLPLANE_LISTEN": "127.0.0.1:0",
		"CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN": "120",
	})
	r := start(t, nil, env)
	admin := controlplanev1.NewAdminServiceClient(dial(t, r.grpcAddr, "env-admin"))
	admission := controlplanev1.NewAdmissionServiceClient(dial(t, r.grpcAddr, "env-agent"))
	key := "acct_00000000000000aa"
	// A data plane registers the account on its agent stream (agent token).
	stream, err := controlplanev1.NewAgentServiceClient(dial(t, r.grpcAddr, "env-agent")).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: "dp-1", CapabilityVersion: 1, Accounts: []string{key},
	}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("agent stream with the agent token from the environment: %v", err)
	}
	if _, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
		t.Fatal(err)
	}
	got, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAccount().GetRatePerMinute() != 120 {
		t.Errorf("default rate = %d, want 120 from %s", got.GetAccount().GetRatePerMinute(), "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN")
	}
}

func TestRunBadInput(t *testing.T) {
	dir := t.TempDir()
	admin := writeFile(t, dir, "admin.token", "a", 0o600)
	agent := writeFile(t, dir, "agent.token", "b", 0o600)
	same := writeFile(t, dir, "same.token", "a", 0o600)
	empty := writeFile(t, dir, "empty.token", " \n", 0o600)
	looseKey := writeFile(t, dir, "loose.key", "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\n", 0o644)
	shortKey := writeFile(t, dir, "short.key", "MDEyMzQ1Njc4OWFiY2RlZg==\n", 0o600)
	base := []string{"--data-dir", filepath.Join(dir, "d"), "--admin-token-file", admin, "--agent-token-file", agent}
	with := func(extra ...string) []string { return append(append([]string{}, base...), extra...) }
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"unknown flag", []string{"--bogus"}, nil, "flag provided but not defined: -bogus"},
		{"positional", with("extra"), nil, `unexpected argument "extra"`},
		{"nothing", nil, nil, "--data-dir is required (or CLODEX_DATA_DIR), or --redis; --admin-token-file or CLODEX_ADMIN_TOKEN is required; --agent-token-file or CLODEX_AGENT_TOKEN is required"},
		{"redis timeout", with("--redis", "redis://127.0.0.1:1", "--redis-timeout", "0s"), nil, "--redis-timeout 0s is out of range; allowed 1ms..5s"},
		{"redis max timeout below the shortest", with("--redis", "redis://127.0.0.1:1", "--redis-timeout", "200ms", "--redis-max-timeout", "150ms"), nil, "--redis-max-timeout 150ms is out of range; allowed --redis-timeout (200ms)..30s"},
		{"redis max timeout too long", with("--redis", "redis://127.0.0.1:1", "--redis-max-timeout", "1m"), nil, "--redis-max-timeout 1m0s is out of range; allowed --redis-timeout (100ms)..30s"},
		{"redis cold start", with("--redis", "redis://127.0.0.1:1", "--cold-start", "1m"), nil, "--cold-start applies to the memory store only"},
		{"redis prefix", with("--redis", "redis://127.0.0.1:1", "--redis-prefix", "a b"), nil, `--redis-prefix "a b" is invalid`},
		{"replica id", with("--redis", "redis://127.0.0.1:1", "--replica", "a b"), nil, `--replica "a b" has a byte 0x20 at 1`},
		{"redis scheme", with("--redis", "http://user:hunter2@127.0.0.1:1"), nil, `redis URL "http://REDACTED@127.0.0.1:1" is invalid; want redis://`},
		{"rate abc", with("--default-rate", "abc"), nil, `invalid value "abc" for flag -default-rate: not an integer; allowed 0..600`},
		{"rate 601", with("--default-rate", "601"), nil, "--default-rate: rate_per_minute 601 is out of range; allowed 0..600"},
		{"rate -1", with("--default-rate", "-1"), nil, "--default-rate: rate_per_minute -1 is out of range; allowed 0..600"},
		{"burst 0", with("--default-burst", "0"), nil, "--default-burst: burst 0 is out of range; allowed 1..1000"},
		{"bad listen", with("--listen", "nonsense"), nil, `--listen "nonsense" is invalid; want host:port`},
		{"bad port", with("--listen", "127.0.0.1:99999"), nil, `--listen "127.0.0.1:99999" has an invalid port; allowed 0..65535`},
		{"bad level", with("--log-level", "loud"), nil, `--log-level "loud" is invalid; allowed debug, info, warn, error`},
		{"bad format", with("--log-format", "xml"), nil, `--log-format "xml" is invalid; allowed text, json`},
		{"grace", with("--shutdown-grace", "0s"), nil, "--shutdown-grace 0s is out of range; allowed 1ms..1m"},
		{"cold start", with("--cold-start", "-1s"), nil, "--cold-start -1s is out of range; allowed 0..10m"},
		{"grace unit", with("--shutdown-grace", "5"), nil, `invalid value "5" for flag -shutdown-grace`},
		{"cert without key", with("--tls-cert", admin), nil, "--tls-cert and --tls-key must be given together"},
		{"client ca alone", with("--client-ca", admin), nil, "--client-ca needs --tls-cert and --tls-key"},
		{"same tokens", []string{"--data-dir", dir, "--admin-token-file", admin, "--agent-token-file", same}, nil, "the admin and agent tokens are the same; they must differ"},
		{"empty token file", []string{"--data-dir", dir, "--admin-token-file", empty, "--agent-token-file", agent}, nil, "admin token: read token file " + empty + ": token is empty"},
		{"missing token file", []string{"--data-dir", dir, "--admin-token-file", filepath.Join(dir, "nope"), "--agent-token-file", agent}, nil, "admin token: read token file: open"},
		{"empty env token", []string{"--data-dir", dir, "--agent-token-file", agent}, map[string]string{"CLODEX_ADMIN_TOKEN": "   "}, "--admin-token-file or CLODEX_ADMIN_TOKEN is required"},
		{"loose credential key", with("--credential-key-file", looseKey), nil, "--credential-key-file: credential key file " + looseKey + " has mode -rw-r--r--: it is readable by group or others; chmod 600 it"},
		{"short credential key", with("--credential-key-file", shortKey), nil, "the key decodes to 16 bytes; want exactly 32 (head -c 32 /dev/urandom | base64)"},
		{"missing credential key", with("--credential-key-file", filepath.Join(dir, "nope.key")), nil, "--credential-key-file: credential key file: stat"},
		{"token endpoint", with("--token-endpoint", "ftp://x"), nil, `--token-endpoint: token endpoint "ftp://x" is invalid; want an http or https URL`},
		{"bad tls files", with("--tls-cert", admin, "--tls-key", agent), nil, "server tls: load key pair"},
		{"admin listener off loopback without a token", with("--admin-listen", "0.0.0.0:0"), nil, "--admin-listen 0.0.0.0:0 is not a loopback address: --metrics-token-file is required"},
		{"pprof without an admin listener", with("--pprof"), nil, "--pprof is set but --admin-listen is not"},
		{"empty metrics token file", with("--admin-listen", "0.0.0.0:0", "--metrics-token-file", empty), nil, "--metrics-token-file: read token file " + empty + ": token is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout bytes.Buffer
			err := runEnv(t.Context(), tt.args, envMap(tt.env), &stdout, io.Discard, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("run error = %v\nwant it to contain %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans several lines: %q", err)
			}
		})
	}
}

func TestRunBadPolicyFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "policy.json", `{"format":1,"version":1,"accounts":{"acct_0123456789abcdef":{"version":1,"rate_per_minute":601,"burst":10,"idle_timeout_ms":120000,"total_timeout_ms":600000,"max_retries":5}}}`, 0o600)
	err := runEnv(t.Context(), []string{"--listen", "127.0.0.1:0", "--data-dir", dir}, envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "a", "CLODEX_AGENT_TOKEN": "b"}), io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "rate_per_minute 601 is out of range; allowed 0..600") {
		t.Errorf("run with a bad policy file = %v, want the bad value named", err)
	}
}

func TestRunVersionHelpCheckConfig(t *testing.T) {
	var out bytes.Buffer
	if err := runEnv(t.Context(), []string{"--version"}, noEnv, &out, io.Discard, nil); err != nil || out.String() != "clodex-controlplane dev\n" {
		t.Errorf("--version = %q, %v", out.String(), err)
	}
	out.Reset()
	if err := runEnv(t.Context(), []string{"--help"}, noEnv, &out, io.Discard, nil); err != nil || !strings.Contains(out.String(), "-admin-token-file") {
		t.Errorf("--help = %q, %v", out.String(), err)
	}
	// The data dir is one of two stores, not required with Redis.
	if usage, _, _ := strings.Cut(out.String(), "\n"); usage != "Usage: clodex-controlplane (--data-dir DIR | --redis URL) --admin-token-file FILE --agent-token-file FILE [flags]" ||
		!strings.Contains(out.String(), "with --redis it is not used") {
		t.Errorf("--help presents --data-dir as required with --redis too:\n%s", out.String())
	}
	out.Reset()
	redisOnly := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "a", "CLODEX_AGENT_TOKEN": "b"})
	err := runEnv(t.Context(), []string{"--check-config", "--redis", "redis://127.0.0.1:1"}, redisOnly, &out, io.Discard, nil)
	if err == nil || strings.Contains(err.Error(), "data-dir") || !strings.Contains(err.Error(), "127.0.0.1:1") {
		t.Errorf("--check-config --redis (closed port) without --data-dir = %v; want only the unreachable Redis named", err)
	}
	out.Reset()
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "a", "CLODEX_AGENT_TOKEN": "b"})
	if err := runEnv(t.Context(), []string{"--check-config", "--data-dir", t.TempDir()}, env, &out, io.Discard, nil); err != nil || out.String() != "configuration ok\n" {
		t.Errorf("--check-config = %q, %v", out.String(), err)
	}
}

func TestListenInUse(t *testing.T) {
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "a", "CLODEX_AGENT_TOKEN": "b"})
	r := start(t, []string{"--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, env)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	err := runEnv(ctx, []string{"--listen", r.grpcAddr, "--data-dir", t.TempDir()}, env, io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "listen: ") {
		t.Errorf("second run on %s = %v, want a listen error", r.grpcAddr, err)
	}
}

// With --redis the control plane is a replica: policies and buckets live
// in Redis (a second replica sees them), the store is named in the log
// and the metrics, and the password in the URL appears nowhere.
func TestRunRedisReplicas(t *testing.T) {
	rs := redistest.Start(t)
	env := envMap(map[string]string{"CLODEX_ADMIN_TOKEN": "admin-secret-1", "CLODEX_AGENT_TOKEN": "agent-secret-1",
		"CLODEX_REDIS_URL": "redis://:hunter2@" + rs.Addr}) // redis-server ignores a password it does not require
	args := []string{"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--replica", "cp-1"}
	a := start(t, args, env)
	b := start(t, []string{"--listen", "127.0.0.1:0", "--replica", "cp-2"}, env)
	key := "acct_0123456789abcdef"
	admin := controlplanev1.NewAdminServiceClient(dial(t, a.grpcAddr, "admin-secret-1"))
	if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 42, Burst: proto.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	// A new account starts with a full bucket: burst 1 is admitted at once,
	// through the other replica, under the policy set on the first.
	resp, err := controlplanev1.NewAdmissionServiceClient(dial(t, b.grpcAddr, "agent-secret-1")).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key})
	if err != nil || resp.GetDecision() != controlplanev1.Decision_DECISION_ADMIT || resp.GetPolicyVersion() != 1 {
		t.Fatalf("Admit on the second replica = %v, %v; want ADMIT under version 1", resp, err)
	}
	got, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAccount().GetTokens() >= 0.5 || got.GetStore().GetKind() != "redis" || got.GetStore().GetReplica() != "cp-1" || got.GetStore().GetAddress() != "redis://"+rs.Addr {
		t.Errorf("GetAccount on the first replica = %v; want the burst spent (under half a token), store redis at redis://%s, replica cp-1", got, rs.Addr)
	}
	res, err := http.Get("http://" + a.adminAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	for _, m := range []string{"clodex_controlplane_redis_call_seconds_bucket", "clodex_controlplane_redis_breaker_open 0", "clodex_controlplane_store_degraded 0"} {
		if !strings.Contains(string(body), m) {
			t.Errorf("/metrics lacks %q", m)
		}
	}
	for _, r := range []*running{a, b} {
		if err := r.stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		out := r.stderr.String()
		if strings.Contains(out, "hunter2") {
			t.Errorf("the log leaks the Redis password:\n%s", out)
		}
		if !strings.Contains(out, "store=redis") {
			t.Errorf("the log does not name the store:\n%s", out)
		}
	}
}

// The soft memory limit comes from --memory-limit, else GOMEMLIMIT, else
// 0.9 of the cgroup's limit; under a limit the control plane collects at
// defaultGOGC, without one at Go's default; a GOGC the operator set is
// left alone. The log says what was chosen.
func TestTuneMemory(t *testing.T) {
	prevGC := debug.SetGCPercent(100)
	prevLimit := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetGCPercent(prevGC); debug.SetMemoryLimit(prevLimit) })
	cgroup := fstest.MapFS{
		"proc/self/cgroup":         {Data: []byte("0::/\n")},
		"sys/fs/cgroup/memory.max": {Data: []byte("536870912\n")},
	}
	none := fstest.MapFS{"proc/self/cgroup": {Data: []byte("0::/\n")}}
	tests := []struct {
		name      string
		flag      string
		env       map[string]string
		root      fstest.MapFS
		wantGC    int
		wantLimit int64
		wantLog   string
	}{
		{"cgroup", "auto", nil, cgroup, 400, 483183820, "from=cgroup gogc=400 limit_bytes=483183820 cgroup_limit_bytes=536870912"},
		{"no limit anywhere", "auto", nil, none, 100, math.MaxInt64, "from=none gogc=100"},
		{"the flag", "300MiB", nil, none, 400, 300 << 20, "from=--memory-limit gogc=400 limit_bytes=314572800"},
		{"GOGC from the environment", "300MiB", map[string]string{"GOGC": "50"}, none, 100, 300 << 20, "from=--memory-limit gogc=100"},
		{"the flag turns it off", "off", nil, cgroup, 100, math.MaxInt64, "from=none gogc=100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			lim, err := memlimit.Parse(tt.flag)
			if err != nil {
				t.Fatal(err)
			}
			var log syncBuffer
			tuneMemory(lim, envMap(tt.env), tt.root, slog.New(slog.NewTextHandler(&log, nil)))
			if got := debug.SetGCPercent(100); got != tt.wantGC {
				t.Errorf("GC percent = %d, want %d", got, tt.wantGC)
			}
			if got := debug.SetMemoryLimit(-1); got != tt.wantLimit {
				t.Errorf("memory limit = %d, want %d", got, tt.wantLimit)
			}
			if !strings.Contains(log.String(), "msg=\"memory limit\" "+tt.wantLog) {
				t.Errorf("log = %q, want it to contain %q", log.String(), tt.wantLog)
			}
		})
	}
}
