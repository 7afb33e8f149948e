#!/usr/bin/env bash
# title-requests.sh BINDIR [TURNS]: how many requests and upstream sockets an interactive Claude
# Code session costs. It starts BINDIR/clodex-sim and BINDIR/clodex-dataplane (built with
# `go build -o BINDIR ./cmd/clodex-sim ./cmd/clodex-dataplane`) on free loopback ports, runs the
# pinned Claude Code TUI (scripts/install-clients.sh installs it) in a tmux pane from a fresh HOME
# whose ~/.claude.json skips the first-start screens, types TURNS prompts (default 3), one after
# the other answer, then prints the data plane's POST /v1/messages count and the emulator's
# upgrades and responses.
#
# Claude Code asks for a session title (a structured-output request) besides the prompts, and asks
# again on the next turn, on a new upstream socket, while the answer is not the JSON it asked for
# (docs/translation.md §1.3). Compare two builds:
#
#   go build -o /tmp/after ./cmd/clodex-sim ./cmd/clodex-dataplane && scripts/title-requests.sh /tmp/after
#
# It holds the client run lock (<cache>/.run.lock) while Claude Code runs, as the tests do.
set -euo pipefail

BIN="${1:?usage: title-requests.sh BINDIR [TURNS]}"
TURNS="${2:-3}"
CACHE="${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}"
CLAUDE="$CACHE/claude-code-2.1.332/node_modules/.bin/claude"
[ -x "$CLAUDE" ] || { echo "title-requests: $CLAUDE is missing; run scripts/install-clients.sh" >&2; exit 1; }
command -v tmux >/dev/null || { echo "title-requests: tmux is missing (apt-get install tmux)" >&2; exit 1; }

D="$(mktemp -d)"
mkdir -p "$D/home" "$D/work"
PIDS=()
cleanup() {
	tmux -S "$D/tmux.sock" kill-server 2>/dev/null || true
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$D"
}
trap cleanup EXIT

# addr FILE PATTERN: the address a server logged, once it has.
addr() {
	local i
	for i in $(seq 100); do
		if grep -q "$2" "$1" 2>/dev/null; then
			grep -o "$2[0-9.:]*" "$1" | head -1 | sed "s|$2||"
			return 0
		fi
		sleep 0.1
	done
	echo "title-requests: no address in $1:" >&2
	cat "$1" >&2
	exit 1
}

"$BIN/clodex-sim" --listen 127.0.0.1:0 --write-auth "$D/auth.json" >"$D/sim.log" 2>&1 &
PIDS+=($!)
SIM="$(addr "$D/sim.log" 'msg="clodex-sim serving" addr=')"
for i in $(seq 100); do [ -s "$D/auth.json" ] && break; sleep 0.1; done
"$BIN/clodex-dataplane" --listen 127.0.0.1:0 --codex-auth "$D/auth.json" \
	--upstream-url "ws://$SIM/backend-api/codex/responses" >"$D/dp.log" 2>&1 &
PIDS+=($!)
DP="$(addr "$D/dp.log" 'msg=serving addr=')"

KEY="title-requests-key-0123456789"
printf '{"hasCompletedOnboarding":true,"theme":"dark","customApiKeyResponses":{"approved":["%s"],"rejected":[]},"projects":{"%s":{"hasTrustDialogAccepted":true}}}\n' \
	"${KEY: -20}" "$D/work" >"$D/home/.claude.json"

exec 9>"$CACHE/.run.lock"
flock 9
S="$D/tmux.sock"
tmux -S "$S" -f /dev/null new-session -d -s c -x 150 -y 45 -c "$D/work" -- env -i PATH=/usr/bin:/bin \
	HOME="$D/home" TERM=xterm-256color ANTHROPIC_BASE_URL="http://$DP" ANTHROPIC_API_KEY="$KEY" \
	DISABLE_AUTOUPDATER=1 DISABLE_TELEMETRY=1 "$CLAUDE" --model claude-sonnet-4-5

posts() { grep -c 'method=POST path=/v1/messages ' "$D/dp.log" || true; }
for i in $(seq 240); do tmux -S "$S" capture-pane -p -t c | grep -q "for shortcuts" && break; sleep 0.5; done
sleep 2
for turn in $(seq "$TURNS"); do
	before="$(posts)"
	tmux -S "$S" send-keys -t c -l "turn $turn: say hi"
	sleep 1
	tmux -S "$S" send-keys -t c Enter
	for i in $(seq 120); do [ "$(posts)" -gt "$before" ] && break; sleep 0.5; done
	sleep 8 # the title request follows the turn's
done
exec 9>&-

echo "turns: $TURNS"
echo "POST /v1/messages: $(posts) ($(grep 'method=POST path=/v1/messages ' "$D/dp.log" | grep -vc 'status=200' || true) not 200)"
curl -s "http://$SIM/sim/stats" | grep -E '^\s*"(upgrades|responses|continued_responses|completed_responses)":' | tr -d ' ,'
