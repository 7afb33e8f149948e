package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/credentials"
	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/pacing"
)

// wsUpstream is a tiny Responses WebSocket for frames clodex-sim cannot
// send: it answers the n-th response.create (counted from 1 across
// sockets) with reply(n) and records the close status each socket ends
// with.
type wsUpstream struct {
	url   string
	reply func(n int) []string

	handlers sync.WaitGroup

	mu      sync.Mutex // guards the following fields
	creates int
	closes  []websocket.StatusCode
}

func newWSUpstream(t *testing.T, reply func(n int) []string) *wsUpstream {
	t.Helper()
	u := &wsUpstream{reply: reply}
	ts := httptest.NewServer(http.HandlerFunc(u.serve))
	u.url = "ws" + strings.TrimPrefix(ts.URL, "http")
	t.Cleanup(func() {
		ts.Close()
		u.handlers.Wait() // every socket was closed by the code under test
	})
	return u
}

func (u *wsUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.handlers.Add(1)
	defer u.handlers.Done()
	c, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	defer c.CloseNow()
	ctx := context.Background()
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			u.mu.Lock()
			u.closes = append(u.closes, websocket.CloseStatus(err))
			u.mu.Unlock()
			return
		}
		if !strings.Contains(string(data), `"response.create"`) {
			continue
		}
		u.mu.Lock()
		u.creates++
		n := u.creates
		u.mu.Unlock()
		for _, f := range u.reply(n) {
			if err := c.Write(ctx, websocket.MessageText, []byte(f)); err != nil {
				return
			}
		}
	}
}

func (u *wsUpstream) stats() (creates int, closes []websocket.StatusCode) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.creates, slices.Clone(u.closes)
}

func usageLimitFrame(resetSecs int) string {
	return `{"type":"error","status":429,"error":{"type":"usage_limit_reached","message":"The usage limit has been reached","plan_type":"plus","resets_in_seconds":` +
		strconv.Itoa(resetSecs) + `}}`
}

func successFrames() []string {
	return []string{evCreated, evInProgress, evCallAdded, evCallDone, evCompleted}
}

// A usage limit that resets later than 60 s is final (x-should-retry:
// false, no retry); one that resets sooner is retried with the reset as
// the wait and, when the retries run out, is a plain 429.
func TestUsageLimitReset(t *testing.T) {
	tests := []struct {
		name            string
		resetSecs       int
		wantCreates     int
		wantShouldRetry string
		minSleep        time.Duration // every wait between attempts is within [min, max]
		maxSleep        time.Duration
	}{
		{"resets in 4 h", 4 * 3600, 1, "false", 0, 0},
		{"resets in 30 s", 30, 3, "", 30 * time.Second, 37500 * time.Millisecond},
	}
	for _, tt := range tests {
		for _, stream := range []bool{false, true} {
			name := tt.name + map[bool]string{true: "/stream", false: "/json"}[stream]
			t.Run(name, func(t *testing.T) {
				up := newWSUpstream(t, func(int) []string { return []string{usageLimitFrame(tt.resetSecs)} })
				e := newEnv(t, envOptions{mutate: func(c *Config) {
					c.Dialer = UpstreamDialer(upstream.DialOptions{URL: up.url})
					c.Budget = pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 2}
					c.RetryRand = func() float64 { return 0.5 }
				}})
				resp := e.post(t, "/v1/messages", messagesBody(stream, "hello"), nil)
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("status %d, want 429: %s", resp.StatusCode, readAll(t, resp))
				}
				if got := resp.Header.Get("X-Should-Retry"); got != tt.wantShouldRetry {
					t.Errorf("x-should-retry = %q, want %q", got, tt.wantShouldRetry)
				}
				eb := readError(t, resp)
				if eb.Error.Type != "rate_limit_error" || !strings.Contains(eb.Error.Message, "usage_limit_reached") {
					t.Errorf("error = %+v, want rate_limit_error naming usage_limit_reached", eb.Error)
				}
				if creates, _ := up.stats(); creates != tt.wantCreates {
					t.Errorf("upstream got %d response.create, want %d", creates, tt.wantCreates)
				}
				sleeps := e.clock.Sleeps()
				if len(sleeps) != tt.wantCreates-1 {
					t.Errorf("waits between attempts = %v, want %d", sleeps, tt.wantCreates-1)
				}
				for _, d := range sleeps {
					if d < tt.minSleep || d > tt.maxSleep {
						t.Errorf("wait %v, want within [%v, %v] (the reset is the hint)", d, tt.minSleep, tt.maxSleep)
					}
				}
			})
		}
	}
}

// Config.BudgetFor is asked for every turn's budget with the credential's
// account; a zero or invalid answer falls back to Config.Budget.
func TestBudgetForIsConsulted(t *testing.T) {
	valid := pacing.Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second}
	tests := []struct {
		name        string
		budget      pacing.Budget // what BudgetFor returns
		wantCreates int
	}{
		{"no retries", pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 0}, 1},
		{"one retry", pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 1}, 2},
		{"zero falls back to Budget (2 retries)", pacing.Budget{}, 3},
		{"invalid falls back to Budget (2 retries)", pacing.Budget{IdleTimeout: -1, TotalTimeout: valid.TotalTimeout, MaxRetries: 1}, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newWSUpstream(t, func(int) []string { return []string{usageLimitFrame(30)} })
			var mu sync.Mutex
			var asked []string
			e := newEnv(t, envOptions{mutate: func(c *Config) {
				c.Dialer = UpstreamDialer(upstream.DialOptions{URL: up.url})
				c.Budget = pacing.Budget{IdleTimeout: valid.IdleTimeout, TotalTimeout: valid.TotalTimeout, MaxRetries: 2}
				c.BudgetFor = func(accountID string) pacing.Budget {
					mu.Lock()
					asked = append(asked, accountID)
					mu.Unlock()
					return tt.budget
				}
			}})
			resp := e.post(t, "/v1/messages", messagesBody(false, "hello"), nil)
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d, want 429: %s", resp.StatusCode, readAll(t, resp))
			}
			readAll(t, resp)
			if creates, _ := up.stats(); creates != tt.wantCreates {
				t.Errorf("upstream got %d response.create, want %d", creates, tt.wantCreates)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(asked, []string{simAccount}) {
				t.Errorf("BudgetFor asked for %q, want once for %q", asked, simAccount)
			}
		})
	}
}

// Closing the pool closes every idle pooled socket with 1001: the shared
// pool built on PoolDialer (closed by its owner) and the gateway's private
// pool (closed by Server.Close).
func TestShutdownClosesIdleSocketsWithGoingAway(t *testing.T) {
	tests := []struct {
		name   string
		shared bool
	}{
		{"shared pool on PoolDialer", true},
		{"private pool on Config.Dialer", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := newWSUpstream(t, func(int) []string { return successFrames() })
			var shared *pool.Pool
			e := newEnv(t, envOptions{mutate: func(c *Config) {
				if !tt.shared {
					c.Dialer = UpstreamDialer(upstream.DialOptions{URL: up.url})
					return
				}
				p, err := pool.New(pool.Config{Dialer: PoolDialer(upstream.DialOptions{URL: up.url},
					NoRefresh(credentials.Static{AccessToken: simToken, AccountID: simAccount}))})
				if err != nil {
					t.Fatalf("pool.New: %v", err)
				}
				shared = p
				c.Pool = p
			}})
			resp := e.post(t, "/v1/messages", messagesBody(false, "hello"), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d, want 200: %s", resp.StatusCode, readAll(t, resp))
			}
			readAll(t, resp)
			if _, closes := up.stats(); len(closes) != 0 {
				t.Fatalf("sockets closed before shutdown: %v; want the head kept idle", closes)
			}
			if tt.shared {
				if err := shared.Close(); err != nil {
					t.Errorf("pool.Close: %v", err)
				}
			} else if err := e.gw.Close(); err != nil {
				t.Errorf("Server.Close: %v", err)
			}
			waitFor(t, "the upstream to see the socket closed", func() bool { _, c := up.stats(); return len(c) == 1 })
			if _, closes := up.stats(); closes[0] != websocket.StatusGoingAway {
				t.Errorf("upstream saw close status %v, want 1001 (going away)", closes[0])
			}
		})
	}
}

// A peer that does not answer the close frame cannot hold a shutdown:
// closeGoingAway gives up after its timeout and releases the socket; the
// close frame was still sent.
func TestCloseGoingAwayIsBounded(t *testing.T) {
	release := make(chan struct{})
	got := make(chan websocket.StatusCode, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		<-release // deaf until the client gave up
		_, _, err = c.Read(context.Background())
		got <- websocket.CloseStatus(err)
	}))
	defer ts.Close()
	c, err := upstream.Dial(t.Context(), upstream.DialOptions{URL: "ws" + strings.TrimPrefix(ts.URL, "http"),
		Credential: credentials.Credential{AccessToken: "tok"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = closeGoingAway(c, pool.ReasonPoolClosed, 20*time.Millisecond) // returns: the peer never answered
	close(release)
	if code := <-got; code != websocket.StatusGoingAway {
		t.Errorf("peer read close status %v, want 1001", code)
	}
	if err := c.Send(t.Context(), []byte("{}")); err == nil {
		t.Error("Send after closeGoingAway succeeded; want the socket released")
	}
}
