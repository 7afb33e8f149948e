// Package clienttest gives tests the real clients that clodex serves and talks
// like: Claude Code (npm @anthropic-ai/claude-code) and Codex CLI (npm
// @openai/codex), at pinned versions, installed from the npm registry into a
// cache folder outside the repository and driven non-interactively against
// servers on 127.0.0.1.
//
// The cache folder is $CLODEX_CLIENT_CACHE, or $HOME/.cache/clodex/clients when
// that is unset. Each client lives in <cache>/<name>-<version>/node_modules/.bin/.
// scripts/install-clients.sh uses the same layout and lock file, so it can
// prewarm the cache while tests run.
//
// Installs are idempotent and safe across processes: they happen under an
// exclusive flock on <cache>/.install.lock, into a temporary folder that is
// renamed into place once the client's --version shows the pinned version.
//
// [ClaudeCode] and [CodexCLI] skip the calling test only when the npm registry
// cannot be reached; any other install problem fails the test. There is no
// other switch to skip these tests.
//
// Client runs are serialized machine-wide with a flock on <cache>/.run.lock
// ([LockClientRun]; [RunClaude] and [RunCodex] take it themselves), because a
// client start-up takes a whole core for a second or more and the test
// machines have two.
//
// Every run builds its environment from scratch (PATH, a fresh HOME, TERM=dumb
// and the client's own variables), so nothing from the developer's shell or
// home folder (API keys, proxies, user config) changes what the client does,
// and the base URL must point at a loopback address: these helpers never let a
// client reach a real Anthropic or OpenAI host.
package clienttest
