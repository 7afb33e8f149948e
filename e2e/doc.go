// Package e2e holds clodex's end-to-end tests: the real Claude Code
// (npm @anthropic-ai/claude-code, pinned by package internal/clienttest)
// runs `claude -p` against the data plane, assembled exactly as
// clodex-dataplane runs it (package internal/node), which talks over a
// real loopback WebSocket to clodex-sim (package internal/codexsim).
// Nothing leaves 127.0.0.1. The package has no exported API.
//
//	go test -race -count=1 ./e2e/          # E2E_DUMP=1 logs every stream-json line Claude Code printed
//
// harness_test.go builds each test's own stack (newStack, startInProcess):
// the emulator on an httptest server, the data plane on a loopback
// listener with a Codex auth.json the emulator accepts, and two records
// of every hop: a recording reverse proxy in front of the data plane
// (each request's method, path, body and status) and the emulator's
// record of every frame of every upstream socket
// (codexsim.Config.RecordFrames). The emulator's counters are read over
// HTTP (GET /sim/stats), so the same assertions hold for a stack of the
// real binaries. TestMain (main_test.go) checks with goleak that every
// stack shut down completely.
//
// The cases run one at a time (clienttest serialises client runs), each
// with a fresh HOME and an environment built from scratch:
//
//   - claude_test.go, with CLAUDE_CODE_MAX_RETRIES=0: a streamed text
//     turn with the requested model echoed back; a Bash tool round trip
//     whose second turn continues the first on the same upstream socket
//     with previous_response_id and only the new items; a
//     thinking-signature round trip (the reasoning item's
//     encrypted_content as the signature, continued on the same socket);
//     and plain-HTTP checks of the preconnect and count_tokens;
//   - clients_test.go, the client matrix, side by side through one stack
//     under one hold of the client run lock: node scripts in
//     testdata/clients (run with the pinned library set of
//     internal/clienttest) drive the Vercel AI SDK (generateText,
//     streamText, a tool loop, Output.object, a far usage limit),
//     LangChain (.stream() usage on a first and a continued turn,
//     withStructuredOutput) and the Claude Agent SDK with the pinned
//     Claude Code (a tool loop, then the session resumed); opencode's
//     usage-limit case ends with the message. Each prints what its user
//     sees as JSON lines, which the cases assert;
//   - member_test.go: Claude Code through a member key, against a data
//     plane serving member keys and a control plane holding the member
//     (and refused, once, with a key no member holds);
//   - failure_test.go, with Claude Code's default retries: a persistent
//     upstream failure shown within four minutes, and a backend stopped
//     for 20 s in the middle of a tool round trip that the turn rides out
//     (docs/errors.md §8.4).
//
// The real-client cases skip only when a pinned client is not cached,
// the npm registry cannot be reached and neither CI=true nor
// CLODEX_REQUIRE_CLIENTS=1 is set; under those they fail saying why.
package e2e
