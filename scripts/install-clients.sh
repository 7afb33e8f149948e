#!/usr/bin/env bash
# install-clients.sh installs the pinned real clients that clodex's tests drive
# (Claude Code and Codex CLI) into a cache folder outside the repository:
#
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/claude-code-<version>/node_modules/.bin/claude
#   ${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/codex-<version>/node_modules/.bin/codex
#
# The layout, the lock file and the versions are the same as in internal/clienttest,
# so this script and the Go tests can run at the same time. An install is idempotent:
# a client whose `--version` already shows the pinned version is left alone. A new
# install goes into a temporary folder that is renamed into place only after its
# `--version` check passed, under an exclusive flock on <cache>/.install.lock.
#
# Exits 0 with a message when the npm registry cannot be reached (the tests then
# skip); any other failure exits non-zero.
set -euo pipefail

CLAUDE_CODE_VERSION="2.1.332"
CODEX_VERSION="0.171.0"

CACHE="${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}"

log() { printf 'install-clients: %s\n' "$*" >&2; }

if ! command -v npm >/dev/null 2>&1; then
	log "npm not found in PATH; install Node.js and npm"
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

# registry_unreachable PKG: 0 when `npm view` fails because of the network.
registry_unreachable() {
	local pkg="$1" out rc=0
	out="$(timeout 60 npm view "$pkg" version 2>&1 </dev/null)" || rc=$?
	if [ "$rc" -eq 0 ]; then
		return 1
	fi
	if [ "$rc" -eq 124 ]; then
		return 0
	fi
	case "$out" in
	*ENOTFOUND* | *EAI_AGAIN* | *ETIMEDOUT* | *ECONNREFUSED* | *ECONNRESET* | *ENETUNREACH* | *EHOSTUNREACH* | *"network"* | *"socket hang up"*)
		return 0
		;;
	esac
	log "npm view $pkg failed (exit $rc): $out"
	return 1
}

# install NAME PKG VERSION BINNAME
install_one() {
	local name="$1" pkg="$2" version="$3" binname="$4"
	local dir="$CACHE/$name-$version"
	local bin="$dir/node_modules/.bin/$binname"

	if verify "$bin" "$version"; then
		log "$pkg@$version already installed: $bin"
		return 0
	fi
	if registry_unreachable "$pkg@$version"; then
		log "npm registry unreachable; skipping $pkg@$version (tests that need it will skip)"
		return 0
	fi

	local tmp start
	tmp="$(mktemp -d "$CACHE/.tmp-$name-$version.XXXXXX")"
	CLEANUP="$tmp"
	start=$SECONDS
	log "installing $pkg@$version into $dir"
	(
		cd "$tmp"
		# What `npm init -y` writes, minus the name it would derive from the folder
		# (a dot-folder name is not a valid package name).
		printf '{"name":"clodex-client-cache","version":"1.0.0","private":true}\n' >package.json
		npm install --no-audit --no-fund --loglevel=error "$pkg@$version" </dev/null
	)
	if ! verify "$tmp/node_modules/.bin/$binname" "$version"; then
		log "$pkg@$version installed but its --version check failed"
		return 1
	fi
	rm -rf "$dir"
	mv "$tmp" "$dir"
	CLEANUP=""
	log "installed $pkg@$version in $((SECONDS - start)) s: $bin"
}

CLEANUP=""
trap 'if [ -n "$CLEANUP" ]; then rm -rf "$CLEANUP"; fi' EXIT

exec 9>"$CACHE/.install.lock"
flock 9
# Leftovers of an install that was killed half-way; safe to remove under the lock.
rm -rf "$CACHE"/.tmp-*
install_one claude-code @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
install_one codex @openai/codex "$CODEX_VERSION" codex
