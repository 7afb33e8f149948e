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
// When a client cannot be had, [ClaudeCode] and [CodexCLI] fail the test with
// one line naming the client, the cache folder, what failed and how to fix
// it. The one exception: when the client is not cached and the npm registry
// cannot be reached, the test is skipped, unless CI is set (CI=true, as CI
// systems do) or CLODEX_REQUIRE_CLIENTS=1, which require the real clients:
// then it fails too. There is no other switch to skip these tests. The
// outcome is remembered for the rest of the test process, so only the first
// test pays for an install or a probe, and only the first skip spells out
// the reason; the others point to it.
//
// An unreachable registry is also recorded in <cache>/.registry-unreachable
// (the Unix time, then the reason), by the Go installer and by
// scripts/install-clients.sh, which `make test` runs first. Other test
// processes of the same run trust a record at most ten minutes old instead
// of probing the registry again; an older one is ignored and a successful
// probe removes it, so a registry that came back is noticed within ten
// minutes (or at once after deleting the file).
//
// [Tool] applies the same rule to another program a test needs (tmux for the
// interactive Claude Code test): missing, it fails the test under CI and
// skips it otherwise, saying how to install it.
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
