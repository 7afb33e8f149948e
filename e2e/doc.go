// Package e2e holds clodex's end-to-end tests: the real Claude Code
// (npm @anthropic-ai/claude-code, pinned by package internal/clienttest)
// runs `claude -p` against the data plane, assembled exactly as
// clodex-dataplane runs it (package internal/node: gateway, connection
// pool, admission through the embedded control plane's gRPC path), which
// talks over a real loopback WebSocket to clodex-sim (package
// internal/codexsim), the emulator of the ChatGPT Codex Responses backend.
// Nothing leaves 127.0.0.1.
//
// The package has no exported API; it is only tests.
//
// # The stack
//
// Each test starts its own stack: the emulator on an httptest server, the
// data plane on a loopback listener with a Codex auth.json holding a token
// the emulator accepts, its upstream URL aimed at the emulator's ChatGPT
// path. Two records show what happened, so a test can assert every hop
// and not only what Claude Code printed:
//
//   - Claude Code talks to a recording reverse proxy in front of the data
//     plane, which records every request (method, path, body, status) and
//     hands it on unchanged;
//   - the emulator records every frame of every upstream socket
//     (codexsim.Config.RecordFrames): each response.create the data plane
//     sent and every event it answered, per socket and per turn, as the
//     backend's side of the wire saw them.
//
// The emulator's counters are read over HTTP (GET /sim/stats), so the same
// assertions hold for a stack made of the real binaries (clodex-sim and
// clodex-dataplane as processes); a variant that execs them only needs to
// produce the same stack fields (see newStack and startInProcess in
// harness_test.go). TestMain checks with goleak that every stack shut down
// completely.
//
// # Cases
//
// Claude Code runs one case at a time (clienttest serialises client runs
// machine-wide), with a fresh HOME, an environment built from scratch,
// auto-updater and nonessential traffic off, CLAUDE_CODE_MAX_RETRIES=0 and
// a bounded timeout:
//
//   - a plain text turn whose deltas really stream through (stream_event
//     lines with text_delta), with the requested model echoed back;
//   - a Bash tool round trip: the emulator asks for Bash, Claude Code runs
//     `echo`, sends the tool_result, and the emulator's answer quoting the
//     tool output is the final result; both turns run on ONE upstream
//     socket, the second continuing the first with previous_response_id
//     and sending only the new items;
//   - a thinking-signature round trip: the emulator's reasoning item
//     becomes a thinking block whose signature is the encrypted_content;
//     Claude Code sends it back with the tool result, and the data plane
//     continues the response that holds that reasoning item on the same
//     socket (the conversation the backend sees keeps it in place);
//   - a cheap plain-HTTP check of the preconnect (HEAD /api/hello) and
//     count_tokens.
//
// The Claude Code cases skip only when the pinned client is not cached, the
// npm registry cannot be reached and neither CI=true nor
// CLODEX_REQUIRE_CLIENTS=1 is set; under those they fail saying why
// (clienttest.ClaudeCode decides and remembers the outcome, so after the
// first case the others skip or fail at once). Set E2E_DUMP=1 to log every
// stream-json line Claude Code printed.
//
// Run them with
//
//	go test -race -count=1 ./e2e/
package e2e
