package cluster

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Retry is a client's retry rule for 429 answers, modelled on Claude Code
// 2.1.332 (measured, internal/captures/claude-code/cc-2.1.332-error-429-*.json;
// docs/errors.md §8.4): attempt n (1-based) after a 429
// waits max(retry-after, min(500 ms * 2^(n-1), 32 s)) * (1 + jitter*0.25)
// with jitter uniform in [0,1), and a turn gives up after MaxRetries
// retries.
type Retry struct {
	// MaxRetries is how many times a 429 is retried; Claude Code's
	// default is 10 (CLAUDE_CODE_MAX_RETRIES).
	MaxRetries int
	// Sleep waits between attempts. (Optional; default a timer that ctx
	// cuts short) Tests inject one that records the delays.
	Sleep func(ctx context.Context, d time.Duration) error
}

// Delay is the wait before retry number attempt (1-based) given the
// answer's retry-after and a jitter value in [0,1).
func (r Retry) Delay(attempt int, retryAfter time.Duration, jitter float64) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	ladder := 32 * time.Second
	if attempt <= 7 { // 500ms * 2^6 = 32s
		ladder = min(500*time.Millisecond<<(attempt-1), 32*time.Second)
	}
	base := max(retryAfter, ladder)
	return time.Duration(float64(base) * (1 + jitter*0.25))
}

// ParseRetryAfter reads a retry-after header as whole seconds (what Claude
// Code honours); empty, malformed or negative is zero.
func ParseRetryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// TurnResult is one turn as its agent saw it.
type TurnResult struct {
	DataPlane int
	Start     time.Time
	// Latency runs from the first request to the end of the answer or the
	// final failure, retries and their waits included.
	Latency time.Duration
	// Attempts is the number of HTTP requests (1 + retries).
	Attempts int
	// OK is a complete streamed answer (message_stop seen).
	OK bool
	// Reason says why a turn failed: "429 retries exhausted", "status
	// 500", "stream error: …", "transport: …"; "" when OK or Cancelled.
	Reason string
	// Cancelled is a turn cut by the end of the run (not a failure).
	Cancelled bool
}

// TurnRequest is the Anthropic Messages request of one agent turn: a new
// conversation (its own session id in metadata.user_id, as Claude Code
// sends it), streaming, asking the emulator to reply "ok".
func TurnRequest(sessionID string) []byte {
	userID, _ := json.Marshal(map[string]string{
		"device_id":    strings.Repeat("ab", 32),
		"account_uuid": "",
		"session_id":   sessionID,
	})
	b, _ := json.Marshal(map[string]any{
		"model":      "claude-sonnet-4-5",
		"max_tokens": 256,
		"stream":     true,
		"metadata":   map[string]string{"user_id": string(userID)},
		"messages": []any{
			map[string]any{"role": "user", "content": []any{
				map[string]string{"type": "text", "text": "#sim reply ok"},
			}},
		},
	})
	return b
}

// NewSessionID returns a random UUID-shaped session id.
func NewSessionID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// attempt is one HTTP request's outcome.
type attempt struct {
	status     int
	retryAfter time.Duration
	ok         bool
	reason     string
}

// postTurn sends one request and reads the whole SSE answer.
func postTurn(ctx context.Context, client *http.Client, baseURL string, body []byte) attempt {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return attempt{reason: "request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("anthropic-version", "2023-06-01")
	req.Header.Set("x-api-key", "fleet-bench")
	resp, err := client.Do(req)
	if err != nil {
		return attempt{reason: "transport: " + err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return attempt{status: resp.StatusCode, retryAfter: ParseRetryAfter(resp.Header.Get("retry-after")),
			reason: "status " + strconv.Itoa(resp.StatusCode)}
	}
	return readSSE(resp.Body)
}

// readSSE reads an Anthropic event stream to its end: message_stop is
// success, an error event or a stream without message_stop is a failure.
func readSSE(r io.Reader) attempt {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event:"):
			event = strings.TrimSpace(line[len("event:"):])
		case strings.HasPrefix(line, "data:"):
			switch event {
			case "message_stop":
				return attempt{status: http.StatusOK, ok: true}
			case "error":
				return attempt{status: http.StatusOK, reason: "stream error: " + errorType(line[len("data:"):])}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return attempt{status: http.StatusOK, reason: "stream cut: " + err.Error()}
	}
	return attempt{status: http.StatusOK, reason: "stream ended without message_stop"}
}

func errorType(data string) string {
	var v struct {
		Error struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal([]byte(data), &v) == nil && v.Error.Type != "" {
		return v.Error.Type
	}
	return "unparsed"
}

// RunTurn runs one new-conversation turn against a data plane: a 429 is
// retried after Retry.Delay up to Retry.MaxRetries times; any other error
// fails the turn. A turn cut by ctx is Cancelled, not failed.
func RunTurn(ctx context.Context, client *http.Client, baseURL string, r Retry, rnd func() float64) TurnResult {
	body := TurnRequest(NewSessionID())
	res := TurnResult{Start: time.Now()}
	for {
		res.Attempts++
		a := postTurn(ctx, client, baseURL, body)
		res.Latency = time.Since(res.Start)
		if ctx.Err() != nil && !a.ok {
			res.Cancelled = true
			return res
		}
		if a.ok {
			res.OK = true
			return res
		}
		if a.status != http.StatusTooManyRequests {
			res.Reason = a.reason
			return res
		}
		if res.Attempts > r.MaxRetries {
			res.Reason = "429 retries exhausted"
			return res
		}
		wait := sleep
		if r.Sleep != nil {
			wait = r.Sleep
		}
		if err := wait(ctx, r.Delay(res.Attempts, a.retryAfter, rnd())); err != nil {
			res.Latency = time.Since(res.Start)
			res.Cancelled = true
			return res
		}
	}
}

// LoadConfig is a closed-loop load: Agents agents per data plane, each
// running new-conversation turns back to back.
type LoadConfig struct {
	// BaseURLs are the data planes' Anthropic API bases. (Required)
	BaseURLs []string
	// Agents is the number of concurrent agents per data plane. (Default 20)
	Agents int
	// Duration is how long agents start new turns. (Required)
	Duration time.Duration
	// Drain bounds how long turns in flight at Duration may finish; the
	// rest are cancelled and counted as unfinished. (Default 60 s)
	Drain time.Duration
	// Retry is the agents' retry rule.
	Retry Retry
	// Client sends the requests. (Default: a client with no timeout)
	Client *http.Client
	// OnTurn, when set, sees every finished turn (called from the agents'
	// goroutines, concurrently).
	OnTurn func(TurnResult)
}

// LoadResult summarises a load run.
type LoadResult struct {
	Turns      int // turns started
	OK         int
	Failed     int
	Unfinished int // cut by the drain bound
	Retries    int // 429s retried
	Elapsed    time.Duration
	// Latencies of the successful turns, sorted.
	Latencies []time.Duration
	// Reasons counts failed turns by reason.
	Reasons map[string]int
	// Results is every turn, in finishing order.
	Results []TurnResult
}

// Percentile is the nearest-rank percentile p (0..100) of the successful
// turns' latencies; zero when there are none.
func (r LoadResult) Percentile(p float64) time.Duration {
	return Percentile(r.Latencies, p)
}

// Percentile is the nearest-rank percentile p (0..100) of sorted values.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// RunLoad runs the load and returns when every agent has stopped: after
// Duration no new turn starts, and turns still running Drain later are
// cancelled. ctx ending cancels everything at once.
func RunLoad(ctx context.Context, cfg LoadConfig) (LoadResult, error) {
	if len(cfg.BaseURLs) == 0 || cfg.Duration <= 0 {
		return LoadResult{}, errors.New("run load: BaseURLs and a positive Duration are required")
	}
	if cfg.Agents == 0 {
		cfg.Agents = 20
	}
	if cfg.Drain == 0 {
		cfg.Drain = 60 * time.Second
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Agents, MaxConnsPerHost: 0}}
		defer client.CloseIdleConnections()
	}
	// turnCtx cancels turns still running at Duration+Drain.
	turnCtx, cancelTurns := context.WithTimeout(ctx, cfg.Duration+cfg.Drain)
	defer cancelTurns()
	stopAt := time.Now().Add(cfg.Duration)

	var (
		mu  sync.Mutex
		res = LoadResult{Reasons: map[string]int{}}
		wg  sync.WaitGroup
	)
	start := time.Now()
	for dp, base := range cfg.BaseURLs {
		for range cfg.Agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				agentLoop(turnCtx, client, base, dp, stopAt, cfg, func(t TurnResult) {
					mu.Lock()
					defer mu.Unlock()
					res.Turns++
					res.Retries += retriesOf(t)
					switch {
					case t.OK:
						res.OK++
						res.Latencies = append(res.Latencies, t.Latency)
					case t.Cancelled:
						res.Unfinished++
					default:
						res.Failed++
						res.Reasons[t.Reason]++
					}
					res.Results = append(res.Results, t)
				})
			}()
		}
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(res.Latencies)
	return res, ctx.Err()
}

// retriesOf is the number of 429s a turn retried: every attempt after
// the first followed one.
func retriesOf(t TurnResult) int { return max(0, t.Attempts-1) }

// agentLoop is one agent: turns back to back until stopAt.
func agentLoop(ctx context.Context, client *http.Client, base string, dp int, stopAt time.Time, cfg LoadConfig, record func(TurnResult)) {
	rnd := mrand.Float64
	for time.Now().Before(stopAt) && ctx.Err() == nil {
		t := RunTurn(ctx, client, base, cfg.Retry, rnd)
		t.DataPlane = dp
		record(t)
		if cfg.OnTurn != nil {
			cfg.OnTurn(t)
		}
	}
}

// FormatDuration prints a latency compactly (ms below 10 s).
func FormatDuration(d time.Duration) string {
	if d < 10*time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return fmt.Sprintf("%.1fs", d.Seconds())
}

// FanOutConfig is a fan-out: Conversations new conversations started at
// once, spread round robin over the data planes, each one turn.
type FanOutConfig struct {
	// BaseURLs are the data planes' Anthropic API bases. (Required)
	BaseURLs []string
	// Conversations is how many start at once. (Required)
	Conversations int
	// Retry is the clients' retry rule.
	Retry Retry
	// Client sends the requests. (Default: a client with no timeout)
	Client *http.Client
}

// RunFanOut runs the fan-out until every turn has finished (or ctx ends)
// and summarises it like RunLoad.
func RunFanOut(ctx context.Context, cfg FanOutConfig) LoadResult {
	client := cfg.Client
	if client == nil {
		client = &http.Client{}
	}
	start := time.Now()
	results := make([]TurnResult, cfg.Conversations)
	var wg sync.WaitGroup
	for i := range cfg.Conversations {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = RunTurn(ctx, client, cfg.BaseURLs[i%len(cfg.BaseURLs)], cfg.Retry, mrand.Float64)
		}()
	}
	wg.Wait()
	res := LoadResult{Elapsed: time.Since(start), Reasons: map[string]int{}}
	for _, t := range results {
		res.Turns++
		res.Retries += retriesOf(t)
		switch {
		case t.OK:
			res.OK++
			res.Latencies = append(res.Latencies, t.Latency)
		case t.Cancelled:
			res.Unfinished++
		default:
			res.Failed++
			res.Reasons[t.Reason]++
		}
	}
	slices.Sort(res.Latencies)
	return res
}
