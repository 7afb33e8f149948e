package clienttest

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestCheckLoopback(t *testing.T) {
	tests := []struct {
		url     string
		wantErr string // "" = accepted
	}{
		{url: "http://127.0.0.1:8080", wantErr: ""},
		{url: "http://127.0.0.1:8080/v1", wantErr: ""},
		{url: "https://127.0.0.5:443/backend-api/", wantErr: ""},
		{url: "http://[::1]:9000", wantErr: ""},
		{url: "ws://localhost:1234/v1", wantErr: ""},
		{url: "https://api.anthropic.com", wantErr: "must be a loopback address"},
		{url: "http://api.openai.com/v1", wantErr: "must be a loopback address"},
		{url: "http://10.0.0.1:80", wantErr: "must be a loopback address"},
		{url: "http://127.0.0.1.nip.io:80", wantErr: "must be a loopback address"},
		{url: "ftp://127.0.0.1/", wantErr: "scheme must be http, https, ws or wss"},
		{url: "127.0.0.1:8080", wantErr: `base URL "127.0.0.1:8080"`},
		{url: "", wantErr: "scheme must be"},
		{url: "http://[::1", wantErr: "missing ']'"},
	}
	for _, tt := range tests {
		err := checkLoopback(tt.url)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("checkLoopback(%q) = %v, want nil", tt.url, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("checkLoopback(%q) = %v, want an error containing %q", tt.url, err, tt.wantErr)
		}
	}
}

// fatalTB records Fatal calls and stops the calling goroutine like testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Fatal(args ...any) { f.msg = fmt.Sprint(args...); runtime.Goexit() }
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// runFatal runs fn with a fatalTB in its own goroutine and returns the Fatal
// message ("" when fn returned normally).
func runFatal(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(f)
	}()
	<-done
	return f.msg
}

func TestRunRefusesBadInputBeforeStarting(t *testing.T) {
	// "/nonexistent" as the binary: reaching the start would fail differently.
	tests := []struct {
		name string
		run  func(tb testing.TB)
		want string
	}{
		{
			name: "claude real host",
			run: func(tb testing.TB) {
				RunClaude(t.Context(), tb, "/nonexistent", ClaudeRun{BaseURL: "https://api.anthropic.com", Prompt: "hi"})
			},
			want: `RunClaude: base URL "https://api.anthropic.com": host must be a loopback address`,
		},
		{
			name: "claude no prompt",
			run: func(tb testing.TB) {
				RunClaude(t.Context(), tb, "/nonexistent", ClaudeRun{BaseURL: "http://127.0.0.1:1"})
			},
			want: "RunClaude: Prompt is empty",
		},
		{
			name: "codex real host",
			run: func(tb testing.TB) {
				RunCodex(t.Context(), tb, "/nonexistent", CodexRun{BaseURL: "https://api.openai.com/v1", Prompt: "hi"})
			},
			want: `RunCodex: base URL "https://api.openai.com/v1": host must be a loopback address`,
		},
		{
			name: "codex no prompt",
			run: func(tb testing.TB) {
				RunCodex(t.Context(), tb, "/nonexistent", CodexRun{BaseURL: "http://127.0.0.1:1/v1"})
			},
			want: "RunCodex: Prompt is empty",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := runFatal(t, tt.run); !strings.HasPrefix(got, tt.want) {
				t.Errorf("Fatal message = %q, want prefix %q", got, tt.want)
			}
		})
	}
}

func TestRunReportsTimeout(t *testing.T) {
	// A "client" that never answers: the run must stop at its timeout and
	// kill the whole process group.
	res := process{bin: "/bin/sh", args: []string{"-c", "sleep 60 & wait"}, dir: t.TempDir(), timeout: 200 * time.Millisecond}.run(t.Context())
	if res.exitCode != -1 || res.err == nil || !strings.Contains(res.err.Error(), "stopped after 200ms") {
		t.Errorf("run() = exit %d, err %v; want exit -1 and a 'stopped after 200ms' error", res.exitCode, res.err)
	}
}

func TestCodexConfigQuotesValues(t *testing.T) {
	cfg := codexConfig(CodexRun{BaseURL: `http://127.0.0.1:1/v1?x="y"`, Model: `we"ird\model`})
	for _, want := range []string{
		`model = "we\"ird\\model"`,
		`base_url = "http://127.0.0.1:1/v1?x=\"y\""`,
		"supports_websockets = true",
		"[model_providers.clodextest]",
	} {
		if !strings.Contains(cfg, want) {
			t.Errorf("codexConfig() lacks %q:\n%s", want, cfg)
		}
	}
	if cfg := codexConfig(CodexRun{HTTP: true}); !strings.Contains(cfg, "supports_websockets = false") {
		t.Errorf("codexConfig(HTTP) lacks supports_websockets = false:\n%s", cfg)
	}
}
