package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/dataplane/upstream/upstreamtest"
)

// ccShape is the Claude Code 2.1.332 request shape from the captured
// fixture, in Responses form: instructions (the system blocks), tools
// (function tools), and the first turn's input items. The fixture
// truncates long strings ("…[truncated; N chars total]"); they are padded
// back to their recorded length so the sizes are real.
type ccShape struct {
	instructions string
	tools        []json.RawMessage
	first        [][]byte // developer context + first user message
}

var truncated = regexp.MustCompile(`\s*…\[truncated; (\d+) chars total\]$`)

// restore pads a truncated fixture string back to its recorded length.
func restore(s string) string {
	m := truncated.FindStringSubmatchIndex(s)
	if m == nil {
		return s
	}
	total, _ := strconv.Atoi(s[m[2]:m[3]])
	s = s[:m[0]]
	if pad := total - len([]rune(s)); pad > 0 {
		s += strings.Repeat("lorem ipsum ", pad/12+1)[:pad]
	}
	return s
}

func loadCCShape(tb testing.TB) ccShape {
	tb.Helper()
	raw, err := os.ReadFile("testdata/cc-2.1.332-messages-request-custom-model.json")
	if err != nil {
		tb.Fatal(err)
	}
	var fx struct {
		Body struct {
			System []struct {
				Text string `json:"text"`
			} `json:"system"`
			Messages []struct {
				Role    string `json:"role"`
				Content []struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"messages"`
			Tools []map[string]any `json:"tools"`
		} `json:"body"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		tb.Fatal(err)
	}
	var sh ccShape
	var sys []string
	for _, b := range fx.Body.System {
		sys = append(sys, restore(b.Text))
	}
	sh.instructions = strings.Join(sys, "\n")
	for _, t := range fx.Body.Tools {
		params, _ := t["input_schema"].(map[string]any)
		if params == nil { // summarised tool: rebuild a schema from its property names
			props := map[string]any{}
			names, _ := t["input_schema.properties"].([]any)
			for _, n := range names {
				props[fmt.Sprint(n)] = map[string]any{"type": "string", "description": "The " + fmt.Sprint(n) + " of the call, as described in the tool's documentation."}
			}
			params = map[string]any{"type": "object", "properties": props}
		}
		desc, _ := t["description"].(string)
		sh.tools = append(sh.tools, mustJSON(map[string]any{"type": "function", "name": t["name"], "description": restore(desc), "parameters": params, "strict": false}))
	}
	for _, m := range fx.Body.Messages {
		var parts []any
		for _, c := range m.Content {
			parts = append(parts, map[string]any{"type": "input_text", "text": restore(c.Text)})
		}
		role := m.Role
		if role == "system" {
			role = "developer"
		}
		sh.first = append(sh.first, mustJSON(map[string]any{"type": "message", "role": role, "content": parts}))
	}
	return sh
}

// filler returns n bytes of text that differ by seed.
func filler(seed string, n int) string {
	s := strings.Repeat(seed+" src/module/file.go:42: ok; ", n/len(seed)+1)
	return s[:n]
}

// ccTurn is one Claude-Code-shaped tool turn: the assistant's reasoning
// (encrypted blob), a Bash call, and a 2 KB tool result.
func ccTurn(conv string, i int) (assistantOut [][]byte, toolResult []byte) {
	id := fmt.Sprintf("call_%s_%02d", conv, i)
	return items(
			reasoning(filler("gAAAAABp"+conv, 1200)),
			call(id, fmt.Sprintf(`{"command":"go test ./pkg/%d/...","description":"Run the tests of package %d"}`, i, i)),
		),
		callOutput(id, filler(fmt.Sprintf("%s-%d", conv, i), 2048))
}

// benchConfig is a pool over in-memory sockets to an upstreamtest pipe
// server whose peers read but never send: real coder/websocket sockets
// (both sides), without a descriptor per socket, so that 10,000 heads fit
// in one test process. A loopback socket's kernel buffers and TLS are
// measured by bench/pool.
func benchConfig(tb testing.TB) (Config, *upstreamtest.Server) {
	srv := upstreamtest.NewPipe(tb)
	return Config{
		Upstream:    upstream.DialOptions{URL: srv.URL, HTTPClient: srv.Client()},
		Credentials: staticCredentials(testCred),
	}, srv
}

func rssBytes() uint64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(f[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

func heapAfterGC() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkIdleHeadMemory measures what an idle pooled conversation keeps:
// heap after runtime.GC() and RSS growth, per head, with
// 1,000 and 10,000 heads, for a one-message conversation and a 20-turn
// Claude Code 2.1.332-shaped one. Run with -benchtime=1x.
func BenchmarkIdleHeadMemory(b *testing.B) {
	sh := loadCCShape(b)
	convs := map[string]func(conv string) (in, out [][]byte){
		"one-message": func(conv string) (in, out [][]byte) {
			return items(user("say hi " + conv)), items(assistant("Hi! How can I help?"))
		},
		"cc-20-turn": func(conv string) (in, out [][]byte) {
			in = cat(sh.first[:len(sh.first):len(sh.first)], items(user("fix the failing tests in "+conv)))
			for i := range 20 {
				out, res := ccTurn(conv, i)
				in = append(append(in, out...), res)
			}
			return in, items(reasoning(filler("gAAAAABfinal", 1200)), assistant(filler("All tests pass now.", 600)))
		},
	}
	for _, name := range []string{"one-message", "cc-20-turn"} {
		for _, n := range []int{1000, 10000} {
			b.Run(fmt.Sprintf("%s/heads=%d", name, n), func(b *testing.B) {
				// Every conversation shares one template's bytes (only the
				// pool's copies are measured); the first item differs.
				in, out := convs[name]("template")
				var inputBytes int
				for _, it := range in {
					inputBytes += len(it)
				}
				for b.Loop() {
					cfg, _ := benchConfig(b)
					heap0, rss0 := heapAfterGC(), rssBytes()
					p, err := New(cfg)
					if err != nil {
						b.Fatal(err)
					}
					for i := range n {
						conv := strconv.Itoa(i)
						req := append(items(user("conversation "+conv)), in[1:]...)
						pt := Partition{Account: "acct", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "pck-" + conv}
						l, err := p.Acquire(b.Context(), pt, req)
						if err != nil {
							b.Fatal(err)
						}
						l.Complete(fmt.Sprintf("resp_%040d", i), out, Usage{})
					}
					heap1, rss1 := heapAfterGC(), rssBytes()
					if s := p.Stats(); s.Nursery != n {
						b.Fatalf("%d nursery heads, want %d", s.Nursery, n)
					}
					b.ReportMetric(float64(heap1-heap0)/float64(n), "heap-B/head")
					b.ReportMetric(float64(int64(rss1)-int64(rss0))/float64(n), "rss-B/head")
					b.ReportMetric(float64(len(in)+len(out)), "items/conv")
					b.ReportMetric(float64(inputBytes), "input-B/conv")
					runtime.KeepAlive(p)
					_ = p.Close()
				}
			})
		}
	}
}

// upstreamBytes replays a 30-turn Claude-Code-shaped conversation, each
// turn adding a 2 KB tool result, through the pool, and returns the input
// item bytes and whole response.create frame bytes actually sent, and the
// same for resending the full history every turn.
func upstreamBytes(tb testing.TB) (pooledInput, fullInput, pooledFrame, fullFrame int) {
	sh := loadCCShape(tb)
	cfg, _ := benchConfig(tb)
	p, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	pt := Partition{Account: "acct", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "pck-bytes"}
	hist := cat(sh.first[:len(sh.first):len(sh.first)], items(user("fix the failing tests")))
	frame := func(prev string, in [][]byte) int {
		f := map[string]any{"type": "response.create", "model": pt.Model, "instructions": sh.instructions,
			"tools": sh.tools, "tool_choice": "auto", "parallel_tool_calls": true, "store": false, "stream": true,
			"reasoning": map[string]any{"effort": "high", "summary": "auto"}, "include": []string{"reasoning.encrypted_content"},
			"prompt_cache_key": pt.PromptCacheKey, "input": rawItems(in)}
		if prev != "" {
			f["previous_response_id"] = prev
		}
		return len(mustJSON(f))
	}
	size := func(in [][]byte) int {
		n := 0
		for _, it := range in {
			n += len(it)
		}
		return n
	}
	for i := range 30 {
		l, err := p.Acquire(context.Background(), pt, hist)
		if err != nil {
			tb.Fatal(err)
		}
		if i > 0 && l.Decision != DecisionContinuation {
			tb.Fatalf("turn %d: %s, want continuation", i, l.Decision)
		}
		pooledInput += size(hist[l.Delta:])
		fullInput += size(hist)
		pooledFrame += frame(l.PreviousResponseID, hist[l.Delta:])
		fullFrame += frame("", hist)
		out, res := ccTurn("bytes", i)
		l.Complete(fmt.Sprintf("resp_%d", i), out, Usage{})
		hist = append(append(hist, out...), res)
	}
	return pooledInput, fullInput, pooledFrame, fullFrame
}

// TestUpstreamInputBytesUnderTenPercent pins the pool's target: on a
// 30-turn conversation the continued input items are at most 10% of
// resending the whole history.
func TestUpstreamInputBytesUnderTenPercent(t *testing.T) {
	pi, fi, pf, ff := upstreamBytes(t)
	pct := 100 * float64(pi) / float64(fi)
	t.Logf("input items: %d B sent vs %d B full (%.1f%%); whole frames: %d B vs %d B (%.1f%%)", pi, fi, pct, pf, ff, 100*float64(pf)/float64(ff))
	if pct > 10 {
		t.Errorf("continued input is %.1f%% of full resend, want <= 10%%", pct)
	}
}

// BenchmarkUpstreamBytes30Turns reports the same figures as metrics.
func BenchmarkUpstreamBytes30Turns(b *testing.B) {
	var pi, fi, pf, ff int
	for b.Loop() {
		pi, fi, pf, ff = upstreamBytes(b)
	}
	b.ReportMetric(float64(pi), "pooled-input-B")
	b.ReportMetric(float64(fi), "full-input-B")
	b.ReportMetric(100*float64(pi)/float64(fi), "input-%")
	b.ReportMetric(float64(pf), "pooled-frame-B")
	b.ReportMetric(float64(ff), "full-frame-B")
	b.ReportMetric(100*float64(pf)/float64(ff), "frame-%")
}

// fanOutSockets runs 20 subagents sharing one session for 5 rounds (100
// turns), every round fully in flight before any completes, and returns
// how many sockets were opened. keepParallel false replays the original
// design, which closed a parallel socket after its response.
func fanOutSockets(tb testing.TB, keepParallel bool) (sockets int, saved uint64) {
	cfg, srv := benchConfig(tb)
	clock := newFakeClock()
	cfg.Clock = clock.Now
	p, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	defer p.Close()
	pt := Partition{Account: "acct", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "pck-parent"}
	const agents, rounds = 20, 5
	hist := make([][][]byte, agents)
	for a := range agents {
		hist[a] = items(user(fmt.Sprintf("subagent %d: investigate", a)))
	}
	for r := range rounds {
		leases := make([]*Lease, agents)
		for a := range agents {
			l, err := p.Acquire(context.Background(), pt, hist[a])
			if err != nil {
				tb.Fatal(err)
			}
			leases[a] = l
		}
		clock.Advance(20 * time.Second)
		for a, l := range leases {
			out, res := ccTurn(fmt.Sprint(a), r)
			if !keepParallel && l.Decision == DecisionParallelHead {
				l.Discard("isolated socket done")
			} else {
				l.Complete(fmt.Sprintf("r%d-%d", r, a), out, Usage{})
			}
			hist[a] = append(append(hist[a], out...), res)
		}
	}
	return srv.Upgrades(), p.Stats().SavedSockets
}

func TestSubagentFanOutSockets(t *testing.T) {
	pooled, saved := fanOutSockets(t, true)
	original, _ := fanOutSockets(t, false)
	t.Logf("new sockets per 100 turns, 20 subagents: %d with parallel heads kept, %d when closed (saved counter %d)", pooled, original, saved)
	if pooled != 20 || saved != 19 {
		t.Errorf("sockets %d saved %d, want 20 and 19", pooled, saved)
	}
	if original != 20+19*4 {
		t.Errorf("original design opened %d sockets, want %d", original, 20+19*4)
	}
}

// BenchmarkSubagentFanOutSockets reports new sockets per 100 turns.
func BenchmarkSubagentFanOutSockets(b *testing.B) {
	var pooled, original int
	var saved uint64
	for b.Loop() {
		pooled, saved = fanOutSockets(b, true)
		original, _ = fanOutSockets(b, false)
	}
	b.ReportMetric(float64(pooled), "sockets/100turns")
	b.ReportMetric(float64(original), "sockets/100turns-closed-parallel")
	b.ReportMetric(float64(saved), "saved-sockets")
}

// BenchmarkAcquireContinuation is the per-turn cost of Acquire + Complete
// on a continuation while 10,000 other idle heads are pooled.
func BenchmarkAcquireContinuation(b *testing.B) {
	cfg, _ := benchConfig(b)
	p, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	for i := range 10000 {
		pt := Partition{Account: "acct", Model: "gpt-5-codex", PromptCacheKey: fmt.Sprintf("idle-%d", i)}
		l, err := p.Acquire(ctx, pt, items(user(fmt.Sprint(i))))
		if err != nil {
			b.Fatal(err)
		}
		l.Complete(fmt.Sprintf("resp_idle_%d", i), items(assistant("ok")), Usage{})
	}
	const convs = 1000
	hist := make([][][]byte, convs)
	parts := make([]Partition, convs)
	for c := range convs {
		parts[c] = Partition{Account: "acct", Model: "gpt-5-codex", PromptCacheKey: fmt.Sprintf("busy-%d", c)}
		hist[c] = items(user(fmt.Sprint("start ", c)))
		l, err := p.Acquire(ctx, parts[c], hist[c])
		if err != nil {
			b.Fatal(err)
		}
		out := items(assistant("a"))
		l.Complete("r0", out, Usage{})
		hist[c] = append(hist[c], out...)
	}
	reply := items(assistant("a"))
	i := 0
	for b.Loop() {
		c := i % convs
		i++
		hist[c] = append(hist[c], user(strconv.Itoa(i)))
		l, err := p.Acquire(ctx, parts[c], hist[c])
		if err != nil {
			b.Fatal(err)
		}
		if l.Decision != DecisionContinuation {
			b.Fatalf("decision %s", l.Decision)
		}
		l.Complete("r"+strconv.Itoa(i), reply, Usage{})
		hist[c] = append(hist[c], reply...)
	}
}
