package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http/httptest"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/clodex/clodex/internal/codexsim"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture selects the embedded Claude Code 2.1.332 capture (defaultCapture).
const fixture = ""

func TestParseRuns(t *testing.T) {
	tests := []struct {
		in      string
		want    []runSpec
		wantErr string
	}{
		{in: "one-message:1000:1,cc:10000:4", want: []runSpec{{"one-message", 1000, 1}, {"cc", 10000, 4}}},
		{in: " cc:2:2 ,", want: []runSpec{{"cc", 2, 2}}},
		{in: "", wantErr: "--runs is empty"},
		{in: "cc:10", wantErr: "want shape:N:turns"},
		{in: "chat:10:1", wantErr: `shape "chat"; allowed: one-message, cc`},
		{in: "cc:0:20", wantErr: `N "0"; allowed: a positive integer`},
		{in: "cc:x:20", wantErr: `N "x"`},
		{in: "cc:10:-1", wantErr: `turns "-1"`},
		{in: "one-message:10:2", wantErr: "one-message has exactly 1 turn"},
		{in: "cc:10:1", wantErr: "cc needs at least 2 turns"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := parseRuns(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseRuns(%q) error %v, want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("run %d = %v, want %v", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestParseFlagsErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr []string
	}{
		{"no url", nil, []string{"--url is required"}},
		{"bad scheme", []string{"--url", "wss://chatgpt.com/backend-api/codex/responses"}, []string{"want ws://HOST:PORT"}},
		{"several at once", []string{"--url", "ws://127.0.0.1:1/x", "--workers", "0", "--timeout", "-1s", "--token", "", "--runs", "cc:1:1"},
			[]string{"--workers 0", "--timeout -1s", "--token is empty", "cc needs at least 2 turns"}},
		{"positional", []string{"--url", "ws://127.0.0.1:1/x", "extra"}, []string{`unexpected arguments ["extra"]`}},
		{"unknown flag", []string{"--bogus"}, []string{"flag provided but not defined"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFlags(tt.args, io.Discard)
			var u *usageError
			if !errors.As(err, &u) {
				t.Fatalf("error %v, want a usage error", err)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestParseVmRSS(t *testing.T) {
	tests := []struct {
		name, status string
		want         uint64
		wantErr      string
	}{
		{"normal", "Name:\tpoolbench\nVmPeak:\t  100 kB\nVmRSS:\t   12345 kB\nRssAnon: 1 kB\n", 12345 * 1024, ""},
		{"missing", "Name:\tx\n", 0, "no VmRSS line"},
		{"unit", "VmRSS:\t 12 MB\n", 0, "unexpected line"},
		{"number", "VmRSS:\t 1x2 kB\n", 0, "not a number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseVmRSS(tt.status)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}

func TestRestore(t *testing.T) {
	tests := []struct {
		in      string
		wantLen int // characters
		prefix  string
	}{
		{"short and whole", 15, "short and whole"},
		{"héllo wörld …[truncated; 40 chars total]", 40, "héllo wörld"},
		{"already longer than recorded …[truncated; 5 chars total]", 28, "already longer than recorded"},
	}
	for _, tt := range tests {
		got := restore(tt.in)
		if n := utf8.RuneCountInString(got); n != tt.wantLen || !strings.HasPrefix(got, tt.prefix) || strings.Contains(got, "truncated") {
			t.Errorf("restore(%q) = %q (%d chars), want %d chars starting %q", tt.in, got, n, tt.wantLen, tt.prefix)
		}
	}
}

func TestLoadTemplateErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path, wantErr string
	}{
		{"missing file", dir + "/nope.json", "load fixture"},
		{"not json", write("bad.json", "{"), "load fixture"},
		{"no body", write("nobody.json", `{"t":1}`), `no "body" object`},
		{"no prompt", write("noprompt.json", `{"body":{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}}`), "no user message with a system reminder"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := loadTemplate(tt.path)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

// TestFixtureRequestIsClaudeCodeShape checks the request built from the
// capture: the recorded sizes are restored, the summarised tool schemas
// are rebuilt and translate accepts every turn of a cc conversation.
func TestFixtureRequestIsClaudeCodeShape(t *testing.T) {
	tp, err := loadTemplate(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if tp.firstText != "say hi" {
		t.Errorf("prompt %q, want the capture's %q", tp.firstText, "say hi")
	}
	c := tp.newConversation("s-1", "hello")
	body := tp.body(c)
	if bytes.Contains(body, []byte("truncated;")) || bytes.Contains(body, []byte("input_schema.properties")) {
		t.Error("body still holds a truncation marker or a summarised schema")
	}
	// The capture records 48,786 bytes of body; restored, ours is close.
	if len(body) < 40000 || len(body) > 60000 {
		t.Errorf("body is %d bytes, want about the captured 48,786", len(body))
	}
	pr, err := prepare(tp, c, "acct")
	if err != nil {
		t.Fatal(err)
	}
	other, err := prepare(tp, tp.newConversation("s-2", "hello"), "acct")
	if err != nil {
		t.Fatal(err)
	}
	if pr.part.PromptCacheKey == "" || pr.part.PromptCacheKey == other.part.PromptCacheKey {
		t.Errorf("prompt cache keys %q and %q: want distinct per session", pr.part.PromptCacheKey, other.part.PromptCacheKey)
	}
	if want := "relay-session-"; !strings.HasPrefix(pr.part.PromptCacheKey, want) {
		t.Errorf("prompt cache key %q, want one keyed by the session (%s...)", pr.part.PromptCacheKey, want)
	}
	if pr.part.Model != "gpt-5-codex" || pr.part.Account != "acct" {
		t.Errorf("partition %+v, want model gpt-5-codex account acct", pr.part)
	}
}

func TestSessionUUID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := sessionUUID("a"), sessionUUID("b")
	if !uuid.MatchString(a) || !uuid.MatchString(b) || a == b || a != sessionUUID("a") {
		t.Errorf("sessionUUID: %q, %q; want distinct, stable version-4 UUIDs", a, b)
	}
}

func TestToolResultIsTwoKB(t *testing.T) {
	r := toolResult("conv", 3, "toolu_1", ccDirective(4, 20))
	var v struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(r, &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Content) != 2048 || !strings.HasSuffix(v.Content, "\n#sim reasoning Looking at the failures | Running package 4 next\n#sim call Bash {\"command\":\"go test ./pkg/4/...\",\"description\":\"Run the tests of package 4\"}") {
		t.Errorf("tool result is %d bytes ending %q; want 2048 ending with turn 5's directive", len(v.Content), v.Content[max(0, len(v.Content)-80):])
	}
}

// TestRunAgainstEmulator runs the whole benchmark, small, against an
// in-process clodex-sim on a real loopback listener and checks the
// figures a reader of the table can verify by hand.
func TestRunAgainstEmulator(t *testing.T) {
	sim, err := codexsim.New(codexsim.Config{AcceptTokens: map[string]string{"tok-test": "acct-test"}, UpgradeLimit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(sim.Handler())
	t.Cleanup(func() {
		_ = sim.Close()
		ts.Close()
	})
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + codexsim.ChatGPTPath
	var out, logs bytes.Buffer
	prof := t.TempDir() + "/heap"
	err = run(t.Context(), []string{"--url", url, "--token", "tok-test", "--account", "acct-test", "--fixture", fixture,
		"--runs", "one-message:4:1,cc:3:4", "--workers", "2", "--bytes-turns", "5", "--agents", "3", "--rounds", "3", "--timeout", "2m", "--memprofile", prof}, &out, &logs)
	if err != nil {
		t.Fatalf("run: %v\n%s\n%s", err, out.String(), logs.String())
	}
	text := out.String()
	t.Log("\n" + text)
	for _, want := range []*regexp.Regexp{
		// shape, conversations, turns; then heads 4, 0 continuations, 4 open
		// sockets, 0 not found. (The in-process emulator's own goroutines
		// and buffers make the memory columns meaningless here.)
		regexp.MustCompile(`one-message\s+4\s+1\s+.*\s4\s+0\s+4\s+0\s+(ok|ABOVE)`),
		// 3 conversations x 4 turns: 3 heads, 9 continuations, 3 open sockets.
		regexp.MustCompile(`cc\s+3\s+4\s+.*\s3\s+9\s+3\s+0\s+(ok|ABOVE)`),
		regexp.MustCompile(`5-turn Claude-Code-shaped conversation .*, 4/5 turns continued`),
		// kept: 3 sockets for 9 turns; closed: 3 + 2 per later round = 7.
		regexp.MustCompile(`parallel heads kept \(this pool\)\s+3\s+3\s+33\.3\s+6\s+2\s+2`),
		regexp.MustCompile(`parallel sockets closed \(original\)\s+7\s+7\s+77\.8\s`),
	} {
		if !want.MatchString(text) {
			t.Errorf("output does not match %v", want)
		}
	}
	for _, suffix := range []string{".one-message-4", ".cc-3"} {
		if fi, err := os.Stat(prof + suffix); err != nil || fi.Size() == 0 {
			t.Errorf("heap profile %s: %v, want a non-empty file", prof+suffix, err)
		}
	}
	m := regexp.MustCompile(`input-item bytes\s+(\d+)\s+(\d+)\s+([\d.]+)%`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no input-item bytes line")
	}
	pooled, _ := strconv.Atoi(m[1])
	full, _ := strconv.Atoi(m[2])
	if pooled <= 0 || pooled >= full {
		t.Errorf("pooled input bytes %s not below the full resend %s", m[1], m[2])
	}
}

func TestRunRefusesUnreachableEmulator(t *testing.T) {
	ts := httptest.NewServer(nil)
	url := "ws" + strings.TrimPrefix(ts.URL, "http") + "/backend-api/codex/responses"
	ts.Close()
	err := run(t.Context(), []string{"--url", url, "--fixture", fixture}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "is clodex-sim running at --url?") {
		t.Fatalf("error %v, want one naming the emulator", err)
	}
}
