package refresh

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// Run shape. The defaults: 20 s tokens for two minutes.
const (
	envDuration     = "CLODEX_E2E_REFRESH_DURATION"
	envTTL          = "CLODEX_E2E_REFRESH_TTL"
	defaultDuration = 2 * time.Minute
	defaultTTL      = 20 * time.Second

	dataPlanes        = 2
	clientsPerPlane   = 3                      // concurrent clients on each data plane
	turnsPerSession   = 3                      // then the client starts a new conversation
	turnInterval      = 300 * time.Millisecond // one turn per client per interval at most
	turnTimeout       = 60 * time.Second
	maxErrorsReported = 10
)

var (
	simReady       = regexp.MustCompile(`^ws://(127\.0\.0\.1:[0-9]+)/`)
	dataPlaneReady = regexp.MustCompile(`ANTHROPIC_BASE_URL=(http://127\.0\.0\.1:[0-9]+)`)
)

// envDurationOr reads a positive duration from the environment, or def
// when the variable is unset.
func envDurationOr(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v, ok := os.LookupEnv(name)
	if !ok || strings.TrimSpace(v) == "" {
		return def
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q is invalid; want a positive Go duration such as %v", name, v, def)
	}
	return d
}

// TestSharedAuthFileRefresh checks docs/credentials.md §6 and §7 end to end: two clodex-dataplane
// processes sharing one auth.json with short token lifetimes serve turns
// for a while; no refresh token is ever reused and every turn succeeds.
func TestSharedAuthFileRefresh(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs clodex-sim and two clodex-dataplane processes for minutes")
	}
	duration := envDurationOr(t, envDuration, defaultDuration)
	ttl := envDurationOr(t, envTTL, defaultTTL)
	t.Logf("run %v, token lifetime %v (%s, %s)", duration, ttl, envDuration, envTTL)

	ctx := t.Context()
	simBin, dpBin := buildBinaries(ctx, t)
	dir := t.TempDir()
	authPath := filepath.Join(dir, "codex", "auth.json")
	if err := os.MkdirAll(filepath.Dir(authPath), 0o700); err != nil {
		t.Fatal(err)
	}
	env := func(home string) []string {
		e := []string{"HOME=" + home, "TMPDIR=" + os.TempDir(),
			// Pacing is not under test: every new socket is admitted at once.
			"CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=0"}
		if p, ok := os.LookupEnv("PATH"); ok {
			e = append(e, "PATH="+p)
		}
		return e
	}

	sim, simAddr := startProc(t, "clodex-sim", simBin, []string{
		"--listen", "127.0.0.1:0",
		"--write-auth", authPath,
		"--token-ttl", ttl.String(),
		// The upgrade throttle is not under test either.
		"--upgrade-limit", "1000000",
		"--log-level", "info",
	}, env(dir), simReady)
	simURL := "http://" + simAddr
	startToken := accessToken(t, authPath)

	var planes []string
	var dps []*proc
	for i := range dataPlanes {
		home := filepath.Join(dir, fmt.Sprintf("dp%d", i))
		if err := os.MkdirAll(home, 0o700); err != nil {
			t.Fatal(err)
		}
		p, base := startProc(t, fmt.Sprintf("clodex-dataplane-%d", i), dpBin, []string{
			"--listen", "127.0.0.1:0",
			"--codex-auth", authPath,
			"--token-endpoint", simURL + "/oauth/token",
			"--upstream-url", "ws://" + simAddr + "/backend-api/codex/responses",
			"--refresh=auto",
			"--log-level", "info",
		}, env(home), dataPlaneReady)
		planes = append(planes, base)
		dps = append(dps, p)
	}

	tr := &http.Transport{MaxIdleConnsPerHost: clientsPerPlane * dataPlanes}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: turnTimeout}

	var res results
	runCtx, cancel := context.WithTimeout(ctx, duration)
	defer cancel()
	var wg sync.WaitGroup
	for c := range clientsPerPlane * dataPlanes {
		wg.Go(func() { runClient(runCtx, client, planes, c, &res) })
	}
	wg.Wait()

	st := simStatsOf(t, client, simURL)
	t.Logf("turns: %d ok, %d failed, per data plane %v, conversations %d; emulator: %d upgrades, %d upgrade 401s, %d token refreshes, %d refresh reuses",
		res.ok, res.failed, res.perPlane, res.sessions, st.Upgrades, st.Upgrade401s, st.TokenRefreshes, st.RefreshReuseDetected)

	if res.failed != 0 {
		t.Errorf("%d of %d turns failed, want none; first errors:\n%s", res.failed, res.ok+res.failed, strings.Join(res.errors, "\n"))
	}
	for i, n := range res.perPlane {
		if n == 0 {
			t.Errorf("data plane %d served no turn, want both serving", i)
		}
	}
	if st.RefreshReuseDetected != 0 {
		t.Errorf("emulator refresh_reuse_detected = %d, want 0 (a refresh token was presented twice)", st.RefreshReuseDetected)
	}
	if st.TokenRefreshes < 1 {
		t.Errorf("emulator token_refreshes = %d, want at least 1 with %v tokens over %v", st.TokenRefreshes, ttl, duration)
	}
	if st.Upgrade401s != 0 {
		// Allowed only when every such turn was recovered,
		// which res.failed == 0 above checks.
		t.Logf("emulator upgrade_401s = %d; every turn still succeeded", st.Upgrade401s)
	}
	if endToken := accessToken(t, authPath); st.TokenRefreshes > 0 && endToken == startToken {
		t.Errorf("auth.json still holds the start-up access token after %d refreshes; want the refreshed one written back", st.TokenRefreshes)
	}
	if fi, err := os.Stat(authPath); err != nil {
		t.Errorf("stat auth.json: %v", err)
	} else if fi.Mode().Perm() != 0o600 {
		t.Errorf("auth.json mode = %v, want 0600", fi.Mode().Perm())
	}
	for _, p := range append([]*proc{sim}, dps...) {
		if p.exited() {
			t.Errorf("%s exited during the run (%v)", p.name, p.waitErr)
		}
		if log := p.log(); strings.Contains(log, "refresh_token_reused") {
			t.Errorf("%s logged refresh_token_reused:\n%s", p.name, grepLines(log, "refresh_token_reused", 5))
		}
	}
}

// results are the outcomes of every client's turns.
type results struct {
	mu       sync.Mutex
	ok       int
	failed   int
	sessions int
	perPlane [dataPlanes]int
	errors   []string
}

func (r *results) record(plane int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.ok++
		r.perPlane[plane]++
		return
	}
	r.failed++
	if len(r.errors) < maxErrorsReported {
		r.errors = append(r.errors, fmt.Sprintf("data plane %d: %v", plane, err))
	}
}

// runClient is one client: until ctx ends it holds conversations of
// turnsPerSession turns, each on one data plane, alternating planes
// between conversations, at most one turn per turnInterval. A turn cut
// by the end of the run is not counted.
func runClient(ctx context.Context, client *http.Client, planes []string, c int, res *results) {
	tick := time.NewTicker(turnInterval)
	defer tick.Stop()
	for n := 0; ; n++ {
		plane := (c + n) % len(planes)
		session := newSessionID()
		res.mu.Lock()
		res.sessions++
		res.mu.Unlock()
		for turn := 1; turn <= turnsPerSession; turn++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			err := postTurn(ctx, client, planes[plane], session, turn)
			if ctx.Err() != nil {
				return
			}
			res.record(plane, err)
			if err != nil {
				break // the conversation is broken; start a new one
			}
		}
	}
}

// postTurn sends turn number turn of a conversation (the whole history,
// as Claude Code does) and checks the answer is 200 with the text "ok".
func postTurn(ctx context.Context, client *http.Client, base, session string, turn int) error {
	userID, _ := json.Marshal(map[string]string{
		"device_id": strings.Repeat("ef", 32), "account_uuid": "", "session_id": session,
	})
	var msgs []any
	for i := 1; i <= turn; i++ {
		if i > 1 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{map[string]string{"type": "text", "text": "ok"}}})
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": []any{
			map[string]string{"type": "text", "text": fmt.Sprintf("turn %d\n#sim reply ok", i)},
		}})
	}
	body, err := json.Marshal(map[string]any{
		"model":      "claude-sonnet-4-5",
		"max_tokens": 256,
		"metadata":   map[string]string{"user_id": string(userID)},
		"messages":   msgs,
	})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("x-api-key", "test-key")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("turn %d: %w", turn, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("turn %d: read body: %w", turn, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("turn %d: status %d: %s", turn, resp.StatusCode, got)
	}
	var msg struct {
		Content []struct{ Type, Text string }
	}
	if err := json.Unmarshal(got, &msg); err != nil {
		return fmt.Errorf("turn %d: decode %s: %w", turn, got, err)
	}
	if len(msg.Content) != 1 || msg.Content[0].Type != "text" || msg.Content[0].Text != "ok" {
		return fmt.Errorf("turn %d: content %+v, want one text block \"ok\"", turn, msg.Content)
	}
	return nil
}

// simStats are the emulator counters this test reads from /sim/stats.
type simStats struct {
	Upgrades             int64 `json:"upgrades"`
	Upgrade401s          int64 `json:"upgrade_401s"`
	TokenRefreshes       int64 `json:"token_refreshes"`
	RefreshReuseDetected int64 `json:"refresh_reuse_detected"`
}

func simStatsOf(t *testing.T, client *http.Client, simURL string) simStats {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, simURL+"/sim/stats", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET /sim/stats: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /sim/stats: status %d, err %v: %s", resp.StatusCode, err, body)
	}
	var st simStats
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatalf("GET /sim/stats: decode %s: %v", body, err)
	}
	return st
}

// accessToken reads the access token of a Codex auth.json.
func accessToken(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read auth.json: %v", err)
	}
	var f struct {
		Tokens struct {
			AccessToken string `json:"access_token"`
		} `json:"tokens"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("auth.json is not JSON: %v", err) // never print the file: it holds tokens
	}
	if f.Tokens.AccessToken == "" {
		t.Fatalf("auth.json has no tokens.access_token")
	}
	return f.Tokens.AccessToken
}

// newSessionID returns a random UUID-shaped session id.
func newSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// grepLines returns up to n lines of s containing sub.
func grepLines(s, sub string, n int) string {
	var out []string
	for line := range strings.SplitSeq(s, "\n") {
		if strings.Contains(line, sub) && len(out) < n {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
