package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/dataplane/gateway"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/captures"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node/nodetest"
	"github.com/clodex/clodex/internal/pacing"
)

// ccFixture is the captured Claude Code 2.1.332 first turn (package captures).
const ccFixture = "claude-code/cc-2.1.332-messages-request-custom-model.json"

// BenchmarkOverhead measures what the data plane adds to a turn, in one
// run: each iteration runs the same turn once by a client talking to
// clodex-sim directly over WebSocket (dial, send the translated
// response.create, read to response.completed) and once through the data
// plane as clodex-dataplane runs it (package node: HTTP POST, gateway,
// pool, an Admit RPC to the embedded control plane for the new socket,
// SSE to the end), alternating so both see the same machine load.
// Reported: time to first output byte (first text delta) and total, p50
// and p99, for each path and the difference, and the time the request
// translation alone takes (DecodeRequest, ToResponses, CreateFrame),
// measured in the same loop, to split the added time.
//
// Both paths dial a socket per turn. The data plane runs with pacing off
// (CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=0: the benchmark opens sockets far
// faster than the real edge allows; the Admit RPC is still made) and keeps
// at most one idle nursery head (CLODEX_WS_MAX_NURSERY_CONNECTIONS=1): a
// replayed turn does not continue the previous replay's head (its history
// is not a prefix), so without the cap every iteration would leave one
// more open socket and idle head behind, a load no real client makes
// (Claude Code continues its conversation on its head, so a data plane
// holds about one head per live conversation). With the cap, each turn's
// Acquire evicts the previous turn's head: a hard close inside the timed
// span, as it happens in production. The sim runs in this process, so its
// sessions share the heap and the garbage collector with both paths.
//
//	go test -run '^$' -bench BenchmarkOverhead -benchtime 2000x ./dataplane/gateway
func BenchmarkOverhead(b *testing.B) {
	payloads := []struct {
		name string
		body func(b *testing.B) []byte
	}{
		{"short", func(*testing.B) []byte { return []byte(gateway.MessagesBody(true, "#sim reply Hello there")) }},
		{"cc-first-turn-88KB", func(b *testing.B) []byte { return fixtureBody(b, 88<<10) }},
	}
	for _, p := range payloads {
		b.Run(p.name, func(b *testing.B) { benchOverhead(b, p.body(b)) })
	}
}

// fixtureBody returns the captured Claude Code 2.1.332 first turn (12
// tools) rebuilt to full size: the capture shortened long strings (marked
// "…[truncated; N chars total]") and summarised tool schemas; strings get
// their length back with filler, schemas become objects of string
// properties, and the main system prompt is padded so the body reaches padTo
// bytes (the real request is about 88 KB).
func fixtureBody(b *testing.B, padTo int) []byte {
	raw, err := captures.ReadFile(ccFixture)
	if err != nil {
		b.Fatal(err)
	}
	var capture struct {
		Body map[string]any `json:"body"`
	}
	if err := json.Unmarshal(raw, &capture); err != nil {
		b.Fatal(err)
	}
	body := restore(capture.Body).(map[string]any)
	for _, tl := range body["tools"].([]any) {
		tool := tl.(map[string]any)
		if props, ok := tool["input_schema.properties"].([]any); ok {
			p := map[string]any{}
			for _, name := range props {
				p[name.(string)] = map[string]any{"type": "string", "description": "The " + name.(string) + " argument."}
			}
			schema := map[string]any{"type": "object", "properties": p, "additionalProperties": false,
				"$schema": "https://json-schema.org/draft/2020-12/schema"}
			if req, ok := tool["input_schema.required"]; ok {
				schema["required"] = req
			}
			delete(tool, "input_schema.properties")
			delete(tool, "input_schema.required")
			tool["input_schema"] = schema
		}
	}
	out, _ := json.Marshal(body)
	if padTo > len(out) {
		sys := body["system"].([]any)
		last := sys[len(sys)-1].(map[string]any)
		filler := strings.Repeat("Use the dedicated tools for file operations and keep answers short. ", (padTo-len(out))/68+1)
		last["text"] = last["text"].(string) + "\n" + filler[:padTo-len(out)]
		out, _ = json.Marshal(body)
	}
	return out
}

var truncated = regexp.MustCompile(`…\[truncated; (\d+) chars total\]$`)

// restore gives every truncated string of the capture its original length.
func restore(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = restore(e)
		}
	case []any:
		for i, e := range x {
			x[i] = restore(e)
		}
	case string:
		if m := truncated.FindStringSubmatchIndex(x); m != nil {
			n, _ := strconv.Atoi(x[m[2]:m[3]])
			s := x[:m[0]] + strings.Repeat(" lorem ipsum dolor", n/18+1)
			if r := []rune(s); len(r) > n {
				s = string(r[:n])
			}
			return s
		}
	}
	return v
}

func benchOverhead(b *testing.B, body []byte) {
	const (
		token   = "tok-bench"
		account = "acct-bench"
	)
	sim := nodetest.StartSim(b, codexsim.Config{
		AcceptTokens: map[string]string{token: account},
		UpgradeLimit: 1 << 30, // the benchmark dials far faster than the real edge allows
	})
	simURL := sim.ResponsesURL()
	cred := codexauth.Credential{AccessToken: token, AccountID: account}
	cfg := sim.Config(nodetest.WriteAuth(b, token, account, ""))
	cfg.Policy, cfg.Notices = pacing.PolicyFromEnv(func(k string) (string, bool) {
		if k == pacing.EnvRate {
			return "0", true
		}
		return "", false
	})
	cfg.MaxNurseryConnections = 1
	dp := nodetest.Start(b, cfg)
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	// The direct client sends what the data plane would send.
	req, err := translate.DecodeRequest(body)
	if err != nil {
		b.Fatal(err)
	}
	turn, err := translate.ToResponses(req, translate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	frame, err := turn.CreateFrame("", turn.Input)
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	var direct, proxied timings
	var xlate []time.Duration // translation alone, to split the added time
	// Warm up both paths (connection pools, JIT-free but caches).
	for range 20 {
		if _, _, err := directTurn(ctx, simURL, cred, frame); err != nil {
			b.Fatal(err)
		}
		if _, _, err := proxiedTurn(ctx, client, dp.URL, body); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ttfb, total, err := directTurn(ctx, simURL, cred, frame)
		if err != nil {
			b.Fatal(err)
		}
		direct.add(ttfb, total)
		ttfb, total, err = proxiedTurn(ctx, client, dp.URL, body)
		if err != nil {
			b.Fatal(err)
		}
		proxied.add(ttfb, total)
		start := time.Now()
		r, err := translate.DecodeRequest(body)
		if err != nil {
			b.Fatal(err)
		}
		tt, err := translate.ToResponses(r, translate.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tt.CreateFrame("", tt.Input); err != nil {
			b.Fatal(err)
		}
		xlate = append(xlate, time.Since(start))
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) {
		b.ReportMetric(float64(pct(d, 50))/1e3, name+"-p50-µs")
		b.ReportMetric(float64(pct(d, 99))/1e3, name+"-p99-µs")
	}
	report("direct-ttfb", direct.ttfb)
	report("direct-total", direct.total)
	report("dp-ttfb", proxied.ttfb)
	report("dp-total", proxied.total)
	b.ReportMetric(float64(pct(proxied.ttfb, 50)-pct(direct.ttfb, 50))/1e3, "added-ttfb-p50-µs")
	b.ReportMetric(float64(pct(proxied.ttfb, 99)-pct(direct.ttfb, 99))/1e3, "added-ttfb-p99-µs")
	b.ReportMetric(float64(pct(proxied.total, 50)-pct(direct.total, 50))/1e3, "added-total-p50-µs")
	b.ReportMetric(float64(pct(proxied.total, 99)-pct(direct.total, 99))/1e3, "added-total-p99-µs")
	report("translate-only", xlate)
	b.ReportMetric(float64(len(body)), "body-bytes")
}

type timings struct{ ttfb, total []time.Duration }

func (t *timings) add(ttfb, total time.Duration) {
	t.ttfb = append(t.ttfb, ttfb)
	t.total = append(t.total, total)
}

func pct(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i > 0 {
		i--
	}
	return s[i]
}

// directTurn is a client talking to the sim itself: dial, send, read to
// response.completed.
func directTurn(ctx context.Context, url string, cred codexauth.Credential, frame []byte) (ttfb, total time.Duration, err error) {
	start := time.Now()
	conn, err := upstream.Dial(ctx, upstream.DialOptions{URL: url, Credential: cred})
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(websocket.StatusNormalClosure, "done")
	if err := conn.Send(ctx, frame); err != nil {
		return 0, 0, err
	}
	for {
		ev, err := conn.Next(ctx)
		if err != nil {
			return 0, 0, err
		}
		if ttfb == 0 && bytes.Contains(ev, []byte(`"type":"response.output_text.delta"`)) {
			ttfb = time.Since(start)
		}
		if bytes.Contains(ev, []byte(`"type":"response.completed"`)) {
			return ttfb, time.Since(start), nil
		}
	}
}

// proxiedTurn is the same turn through the data plane: POST, read SSE to
// the end of the body.
func proxiedTurn(ctx context.Context, client *http.Client, base string, body []byte) (ttfb, total time.Duration, err error) {
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages?beta=true", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadSlice('\n')
		if ttfb == 0 && bytes.HasPrefix(line, []byte("event: content_block_delta")) {
			ttfb = time.Since(start)
		}
		if err == io.EOF {
			return ttfb, time.Since(start), nil
		}
		if err != nil {
			return 0, 0, err
		}
	}
}
