package accounts

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// Environment of the helper process (TestHelperProcess) and the knobs of
// TestMultiProcessSharedAuthFile, so a longer run ("20 s token expiries
// for two minutes") can be done by hand:
//
//	CLODEX_TEST_MP_TTL=20s CLODEX_TEST_MP_DURATION=2m \
//	  go test -race -count=1 -run TestMultiProcessSharedAuthFile -v ./dataplane/accounts/
const (
	envHelper   = "CLODEX_CREDENTIALS_HELPER" // "1" in a helper process
	envAuthPath = "CLODEX_CREDENTIALS_HELPER_AUTH"
	envBaseURL  = "CLODEX_CREDENTIALS_HELPER_URL"
	envDuration = "CLODEX_CREDENTIALS_HELPER_DURATION"
	envMPTTL    = "CLODEX_TEST_MP_TTL"
	envMPDur    = "CLODEX_TEST_MP_DURATION"
	resultTag   = "HELPER-RESULT "
)

// helperResult is what one helper process reports.
type helperResult struct {
	Turns     int      `json:"turns"`     // Credential + validation rounds
	Failures  []string `json:"failures"`  // turns that did not end with a valid token
	Rejected  int      `json:"rejected"`  // validations answered 401 (then Rejected + one retry)
	Refreshes int      `json:"refreshes"` // "access token refreshed" records
	Adopted   int      `json:"adopted"`   // tokens adopted from the file
	// Early lists refreshes (not forced by a 401) that replaced a token
	// with more than the skew left: a refresh the lock should have avoided.
	Early []string `json:"early"`
}

// TestHelperProcess is not a test: TestMultiProcessSharedAuthFile runs the
// test binary with this test selected as a separate data-plane process.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("helper process of TestMultiProcessSharedAuthFile")
	}
	dur, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil {
		t.Fatalf("%s: %v", envDuration, err)
	}
	base := os.Getenv(envBaseURL)
	var logs syncBuffer
	s, err := NewFileSource(FileConfig{
		Path:          os.Getenv(envAuthPath),
		TokenEndpoint: base + "/oauth/token",
		Logger:        slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatalf("NewFileSource: %v", err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	validate := func(ctx context.Context, tok codexauth.Secret) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/backend-api/wham/accounts/check", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+tok.Reveal())
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	var res helperResult
	ctx := t.Context()
	// turn is one data-plane request: get the credential, use it, and on a
	// 401 report it and retry once.
	turn := func() error {
		c, err := s.Credential(ctx)
		if err != nil {
			return err
		}
		st, err := validate(ctx, c.AccessToken)
		if err == nil && st == http.StatusUnauthorized {
			res.Rejected++
			if c, err = s.Rejected(ctx, c.AccessToken); err != nil {
				return err
			}
			st, err = validate(ctx, c.AccessToken)
		}
		if err == nil && st != http.StatusOK {
			err = fmt.Errorf("accounts check answered HTTP %d", st)
		}
		return err
	}
	for end := time.Now().Add(dur); time.Now().Before(end); {
		res.Turns++
		if err := turn(); err != nil {
			res.Failures = append(res.Failures, fmt.Sprintf("turn %d: %v", res.Turns, err))
		}
		time.Sleep(20 * time.Millisecond) // pacing of the turns, not a synchronisation
	}

	s.mu.Lock()
	due := codexauth.SkewFor(s.skew, s.lifetime) + time.Millisecond // the log rounds to 1ms
	s.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		var rec struct {
			Msg      string `json:"msg"`
			Forced   bool   `json:"forced"`
			Replaced string `json:"replaced_expires_in"`
		}
		if json.Unmarshal(sc.Bytes(), &rec) != nil {
			continue
		}
		switch rec.Msg {
		case "access token refreshed":
			res.Refreshes++
			if left, err := time.ParseDuration(rec.Replaced); err == nil && !rec.Forced && left > due {
				res.Early = append(res.Early, rec.Replaced)
			}
		case "adopted the access token another process wrote":
			res.Adopted++
		}
	}
	out, _ := json.Marshal(res)
	fmt.Println(resultTag + string(out))
}

func envDurationOr(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q is invalid; want a positive duration such as 20s", name, v)
	}
	return d
}

// TestMultiProcessSharedAuthFile runs two data-plane processes on one
// auth.json against one emulated identity provider with short-lived tokens:
// every turn must succeed, refresh-token reuse must never be detected, and
// the processes must not both refresh the same expiring token.
func TestMultiProcessSharedAuthFile(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for several seconds")
	}
	ttl := envDurationOr(t, envMPTTL, 3*time.Second)
	dur := envDurationOr(t, envMPDur, 15*time.Second)
	auth, err := simauth.New(simauth.Config{TokenTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(auth.Handler())
	t.Cleanup(srv.Close)
	path := filepath.Join(t.TempDir(), "auth.json")
	if err := auth.WriteAuthFile(path, "acct-mp"); err != nil {
		t.Fatal(err)
	}

	const procs = 2
	results := make([]helperResult, procs)
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
			cmd.Env = append(os.Environ(),
				envHelper+"=1", envAuthPath+"="+path, envBaseURL+"="+srv.URL, envDuration+"="+dur.String())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				errs[i] = fmt.Errorf("helper %d: %w\n%s%s", i, err, stdout.String(), stderr.String())
				return
			}
			for line := range strings.Lines(stdout.String()) {
				if rest, ok := strings.CutPrefix(line, resultTag); ok {
					errs[i] = json.Unmarshal([]byte(rest), &results[i])
					return
				}
			}
			errs[i] = fmt.Errorf("helper %d printed no result:\n%s", i, stdout.String())
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}

	st := auth.Stats()
	total := 0
	for i, r := range results {
		t.Logf("helper %d: %d turns, %d refreshes, %d adopted, %d rejected, %d failures", i, r.Turns, r.Refreshes, r.Adopted, r.Rejected, len(r.Failures))
		if r.Turns == 0 {
			t.Errorf("helper %d ran no turns", i)
		}
		if len(r.Failures) > 0 {
			t.Errorf("helper %d: %d of %d turns failed; first: %s", i, len(r.Failures), r.Turns, r.Failures[0])
		}
		if len(r.Early) > 0 {
			t.Errorf("helper %d refreshed %d tokens that were not yet due (left: %v)", i, len(r.Early), r.Early)
		}
		total += r.Refreshes
	}
	t.Logf("simauth: %d token refreshes, %d reuse detections (TTL %v, %v)", st.TokenRefreshes, st.RefreshReuseDetected, ttl, dur)
	if st.RefreshReuseDetected != 0 {
		t.Errorf("refresh_reuse_detected = %d, want 0", st.RefreshReuseDetected)
	}
	if st.TokenRefreshes == 0 {
		t.Errorf("token_refreshes = 0, want refreshes during %v with %v tokens", dur, ttl)
	}
	if int64(total) != st.TokenRefreshes {
		t.Errorf("helpers logged %d refreshes, simauth counted %d", total, st.TokenRefreshes)
	}
	// A token lives at least ttl-1s (exp has second granularity) and is
	// refreshed a quarter of its lifetime early, so one process alone
	// refreshes at most this often; duplicates would exceed it.
	minInterval := ttl - time.Second - ttl/4
	if limit := int64(dur/minInterval) + 2; minInterval > 0 && st.TokenRefreshes > limit {
		t.Errorf("token_refreshes = %d, want at most %d (one per expiry window)", st.TokenRefreshes, limit)
	}
}
