package e2e

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/internal/clienttest"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
	"github.com/clodex/clodex/internal/node/nodetest"
)

// These cases run the real Claude Code with its default retries against
// the data plane in its default configuration (budget, pacing, failure
// retries), and the emulator failing: what a user sees when the backend
// fails for good, or goes away for a while.

// giveUpBound is how soon Claude Code must show a persistent failure.
const giveUpBound = 4 * time.Minute

// claudeDefaultRetries is Claude Code 2.1.332's default retry count (its
// api_retry lines report max_retries 10 when none is set). RunClaude sets
// CLAUDE_CODE_MAX_RETRIES=1 unless told otherwise, so the cases set the
// default explicitly.
const claudeDefaultRetries = 10

// outageSim is clodex-sim on an address the test can take down — its
// listener closed and every socket dropped, so new connections are
// refused, as for a stopped backend — and bring back on the same address.
type outageSim struct {
	*codexsim.Server
	addr string

	mu     sync.Mutex // guards srv and served
	srv    *http.Server
	served chan error
}

func startOutageSim(t *testing.T, cfg codexsim.Config) *outageSim {
	t.Helper()
	sim, err := codexsim.New(cfg)
	if err != nil {
		t.Fatalf("codexsim.New: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen for the emulator: %v", err)
	}
	s := &outageSim{Server: sim, addr: ln.Addr().String()}
	s.serve(ln)
	t.Cleanup(func() {
		s.stop(t)
		if err := sim.Close(); err != nil {
			t.Errorf("codexsim Close: %v", err)
		}
	})
	return s
}

func (s *outageSim) serve(ln net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.served = make(chan error, 1)
	go func(srv *http.Server, served chan<- error) { served <- srv.Serve(ln) }(s.srv, s.served)
}

// stop takes the emulator down: no listener, no socket. It does nothing
// when it is down already.
func (s *outageSim) stop(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	srv, served := s.srv, s.served
	s.srv = nil
	s.mu.Unlock()
	if srv == nil {
		return
	}
	srv.Close() // the listener and idle HTTP connections; sockets are hijacked
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("emulator Serve: %v", err)
	}
	s.DropSockets()
}

// start brings the emulator back on its address.
func (s *outageSim) start(t *testing.T) error {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // the port was just released; another listener may hold it briefly
		if ln, err = net.Listen("tcp", s.addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	s.serve(ln)
	return nil
}

// failureStack is the data plane in its default configuration in front of
// an outageSim, and the recording proxy Claude Code talks to.
type failureStack struct {
	sim      *outageSim
	dp       *nodetest.Node
	baseURL  string
	requests *requestRecorder
}

func startFailureStack(t *testing.T, simCfg codexsim.Config) *failureStack {
	t.Helper()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("emulator and proxy logs:\n%s", logs.String())
		}
	})
	simCfg.AcceptTokens = map[string]string{simToken: simAccount}
	simCfg.Logger = logger
	sim := startOutageSim(t, simCfg)
	dp := nodetest.Start(t, node.Config{
		Listen:      "127.0.0.1:0",
		UpstreamURL: "ws://" + sim.addr + codexsim.ChatGPTPath,
		CodexAuth:   nodetest.WriteAuth(t, simToken, simAccount, ""),
		Refresh:     node.RefreshNever,
		Version:     "e2e",
	})
	reqs, baseURL := startRecordingProxy(t, dp.URL, logger)
	return &failureStack{sim: sim, dp: dp, baseURL: baseURL, requests: reqs}
}

// runClaudeDefaultRetries runs Claude Code (bin, from clienttest.ClaudeCode)
// once with its default retries.
func runClaudeDefaultRetries(t *testing.T, bin, baseURL, prompt string, timeout time.Duration, extraArgs ...string) (clienttest.ClaudeResult, time.Duration) {
	t.Helper()
	start := time.Now()
	res := clienttest.RunClaude(t.Context(), t, bin, clienttest.ClaudeRun{
		BaseURL:   baseURL,
		Model:     "claude-sonnet-4-5",
		Prompt:    prompt,
		ExtraArgs: extraArgs,
		ExtraEnv:  []string{"CLAUDE_CODE_MAX_RETRIES=" + strconv.Itoa(claudeDefaultRetries)},
		Timeout:   timeout,
	})
	return res, time.Since(start)
}

// apiRetries returns Claude Code's api_retry lines.
func apiRetries(res clienttest.ClaudeResult) []map[string]any {
	var out []map[string]any
	for _, l := range res.Lines {
		if l["type"] == "system" && l["subtype"] == "api_retry" {
			out = append(out, l)
		}
	}
	return out
}

// claudeRung is Claude Code's own delay before retry n (1-based), before
// its 0-25 % jitter: min(500 ms × 2^(n-1), 32 s).
func claudeRung(n int) time.Duration {
	return min(time.Duration(500*math.Pow(2, float64(n-1)))*time.Millisecond, 32*time.Second)
}

// firstMessages returns the first POST /v1/messages answered, if any.
func firstMessages(rr *requestRecorder) (recordedRequest, bool) {
	for _, r := range rr.all() {
		if r.Method == http.MethodPost && r.Path == "/v1/messages" {
			return r, true
		}
	}
	return recordedRequest{}, false
}

// A persistent upstream failure (every response fails with server_error)
// ends with Claude Code showing the error within four minutes: every
// answer comes at once (after one 2 s retry for the first) with a
// retry-after Claude Code honours without stretching its own schedule.
func TestClaudeCodeGivesUpOnPersistentFailure(t *testing.T) {
	bin := clienttest.ClaudeCode(t)
	st := startFailureStack(t, codexsim.Config{Faults: codexsim.Faults{FailResponses: "server_error"}})
	res, took := runClaudeDefaultRetries(t, bin, st.baseURL, "Say hello.", giveUpBound+2*time.Minute)
	t.Logf("Claude Code gave up after %v", took.Round(100*time.Millisecond))

	if res.ExitCode == 0 || !res.IsError() {
		t.Fatalf("claude exit %d, is_error %v, result %s; want the failure shown", res.ExitCode, res.IsError(), compact(res.Result))
	}
	if text := res.Text(); !strings.Contains(text, "502") || !strings.Contains(text, "server_error") || !strings.Contains(text, "retry after") {
		t.Errorf("result %q, want the 502 naming server_error and when to retry", text)
	}

	// Claude Code asked 1 + 10 times; every answer was a 502 that says
	// when to retry.
	reqs, _ := st.requests.messages(t)
	if len(reqs) != claudeDefaultRetries+1 {
		t.Fatalf("Claude Code sent %d requests, want %d (its first and its default retries)", len(reqs), claudeDefaultRetries+1)
	}
	var sent []time.Duration
	for i, r := range reqs {
		ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
		if r.Status != http.StatusBadGateway || err != nil || r.Header.Get("X-Should-Retry") != "true" {
			t.Errorf("answer %d: status %d retry-after %q x-should-retry %q; want 502 with both", i, r.Status,
				r.Header.Get("Retry-After"), r.Header.Get("X-Should-Retry"))
		}
		sent = append(sent, time.Duration(ra)*time.Second)
	}

	// Claude Code waited max(retry-after, its rung) plus at most 25 %
	// before each retry. The retry-after (when the upstream is due to be
	// tried again, in whole seconds, spread up to 25 %) only exceeds
	// Claude Code's rung on its first, short retries: it adds at most
	// 10 s to Claude Code's own schedule (159.5 s before jitter).
	retries := apiRetries(res)
	if len(retries) != claudeDefaultRetries {
		t.Fatalf("Claude Code logged %d api_retry lines, want %d", len(retries), claudeDefaultRetries)
	}
	var waited, added time.Duration
	for i, l := range retries {
		n := i + 1
		delay := time.Duration(l["retry_delay_ms"].(float64)) * time.Millisecond
		waited += delay
		base := max(sent[i], claudeRung(n))
		added += base - claudeRung(n)
		if delay < base-50*time.Millisecond || delay > base*5/4+50*time.Millisecond {
			t.Errorf("retry %d: Claude Code waited %v, want max(retry-after %v, rung %v) plus 0-25 %%", n, delay, sent[i], claudeRung(n))
		}
		if got, _ := l["max_retries"].(float64); got != claudeDefaultRetries {
			t.Errorf("api_retry %d: max_retries %v, want Claude Code's default %d", n, l["max_retries"], claudeDefaultRetries)
		}
	}
	if added > 10*time.Second {
		t.Errorf("the retry-after values %v added %v to Claude Code's own schedule, want at most 10s", sent, added)
	}
	t.Logf("Claude Code's own waits: %v", waited.Round(100*time.Millisecond))

	// The data plane retried once inside the first request and never
	// again: 12 failed responses for 11 requests.
	if n := st.sim.Stats().Errors["server_error"]; n != int64(claudeDefaultRetries)+2 {
		t.Errorf("the emulator failed %d responses, want %d (2 for the first request, 1 for each retry)", n, claudeDefaultRetries+2)
	}
	// Each response failed on a healthy socket, which was kept: the 11
	// requests cost the account one new socket, not one per attempt
	// (docs/pool.md §7.1).
	if n := st.sim.Stats().Upgrades; n != 1 {
		t.Errorf("%d failed requests cost %d upgrades, want 1: a socket whose response failed is kept", len(reqs), n)
	}
	if took > giveUpBound {
		t.Errorf("Claude Code gave up after %v, want within %v", took.Round(time.Second), giveUpBound)
	}
}

// The backend stops for 20 s in the middle of a turn (while Claude Code
// runs a tool): the turn completes.
func TestClaudeCodeRidesOutABackendOutage(t *testing.T) {
	const outage = 20 * time.Second
	bin := clienttest.ClaudeCode(t)
	st := startFailureStack(t, codexsim.Config{})

	// Take the backend down as soon as the first answer (the tool call)
	// has reached Claude Code, which then runs `sleep 3` before asking
	// again; bring it back 20 s later.
	ctx, cancel := context.WithCancel(t.Context())
	var stoppedAt, startedAt time.Time
	var outageErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if r, ok := firstMessages(st.requests); ok {
				if r.Status != http.StatusOK {
					outageErr = errors.New("the first answer was not a 200")
					return
				}
				break
			}
			select {
			case <-ctx.Done():
				outageErr = ctx.Err()
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		st.sim.stop(t)
		stoppedAt = time.Now()
		select {
		case <-ctx.Done():
		case <-time.After(outage):
		}
		startedAt = time.Now()
		outageErr = st.sim.start(t)
	})
	res, took := runClaudeDefaultRetries(t, bin, st.baseURL, "Wait, then answer.\n#sim call Bash {\"command\":\"sleep 3\",\"description\":\"wait\"}",
		3*time.Minute, "--allowedTools", "Bash(sleep:*)")
	cancel()
	wg.Wait()
	t.Logf("the turn took %v; the backend was down from %v to %v", took.Round(100*time.Millisecond),
		stoppedAt.Format("15:04:05.000"), startedAt.Format("15:04:05.000"))
	if outageErr != nil {
		t.Fatalf("outage: %v", outageErr)
	}
	requireSuccess(t, res)
	if want := "Tool result received:"; !strings.HasPrefix(res.Text(), want) {
		t.Errorf("result %q, want the answer to the tool result (%q…)", res.Text(), want)
	}
	if startedAt.Sub(stoppedAt) < outage {
		t.Errorf("the backend was down %v, want %v", startedAt.Sub(stoppedAt), outage)
	}

	// The turn saw the outage: answers failed while the backend was down,
	// each saying when to retry, and Claude Code retried until it was back.
	reqs, _ := st.requests.messages(t)
	var failed int
	for i, r := range reqs {
		if r.Status == http.StatusOK {
			continue
		}
		failed++
		if r.Status != http.StatusBadGateway || r.Header.Get("Retry-After") == "" || r.Header.Get("X-Should-Retry") != "true" {
			t.Errorf("answer %d: status %d retry-after %q x-should-retry %q; want 502 with both", i, r.Status,
				r.Header.Get("Retry-After"), r.Header.Get("X-Should-Retry"))
		}
	}
	if failed == 0 || len(apiRetries(res)) != failed {
		t.Errorf("%d failed answers, %d api_retry lines; want at least one, one retry each", failed, len(apiRetries(res)))
	}
	if last := reqs[len(reqs)-1]; last.Status != http.StatusOK {
		t.Errorf("the last answer was %d, want 200", last.Status)
	}
}
