#!/usr/bin/env bash
# install-clients.sh installs what clodex's real-client tests need: the pinned Claude Code, Codex
# CLI and opencode, and the client libraries the e2e tests' node scripts import (the Vercel AI SDK,
# the Claude Agent SDK, LangChain; pinned by internal/clienttest/nodelibs/package.json and its
# package-lock.json), into a cache folder outside the repository, and tmux (the interactive Claude
# Code test drives the TUI in a tmux pane):
#
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/claude-code-<version>/node_modules/.bin/claude
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/codex-<version>/node_modules/.bin/codex
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/opencode-<version>/node_modules/.bin/opencode
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/node-libs-<first 12 hex digits of the lock's SHA-256>/node_modules
#
# The layout, the lock file and the versions are the same as in internal/clienttest, so this script
# and the Go tests can run at the same time. An install is idempotent: a client whose `--version`
# already shows the pinned version is left alone. A new install goes into a temporary folder that is
# renamed into place only after its `--version` check passed, under an exclusive flock on
# <cache>/.install.lock. tmux is installed with apt-get when it is missing and this runs as root.
#
# When the npm registry cannot be reached, the script records it in <cache>/.registry-unreachable
# (the Unix time, then the reason) and the tests of this run trust that record for ten minutes
# instead of each probing the registry again; a reachable registry removes the record.
#
# Every wait has a deadline and says what it waits for. The lock: while another process holds it
# (a test run installing, another run of this script), one line names the holder (its pid and what
# it does, from <cache>/.install.lock.holder, which the Go tests write too) and the deadline,
# CLODEX_INSTALL_LOCK_TIMEOUT seconds (default 1020: another process's install and its probe); past
# it the script exits 1 saying who still holds the lock and what to do. Each npm install: at most
# CLODEX_INSTALL_TIMEOUT seconds (default 900), announced as it starts; past it the script exits 1
# naming the limit.
#
# Under CI=true (or CLODEX_REQUIRE_CLIENTS=1) the real clients and tmux are required: anything
# missing that cannot be installed exits 1 with one line per problem saying what and how to fix it.
# Otherwise an unreachable registry or a missing tmux is reported and the script exits 0 (the tests
# that need them skip, saying so); any other failure exits 1.
set -euo pipefail

CLAUDE_CODE_VERSION="2.1.332"
CODEX_VERSION="0.171.0"
OPENCODE_VERSION="1.18.33"
NODE_LIBS="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/internal/clienttest/nodelibs"

CACHE="${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}"
MARKER="$CACHE/.registry-unreachable"
LOCK="$CACHE/.install.lock"
HOLDER="$LOCK.holder"

log() { printf 'install-clients: %s\n' "$*" >&2; }

# seconds NAME DEFAULT: the whole number of seconds in $NAME, else DEFAULT; exits 2 on a bad value.
seconds() {
	local v="${!1:-$2}"
	case "$v" in
	'' | *[!0-9]* | 0)
		log "$1=$v is not a positive whole number of seconds; want e.g. $2"
		exit 2
		;;
	esac
	printf '%s' "$v"
}
LOCK_TIMEOUT="$(seconds CLODEX_INSTALL_LOCK_TIMEOUT 1020)"
INSTALL_TIMEOUT="$(seconds CLODEX_INSTALL_TIMEOUT 900)"

# required: the environment requires the real clients (CI, or CLODEX_REQUIRE_CLIENTS=1).
REQUIRED=""
case "${CLODEX_REQUIRE_CLIENTS:-}" in
"" | 0 | false | FALSE | False | f | F) ;;
1 | true | TRUE | True | t | T) REQUIRED="CLODEX_REQUIRE_CLIENTS=$CLODEX_REQUIRE_CLIENTS" ;;
*)
	log "CLODEX_REQUIRE_CLIENTS=$CLODEX_REQUIRE_CLIENTS is not a boolean; want 1 (the real clients are required) or 0"
	exit 2
	;;
esac
if [ -z "$REQUIRED" ] && [ -n "${CI:-}" ]; then
	case "${CI,,}" in
	0 | false | no | off) ;;
	*) REQUIRED="CI=$CI" ;;
	esac
fi
FAILED=0
# missing WHAT FIX: a required dependency is missing; fail at the end under CI, else report it.
missing() {
	if [ -n "$REQUIRED" ]; then
		log "$1; fix: $2 [$REQUIRED: required]"
		FAILED=1
	else
		log "$1; the tests that need it will skip (with CI=true they fail); fix: $2"
	fi
}

if ! command -v npm >/dev/null 2>&1; then
	log "npm not found in PATH; fix: install Node.js 20 with npm"
	exit 1
fi

mkdir -p "$CACHE"
export npm_config_update_notifier=false npm_config_fund=false npm_config_audit=false

# verify BIN VERSION: BIN exists and its --version output contains VERSION.
verify() {
	local bin="$1" want="$2" out scratch rc=0
	[ -x "$bin" ] || return 1
	# A scratch HOME and no inherited settings: the client must not read or
	# write the user's config, nor update itself.
	scratch="$(mktemp -d)"
	out="$(cd "$scratch" && env -i PATH="$PATH" HOME="$scratch" CODEX_HOME="$scratch" TERM=dumb \
		DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
		timeout 60 "$bin" --version </dev/null 2>&1)" || rc=$?
	rm -rf "$scratch"
	[ "$rc" -eq 0 ] || return 1
	case "$out" in
	*"$want"*) return 0 ;;
	*) log "$bin --version printed '$out', want $want"; return 1 ;;
	esac
}

# record_unreachable REASON: write the marker atomically (the Go tests read it).
record_unreachable() {
	local tmp
	tmp="$(mktemp "$MARKER.tmp-XXXXXX")"
	printf '%s\n%s\n' "$(date +%s)" "$(printf '%s' "$1" | tr '\n' ' ' | cut -c1-400)" >"$tmp"
	chmod 644 "$tmp"
	mv -f "$tmp" "$MARKER"
}

# UNREACHABLE is the reason the registry could not be reached in this run ("" = not seen).
UNREACHABLE=""

# registry_unreachable PKG: 0 when `npm view` fails because of the network (UNREACHABLE then says
# why); 1 when the registry answered; exits 1 when it answered with an error.
registry_unreachable() {
	local pkg="$1" out reason rc=0
	if [ -n "$UNREACHABLE" ]; then
		return 0
	fi
	out="$(timeout 60 npm view "$pkg" version 2>&1 </dev/null)" || rc=$?
	if [ "$rc" -eq 0 ]; then
		rm -f "$MARKER"
		return 1
	fi
	if [ "$rc" -eq 124 ]; then
		UNREACHABLE="npm view $pkg: no answer within 60 s"
		record_unreachable "$UNREACHABLE"
		return 0
	fi
	case "$out" in
	*ENOTFOUND* | *EAI_AGAIN* | *ETIMEDOUT* | *ECONNREFUSED* | *ECONNRESET* | *ENETUNREACH* | *EHOSTUNREACH* | *"network"* | *"socket hang up"*)
		# The line naming the failed request and why, e.g. "request to https://registry.npmjs.org/…
		# failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org".
		reason="$(printf '%s\n' "$out" | grep -m 1 -E 'reason:|network request to' || printf '%s\n' "$out" | grep -m 1 .)"
		reason="${reason#npm error }"
		UNREACHABLE="npm view $pkg: ${reason#FetchError: }"
		record_unreachable "$UNREACHABLE"
		return 0
		;;
	esac
	log "npm view $pkg failed (exit $rc): $out"
	exit 1
}

# install NAME PKG VERSION BINNAME TITLE
install_one() {
	local name="$1" pkg="$2" version="$3" binname="$4" title="$5"
	local dir="$CACHE/$name-$version"
	local bin="$dir/node_modules/.bin/$binname"

	if verify "$bin" "$version"; then
		log "$pkg@$version already installed: $bin"
		return 0
	fi
	if registry_unreachable "$pkg@$version"; then
		missing "$title $version (npm $pkg@$version) is not installed in $CACHE and the npm registry is unreachable: $UNREACHABLE" \
			"make the npm registry reachable (npm config get registry), then run scripts/install-clients.sh"
		return 0
	fi

	local tmp start
	tmp="$(mktemp -d "$CACHE/.tmp-$name-$version.XXXXXX")"
	CLEANUP="$tmp"
	start=$SECONDS
	log "installing $pkg@$version into $dir: up to $INSTALL_TIMEOUT s, usually a minute or two"
	local rc=0
	(
		cd "$tmp"
		# What `npm init -y` writes, minus the name it would derive from the folder
		# (a dot-folder name is not a valid package name).
		printf '{"name":"clodex-client-cache","version":"1.0.0","private":true}\n' >package.json
		timeout "$INSTALL_TIMEOUT" npm install --no-audit --no-fund --loglevel=error "$pkg@$version" </dev/null
	) || rc=$?
	if [ "$rc" -eq 124 ]; then
		log "npm install $pkg@$version gave no result within $INSTALL_TIMEOUT s (CLODEX_INSTALL_TIMEOUT); fix: check the registry (npm config get registry) and the network, then rerun scripts/install-clients.sh"
		exit 1
	elif [ "$rc" -ne 0 ]; then
		log "npm install $pkg@$version failed (exit $rc); its output is above"
		exit 1
	fi
	if ! verify "$tmp/node_modules/.bin/$binname" "$version"; then
		log "$pkg@$version installed but its --version check failed"
		exit 1
	fi
	chmod 755 "$tmp"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	CLEANUP=""
	log "installed $pkg@$version in $((SECONDS - start)) s: $bin"
}

# verify_libs DIR: every dependency pinned in DIR/package.json is installed in DIR/node_modules at
# its version.
verify_libs() {
	local dir="$1"
	[ -f "$dir/package.json" ] && [ -d "$dir/node_modules" ] || return 1
	node -e '
		const dir = process.argv[1];
		const deps = require(dir + "/package.json").dependencies;
		for (const [pkg, want] of Object.entries(deps)) {
			let got = "";
			try { got = require(dir + "/node_modules/" + pkg + "/package.json").version; } catch {}
			if (got !== want) { console.error(pkg + ": installed " + (got || "nothing") + ", want " + want); process.exit(1); }
		}' "$dir" 2>/dev/null
}

# install_libs: the client libraries the node scripts of the e2e tests import, installed with
# npm ci from internal/clienttest/nodelibs (without optional platform binaries: the Agent SDK is
# handed the pinned Claude Code).
install_libs() {
	local hash dir tmp start first
	hash="$(sha256sum "$NODE_LIBS/package-lock.json" | cut -c1-12)"
	dir="$CACHE/node-libs-$hash"
	if verify_libs "$dir"; then
		log "the client libraries are already installed: $dir"
		return 0
	fi
	first="$(node -e 'const d=require(process.argv[1]).dependencies; const k=Object.keys(d)[0]; console.log(k+"@"+d[k])' "$NODE_LIBS/package.json")"
	if registry_unreachable "$first"; then
		missing "the client libraries (npm $first and the rest of $NODE_LIBS/package.json) are not installed in $CACHE and the npm registry is unreachable: $UNREACHABLE" \
			"make the npm registry reachable (npm config get registry), then run scripts/install-clients.sh"
		return 0
	fi
	tmp="$(mktemp -d "$CACHE/.tmp-node-libs-$hash.XXXXXX")"
	CLEANUP="$tmp"
	start=$SECONDS
	log "installing the client libraries into $dir: up to $INSTALL_TIMEOUT s, usually a minute or two"
	cp "$NODE_LIBS/package.json" "$NODE_LIBS/package-lock.json" "$tmp/"
	local rc=0
	(cd "$tmp" && timeout "$INSTALL_TIMEOUT" npm ci --omit=optional --no-audit --no-fund --loglevel=error </dev/null) || rc=$?
	if [ "$rc" -eq 124 ]; then
		log "npm ci of the client libraries gave no result within $INSTALL_TIMEOUT s (CLODEX_INSTALL_TIMEOUT); fix: check the registry (npm config get registry) and the network, then rerun scripts/install-clients.sh"
		exit 1
	elif [ "$rc" -ne 0 ]; then
		log "npm ci of the client libraries failed (exit $rc); its output is above"
		exit 1
	fi
	if ! verify_libs "$tmp"; then
		log "the client libraries installed but their version check failed"
		exit 1
	fi
	chmod 755 "$tmp"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	CLEANUP=""
	log "installed the client libraries in $((SECONDS - start)) s: $dir/node_modules"
}

# install_tmux: the interactive Claude Code test (cmd/clodex-dataplane) drives it in tmux.
install_tmux() {
	if command -v tmux >/dev/null 2>&1; then
		return 0
	fi
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
		log "installing tmux with apt-get"
		if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null 2>&1 ||
			{ apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tmux >/dev/null 2>&1; }; then
			log "installed tmux: $(tmux -V)"
			return 0
		fi
		missing "tmux is not installed and apt-get install tmux failed" "install tmux (apt-get install tmux)"
		return 0
	fi
	missing "tmux is not installed (and this is not root with apt-get, so the script cannot install it)" \
		"install tmux with your package manager, e.g. sudo apt-get install tmux"
}

CLEANUP=""
HELD=""
trap 'if [ -n "$CLEANUP" ]; then rm -rf "$CLEANUP"; fi; if [ -n "$HELD" ]; then rm -f "$HOLDER"; fi' EXIT

# holder: who holds the lock, as its holder file says (pid, what, since; written by the Go tests too).
holder() {
	local pid what since
	{ read -r pid && read -r what && read -r since; } <"$HOLDER" 2>/dev/null || true
	case "$pid" in
	'' | *[!0-9]*) printf 'another process (it left no holder file naming itself)' ;;
	*)
		if kill -0 "$pid" 2>/dev/null; then
			printf 'pid %s (%s, since %s)' "$pid" "$what" "$(date -u -d "@${since:-0}" +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo "?")"
		else
			printf 'another process (the holder file names pid %s, %s, which no longer runs)' "$pid" "$what"
		fi
		;;
	esac
}

exec 9>"$LOCK"
if ! flock -n 9; then
	log "waiting up to $LOCK_TIMEOUT s for $LOCK, held by $(holder)"
	waited=$SECONDS
	if ! flock -w "$LOCK_TIMEOUT" 9; then
		log "gave up after $LOCK_TIMEOUT s (CLODEX_INSTALL_LOCK_TIMEOUT) waiting for $LOCK, still held by $(holder); fix: let that process finish, or end it if it hung, then rerun scripts/install-clients.sh"
		exit 1
	fi
	log "took $LOCK after $((SECONDS - waited)) s"
fi
HELD=1
printf '%s\n%s\n%s\n' "$$" "install-clients.sh installing the pinned clients" "$(date +%s)" >"$HOLDER.tmp.$$"
chmod 644 "$HOLDER.tmp.$$"
mv -f "$HOLDER.tmp.$$" "$HOLDER"
# Leftovers of an install that was killed half-way; safe to remove under the lock.
rm -rf "$CACHE"/.tmp-*
# This run starts afresh: the registry is probed again if anything is missing.
rm -f "$MARKER"
install_one claude-code @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude "Claude Code"
install_one codex @openai/codex "$CODEX_VERSION" codex "Codex CLI"
install_one opencode opencode-ai "$OPENCODE_VERSION" opencode "opencode"
install_libs
rm -f "$HOLDER"
HELD=""
exec 9>&-
install_tmux
exit "$FAILED"
