// Package captures holds the traffic of the real clients clodex serves,
// captured offline and sanitised, for tests, fuzz seeds and benchmarks:
//
//   - claude-code/: requests Claude Code 2.1.197 and 2.1.332 sent to a local
//     stub (Messages, count_tokens, the tool and thinking round trips), how it
//     retried each error status, and the stub replies it accepted;
//   - codex/: Codex CLI 0.171.0's HTTP requests and WebSocket sessions (API
//     key and ChatGPT mode), its side endpoints and its configuration files.
//
// Files are named after the client and version that produced them. They are
// embedded, so a test reads them the same way from any working directory:
//
//	raw, err := captures.ReadFile("claude-code/cc-2.1.332-messages-request-bare.json")
//
// Capture files are data: edit them only to re-capture.
package captures

import (
	"embed"
	"fmt"
	"io/fs"
)

//go:embed claude-code codex
var files embed.FS

// FS is every capture, under claude-code/ and codex/.
var FS fs.FS = files

// ReadFile returns the capture at name ("claude-code/…" or "codex/…").
func ReadFile(name string) ([]byte, error) {
	b, err := fs.ReadFile(files, name)
	if err != nil {
		return nil, fmt.Errorf("read capture %s: %w", name, err)
	}
	return b, nil
}
