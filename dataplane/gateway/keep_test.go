package gateway_test

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node"
)

// failedRequests is how many failed requests TestFailedResponsesKeepTheSocket
// sends: 11 unless CLODEX_FAILED_REQUESTS says otherwise (a measurement).
func failedRequests(t *testing.T) int {
	n := 11
	if v := os.Getenv("CLODEX_FAILED_REQUESTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("CLODEX_FAILED_REQUESTS=%q; want a positive whole number", v)
		}
	}
	return n
}

// metrics returns the data plane's /metrics text.
func (e *env) metrics(t *testing.T) string {
	t.Helper()
	resp, err := e.client.Get("http://" + e.dp.AdminAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return string(gateway.ReadAll(t, resp))
}

// A response that fails on a healthy socket (response.failed server_error,
// an overload) keeps the socket: the turn's retry and every later request
// resend the whole conversation on it (no previous_response_id: the failed
// response is no continuation), so N failed requests cost the account no
// new socket at all, where each attempt used to cost one.
func TestFailedResponsesKeepTheSocket(t *testing.T) {
	for _, code := range []string{"server_error", "server_is_overloaded"} {
		t.Run(code, func(t *testing.T) {
			e := newEnv(t, envOptions{mutate: func(c *node.Config) {
				c.RetryRand = func() float64 { return 0 }
				c.AdminListen = "127.0.0.1:0"
			}})
			c := &conversation{t: t, e: e}
			if got := c.turn("#sim reply first"); got != "first" {
				t.Fatalf("turn 1 reply %q, want first", got)
			}
			// The backend fails every response; the client sends turn 2
			// again and again.
			if err := e.sim.SetConfig(codexsim.ConfigPatch{FailResponses: ptr(code)}); err != nil {
				t.Fatal(err)
			}
			next := append(c.messages, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "#sim reply second"}}})
			body, _ := json.Marshal(map[string]any{"model": "gpt-5.5", "max_tokens": 1024, "messages": next})
			n := failedRequests(t)
			for i := range n {
				resp := e.post(t, "/v1/messages", string(body), sessionHeader)
				if resp.StatusCode == http.StatusOK {
					t.Fatalf("request %d: status 200, want the failure", i)
				}
				gateway.ReadAll(t, resp)
			}
			st := e.sim.Stats()
			failed := st.Errors[code]
			t.Logf("%d failed requests (%d failed responses upstream) cost %d new sockets after the first turn's", n, failed, st.Upgrades-1)
			if failed != int64(n+1) {
				t.Errorf("%d failed responses upstream, want %d: the first request retries once", failed, n+1)
			}
			if st.Upgrades != 1 {
				t.Errorf("%d failed requests: %d upgrades in all, want 1: the socket is kept after a failed response", n, st.Upgrades)
			}
			// The backend recovers: turn 2 runs on the same socket, then
			// turn 3 continues it there.
			if err := e.sim.SetConfig(codexsim.ConfigPatch{FailResponses: ptr("")}); err != nil {
				t.Fatal(err)
			}
			if got := c.turn("#sim reply second"); got != "second" {
				t.Fatalf("turn 2 after the fault: reply %q, want second", got)
			}
			if got := c.turn("#sim reply third"); got != "third" {
				t.Fatalf("turn 3: reply %q, want third", got)
			}
			socks := e.sim.Sockets()
			if len(socks) != 1 {
				t.Fatalf("sim saw %d sockets, want 1", len(socks))
			}
			// Turn 1; turn 2's first attempt continues turn 1; every later
			// send of turn 2 is the full conversation without
			// previous_response_id; turn 3 continues turn 2.
			sent := socks[0].Sent()
			if len(sent) != n+4 {
				t.Fatalf("%d frames sent on the socket, want %d", len(sent), n+4)
			}
			for i, f := range sent {
				s := string(f)
				prev := strings.Contains(s, `"previous_response_id"`)
				switch {
				case i == 1 || i == len(sent)-1:
					if !prev {
						t.Errorf("frame %d: %.300s; want a continuation with previous_response_id", i, s)
					}
				case i > 1:
					if prev || !strings.Contains(s, "#sim reply first") || !strings.Contains(s, "#sim reply second") {
						t.Errorf("frame %d: %.300s; want the full conversation without previous_response_id", i, s)
					}
				}
			}
			m := e.metrics(t)
			for _, want := range []string{
				`clodex_dataplane_pool_failed_attempt_sockets_total{reason="kept_after_failed_response"} ` + strconv.Itoa(n+1),
				`clodex_dataplane_pool_decisions_total{decision="kept_socket"} ` + strconv.Itoa(n+1),
				`clodex_dataplane_pool_failed_attempt_sockets_total{reason="closed_socket_failed"} 0`,
			} {
				if !strings.Contains(m, want+"\n") {
					t.Errorf("/metrics lacks %q", want)
				}
			}
		})
	}
}

// A socket kept after a failed response that the backend then drops is
// closed and counted as a kept socket that failed (what a backend that
// dislikes the reuse would show); the next request dials a new socket. A
// socket that fails during a response is closed, never kept.
func TestKeptSocketThatFailsIsCounted(t *testing.T) {
	e := newEnv(t, envOptions{sim: codexsim.Config{Faults: codexsim.Faults{FailResponses: "server_error"}},
		mutate: func(c *node.Config) { c.AdminListen = "127.0.0.1:0"; c.FailureRetries = -1 }}) // no retry in the data plane
	resp := e.post(t, "/v1/messages", gateway.MessagesBody(false, "hi"), sessionHeader)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502: %s", resp.StatusCode, gateway.ReadAll(t, resp))
	}
	gateway.ReadAll(t, resp)
	if n := e.sim.DropSockets(); n != 1 {
		t.Fatalf("the sim dropped %d sockets, want the kept one", n)
	}
	gateway.WaitFor(t, "the kept socket's failure counted", func() bool {
		return strings.Contains(e.metrics(t), `clodex_dataplane_pool_failed_attempt_sockets_total{reason="closed_kept_socket_failed"} 1`+"\n")
	})
	// The next request finds no kept socket: a new one. Its response
	// breaks off mid-stream: that socket is closed, not kept.
	if err := e.sim.SetConfig(codexsim.ConfigPatch{FailResponses: ptr(""), CloseAfterEvents: ptr(3)}); err != nil {
		t.Fatal(err)
	}
	resp = e.post(t, "/v1/messages", gateway.MessagesBody(false, "#sim reply "+strings.Repeat("word ", 20)), sessionHeader)
	gateway.ReadAll(t, resp)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("status 200, want the failure of a socket closed mid-response")
	}
	if got := e.sim.Stats().Upgrades; got != 2 {
		t.Errorf("%d upgrades, want 2: the dropped kept socket is not reused", got)
	}
	m := e.metrics(t)
	for _, want := range []string{
		`clodex_dataplane_pool_failed_attempt_sockets_total{reason="kept_after_failed_response"} 1`,
		`clodex_dataplane_pool_failed_attempt_sockets_total{reason="closed_socket_failed"} 1`,
		`clodex_dataplane_pool_failed_attempt_sockets_total{reason="closed_kept_socket_failed"} 1`,
	} {
		if !strings.Contains(m, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
