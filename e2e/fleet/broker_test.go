package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/redis/go-redis/v9"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Broker test knobs. The figures come from a 3-minute run
// (CLODEX_BROKER_DURATION=3m); the default covers three expiries, one of
// them across the control plane's restart.
const (
	envBrokerDuration     = "CLODEX_BROKER_DURATION"
	defaultBrokerDuration = 75 * time.Second
	brokerTTL             = 30 * time.Second
	// brokerSkew is the refresh margin of a 30 s token: a quarter of its
	// lifetime (codexauth.SkewFor), so it is refreshed every 22.5 s.
	brokerSkew = brokerTTL / 4
)

// TestBroker runs three clodex-dataplane processes without any auth.json
// against two clodex-controlplane replicas over one Redis holding the
// account's sign-in (the credential broker) and clodex-sim issuing 30 s
// tokens, under Claude-Code-like load, and restarts one replica half-way. It
// checks the promises: no turn fails, each expiry is refreshed
// once for the whole fleet (not per data plane), the emulator never sees a
// refresh token twice, an agent credential scoped to the account is
// refused another one, and no token reaches a log, the control plane's
// /metrics, its data directory or an exported span in clear.
func TestBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the real binaries; skipped with -short")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is not installed (CI=true requires it; apt-get install redis-server): %v", err)
		}
		t.Skipf("redis-server is not installed: %v", err)
	}
	duration := defaultBrokerDuration
	if v := os.Getenv(envBrokerDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("%s=%q: want a duration of at least 10s", envBrokerDuration, v)
		}
		duration = d
	}
	ctx, cancel := context.WithTimeout(t.Context(), duration+3*time.Minute)
	defer cancel()
	bins := buildBinaries(t, ctx)
	spans := startSpanSink(t)
	f, err := cluster.Start(ctx, cluster.Options{
		Env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + spans.url, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
			"OTEL_BSP_SCHEDULE_DELAY=500"},
		Bins:              bins,
		Dir:               t.TempDir(),
		Mode:              cluster.Central,
		DataPlanes:        fleetSize,
		Rate:              rate,
		Burst:             burst,
		UpgradeLimit:      100000,
		UpgradeWindow:     10 * time.Second,
		ControlPlaneAdmin: true,
		DataPlaneArgs:     []string{"--admin-listen", "127.0.0.1:0"},
		Broker:            true,
		TokenTTL:          brokerTTL,
		Replicas:          2,
	})
	if err != nil {
		t.Fatalf("start fleet: %v", err)
	}
	t.Cleanup(func() {
		f.Close()
		if t.Failed() {
			for _, l := range f.Logs() {
				b, _ := os.ReadFile(l)
				t.Logf("---- %s ----\n%s", filepath.Base(l), lastLines(string(b), 40))
			}
		}
	})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	h := &harness{t: t, f: f, client: client}
	secrets := newSecretSet(t, f.LoginAuth)
	started := time.Now()
	for i := range f.DataPlanes {
		h.mustTurn(ctx, i)
	}

	// Load for the whole duration; the control plane restarts half-way,
	// and a sampler records every access token the broker hands out.
	key := account.Key(cluster.Account)
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampled sync.WaitGroup
	sampled.Go(func() { secrets.sample(sampleCtx, f, key) })
	restartErr := make(chan error, 1)
	go func() {
		if err := sleepUntil(ctx, time.Now().Add(duration/2)); err != nil {
			restartErr <- err
			return
		}
		f.ControlPlane.Kill()
		restartErr <- f.ControlPlane.Restart(ctx)
	}()
	bases := make([]string, len(f.DataPlanes))
	for i, dp := range f.DataPlanes {
		bases[i] = dp.BaseURL
	}
	res, err := cluster.RunLoad(ctx, cluster.LoadConfig{
		BaseURLs: bases, Agents: 2, Duration: duration, Drain: 30 * time.Second,
		Retry: cluster.Retry{MaxRetries: 3}, Client: client,
	})
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if err := <-restartErr; err != nil {
		t.Fatalf("restart the control plane: %v", err)
	}
	elapsed := time.Since(started)
	stopSampling()
	sampled.Wait()
	st := h.stats(ctx)
	simSt, err := f.Sim.Stats(ctx, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%v of load over %d data planes without auth.json, tokens living %v, a control-plane replica restarted half-way: turns %d ok, %d failed, %d unfinished, %d retried; emulator: %d upgrades, %d upgrade 401s, %d token refreshes, refresh_reuse_detected %d; %d distinct access tokens seen",
		duration, len(f.DataPlanes), brokerTTL, res.OK, res.Failed, res.Unfinished, res.Retries, st.Upgrades,
		simSt.Upgrade401s, simSt.TokenRefreshes, simSt.RefreshReuseDetected, secrets.accessCount())

	if res.Failed != 0 || res.Unfinished != 0 || res.OK == 0 {
		t.Errorf("turns: %d ok, %d failed (%v), %d unfinished; want all ok", res.OK, res.Failed, res.Reasons, res.Unfinished)
	}
	if simSt.RefreshReuseDetected != 0 {
		t.Errorf("emulator refresh_reuse_detected = %d; want 0 (a refresh token was presented twice)", simSt.RefreshReuseDetected)
	}
	// One refresh per expiry for the fleet: a token lives 30 s and is
	// refreshed 7.5 s before it expires, so over the run at most one per
	// 22.5 s (plus the one due at the end); per-host refreshing would be
	// three times that.
	most := int64(math.Ceil(elapsed.Seconds()/(brokerTTL-brokerSkew).Seconds())) + 1
	least := int64(elapsed/brokerTTL) - 1
	if simSt.TokenRefreshes > most || simSt.TokenRefreshes < least {
		t.Errorf("emulator token_refreshes = %d over %v; want one per expiry for the whole fleet, %d..%d", simSt.TokenRefreshes, elapsed.Round(time.Second), least, most)
	}
	// The replicas' logs agree: each refresh was made by one of them.
	logged := 0
	for _, l := range f.Logs() {
		if strings.HasPrefix(filepath.Base(l), "cp-") {
			b, _ := os.ReadFile(l)
			logged += strings.Count(string(b), "access token refreshed")
		}
	}
	if int64(logged) != simSt.TokenRefreshes {
		t.Errorf("the replicas logged %d refreshes; the emulator counted %d", logged, simSt.TokenRefreshes)
	}

	// An agent credential scoped to the fleet's account reaches it and
	// nothing else.
	scoped := filepath.Join(t.TempDir(), "team-a.token")
	if out, err := f.ControlPlane.Ctl(ctx, "agent", "create", "team-a", "--accounts", cluster.Account, "--out", scoped); err != nil {
		t.Fatalf("clodexctl agent create: %v\n%s", err, out)
	}
	if fi, err := os.Stat(scoped); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent token file: %v, mode %v; want 0600", err, fi.Mode().Perm())
	}
	creds := credentialClient(t, f.ControlPlane.Addr, scoped)
	if _, err := creds.GetToken(ctx, &controlplanev1.GetTokenRequest{Account: key}); err != nil {
		t.Errorf("GetToken(%s) with the credential scoped to it: %v", cluster.Account, err)
	}
	if _, err := creds.GetToken(ctx, &controlplanev1.GetTokenRequest{Account: account.Key("acct-b")}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("GetToken(acct-b) with the credential scoped to %s = %v; want PermissionDenied", cluster.Account, err)
	}
	if b, err := os.ReadFile(scoped); err == nil {
		secrets.add(strings.TrimSpace(string(b)), "the scoped agent token")
	}
	secrets.checkAbsent(t, f)
	// Every process flushes its spans when it stops.
	f.Close()
	secrets.checkSpans(t, spans)
}

// spanSink is an OTLP/HTTP trace receiver keeping every export's raw
// protobuf body: a token in an attribute or event would appear in it
// verbatim.
type spanSink struct {
	url string

	mu     sync.Mutex
	bodies [][]byte
}

func startSpanSink(t *testing.T) *spanSink {
	t.Helper()
	s := &spanSink{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.bodies = append(s.bodies, b)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

// checkSpans greps every exported span batch for the tokens.
func (s *secretSet) checkSpans(t *testing.T, sink *spanSink) {
	t.Helper()
	sink.mu.Lock()
	defer sink.mu.Unlock()
	size := 0
	for _, b := range sink.bodies {
		size += len(b)
	}
	if len(sink.bodies) == 0 || size < 1000 {
		t.Errorf("received %d span exports (%d bytes); want the processes' spans to grep", len(sink.bodies), size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok, what := range s.tokens {
		if len(tok) < 16 {
			continue
		}
		for _, b := range sink.bodies {
			if bytes.Contains(b, []byte(tok)) {
				t.Errorf("an exported span batch holds %s in clear", what)
				break
			}
		}
	}
	t.Logf("grepped %d span exports (%d bytes) for %d tokens", len(sink.bodies), size, len(s.tokens))
}

// credentialClient dials the control plane with the token in tokenFile.
func credentialClient(t *testing.T, addr, tokenFile string) controlplanev1.CredentialServiceClient {
	t.Helper()
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := bearer.Parse(string(b))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return controlplanev1.NewCredentialServiceClient(conn)
}

func (s *secretSet) add(tok, what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[tok] = what
}

// secretSet collects the tokens of the account's sign-in: the ones in the
// auth.json the broker was given and every access token it hands out.
type secretSet struct {
	mu     sync.Mutex
	tokens map[string]string // token -> what it is
}

func newSecretSet(t *testing.T, authPath string) *secretSet {
	t.Helper()
	b, err := os.ReadFile(authPath)
	if err != nil {
		t.Fatal(err)
	}
	var a struct {
		Tokens struct {
			Access  string `json:"access_token"`
			Refresh string `json:"refresh_token"`
			ID      string `json:"id_token"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(b, &a); err != nil || a.Tokens.Access == "" || a.Tokens.Refresh == "" {
		t.Fatalf("login auth.json %s: %v; want access and refresh tokens", authPath, err)
	}
	return &secretSet{tokens: map[string]string{
		a.Tokens.Access: "the imported access token", a.Tokens.Refresh: "the imported refresh token", a.Tokens.ID: "the imported id token",
	}}
}

// sample asks the broker for the account's token every second, as a data
// plane would, until ctx ends.
func (s *secretSet) sample(ctx context.Context, f *cluster.Fleet, key string) {
	b, err := os.ReadFile(f.ControlPlane.AgentTokenFile())
	if err != nil {
		return
	}
	tok, err := bearer.Parse(string(b))
	if err != nil {
		return
	}
	conn, err := grpc.NewClient(f.ControlPlane.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer.Credentials(tok)))
	if err != nil {
		return
	}
	defer conn.Close()
	c := controlplanev1.NewCredentialServiceClient(conn)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		resp, err := c.GetToken(cctx, &controlplanev1.GetTokenRequest{Account: key})
		cancel()
		if err == nil {
			s.mu.Lock()
			if _, ok := s.tokens[resp.GetAccessToken()]; !ok {
				s.tokens[resp.GetAccessToken()] = "an access token the broker handed out"
			}
			s.mu.Unlock()
		}
		if sleepUntil(ctx, time.Now().Add(time.Second)) != nil {
			return
		}
	}
}

func (s *secretSet) accessCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, what := range s.tokens {
		if strings.Contains(what, "access") {
			n++
		}
	}
	return n
}

// checkAbsent greps every log, the control plane's /metrics and its data
// directory for the tokens.
func (s *secretSet) checkAbsent(t *testing.T, f *cluster.Fleet) {
	t.Helper()
	places := map[string]string{}
	for _, l := range f.Logs() {
		b, err := os.ReadFile(l)
		if err != nil {
			t.Errorf("read log %s: %v", l, err)
			continue
		}
		places[filepath.Base(l)] = string(b)
	}
	metrics := map[string]string{"control plane": f.ControlPlane.AdminAddr}
	for i, dp := range f.DataPlanes {
		b, _ := os.ReadFile(dp.Log)
		if m := adminAddr.FindStringSubmatch(string(b)); m != nil {
			metrics[fmt.Sprintf("data plane %d", i)] = m[1]
		} else {
			t.Errorf("data plane %d logged no admin listener address", i)
		}
	}
	for who, addr := range metrics {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			t.Errorf("GET %s /metrics: %v", who, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		places[who+" /metrics"] = string(b)
	}
	if url := f.RedisURL(); url != "" {
		for k, v := range redisDump(t, url) {
			places["redis "+k] = v
		}
	} else if root, err := os.OpenRoot(f.ControlPlane.DataDir()); err != nil {
		t.Errorf("open the control plane's data dir: %v", err)
	} else {
		_ = fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				b, _ := fs.ReadFile(root.FS(), path)
				places["data dir "+path] = string(b)
			}
			return nil
		})
		root.Close()
	}
	if len(places) < 2*len(f.DataPlanes)+3 {
		t.Errorf("searched only %d places (%v); want every log, /metrics and the data dir", len(places), keys(places))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for tok, what := range s.tokens {
		if len(tok) < 16 {
			continue
		}
		for where, text := range places {
			if strings.Contains(text, tok) {
				t.Errorf("%s holds %s in clear", where, what)
			}
		}
	}
}

// redisDump returns every key's value in the replicas' Redis (strings and
// hashes, the hash fields joined).
func redisDump(t *testing.T, url string) map[string]string {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	ctx := t.Context()
	out := map[string]string{}
	iter := c.Scan(ctx, 0, "*", 100).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		switch c.Type(ctx, k).Val() {
		case "string":
			out[k] = c.Get(ctx, k).Val()
		case "hash":
			var b strings.Builder
			for f, v := range c.HGetAll(ctx, k).Val() {
				b.WriteString(f + "=" + v + "\n")
			}
			out[k] = b.String()
		}
	}
	if err := iter.Err(); err != nil {
		t.Errorf("scan redis: %v", err)
	}
	if _, ok := out["clodex:login:"+account.Key(cluster.Account)]; !ok {
		t.Errorf("redis holds no login for %s (keys %v); the broker should keep it there", cluster.Account, keys(out))
	}
	return out
}

// adminAddr finds a data plane's admin listener in its log.
var adminAddr = regexp.MustCompile(`msg="admin listener" addr=(127\.0\.0\.1:[0-9]+)`)

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
