// Package clienttest gives tests the real clients that clodex serves and
// talks like: Claude Code (npm @anthropic-ai/claude-code), Codex CLI
// (npm @openai/codex), opencode (npm opencode-ai) and the client libraries
// node scripts import (the Vercel AI SDK, the Claude Agent SDK, LangChain),
// at pinned versions, installed from the npm registry into a cache folder
// outside the repository and driven non-interactively against servers on
// 127.0.0.1.
//
//	bin := clienttest.ClaudeCode(t) // installed once into the cache; fails (or skips) saying why
//	res := clienttest.RunClaude(ctx, t, bin, clienttest.ClaudeRun{BaseURL: url, Prompt: "hi"})
//	codex := clienttest.CodexCLI(t) // RunCodex drives it the same way; Opencode and RunOpencode too
//	libs := clienttest.NodeLibraries(t) // node_modules of nodelibs/package.json
//	out := clienttest.RunNode(ctx, t, clienttest.NodeRun{Script: "testdata/x.mjs", Libraries: libs, BaseURL: url})
//	tmux := clienttest.Tool(t, "tmux", "apt-get install tmux") // another program a test needs
//
// The parts, by file: install.go and policy.go, the cache
// ($CLODEX_CLIENT_CACHE, else $HOME/.cache/clodex/clients; each client in
// <cache>/<name>-<version>/node_modules/.bin/) and when a missing client
// fails or skips the test; libs.go, the library set (nodelibs/, installed
// with npm ci into <cache>/node-libs-<lock digest>/node_modules) and
// opencode's pin; claude.go, codex.go, opencode.go and node.go, the runs
// (RunNode runs a copy of the script next to a node_modules link, so its
// imports resolve to the pinned set); run.go, the
// environment every run builds from scratch (PATH, a fresh HOME, TERM=dumb
// and the client's own variables, a loopback base URL only, so nothing
// from the developer's shell or home changes what the client does and no
// client reaches a real Anthropic or OpenAI host); lock.go, the flocks.
//
// Installs are idempotent and safe across processes: under an exclusive
// flock on <cache>/.install.lock, into a temporary folder renamed into
// place once the client's --version shows the pinned version (a library
// set: once every package has its pinned version);
// scripts/install-clients.sh uses the same layout and lock, so it can
// prewarm the cache while tests run. Client runs are serialised
// machine-wide with a flock on <cache>/.run.lock ([LockClientRun];
// RunClaude and RunCodex take it; RunNode and RunOpencode too unless the
// caller holds it for a group of runs it starts side by side), because a
// client start-up takes a whole core for a second or more and the test
// machines have two. Every lock wait and every npm install has a deadline
// and says on stderr what it waits for (the lock holder's pid and what it
// does, from the <lock>.holder file each holder writes; the install and
// its limit); one that reaches its deadline fails naming it.
//
// When a client cannot be had the test fails with one line naming the
// client, the cache folder, what failed and how to fix it. The one
// exception: a client not cached with the npm registry unreachable skips
// the test, unless CI=true or CLODEX_REQUIRE_CLIENTS=1 require the real
// clients. The outcome is remembered for the test process (only the first
// skip spells out the reason), and an unreachable registry is recorded in
// <cache>/.registry-unreachable, which other test processes trust for ten
// minutes; the README's "Tests and benchmarks" describes the rule for
// people running the suite.
package clienttest
