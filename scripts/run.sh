#!/usr/bin/env bash
# make run: start clodex on this machine: one command, with its control plane embedded.
#
# With Codex credentials (${CODEX_HOME:-~/.codex}/auth.json) the data plane talks to the real backend and
# refreshes that file itself (--refresh=auto). Without them it starts clodex-sim, the backend emulator,
# writes credentials the emulator issued into a private folder, and points the data plane at it, so clodex
# can be tried with no account at all. Either way the data plane prints the one line that points Claude
# Code at it:  export ANTHROPIC_BASE_URL=http://127.0.0.1:17645
#
# Environment: CLODEX_LISTEN (default 127.0.0.1:17645), CLODEX_SIM_LISTEN (default 127.0.0.1:17800), and
# every variable clodex-dataplane reads (CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN, ...). Extra arguments go to
# clodex-dataplane, e.g. ./scripts/run.sh --log-level debug, or
# ./scripts/run.sh --control-plane HOST:17700 --agent-token-file FILE to join a fleet.
set -euo pipefail
cd "$(dirname "$0")/.."

make --no-print-directory build >/dev/null

listen=${CLODEX_LISTEN:-127.0.0.1:17645}
auth="${CODEX_HOME:-$HOME/.codex}/auth.json"

if [ -f "$auth" ]; then
	echo "clodex: using Codex credentials from $auth"
	exec bin/clodex-dataplane --listen "$listen" --codex-auth "$auth" "$@"
fi

state="${XDG_STATE_HOME:-$HOME/.local/state}/clodex/sim"
mkdir -p "$state" && chmod 700 "$state"
rm -f "$state/auth.json" # never mistake a previous run's credentials for this emulator's
sim_listen=${CLODEX_SIM_LISTEN:-127.0.0.1:17800}
echo "clodex: no Codex credentials at $auth; starting clodex-sim (the backend emulator) on $sim_listen"
bin/clodex-sim --listen "$sim_listen" --write-auth "$state/auth.json" >"$state/sim.log" 2>&1 &
sim=$!
dp=
stop() {
	[ -n "$dp" ] && kill -TERM "$dp" 2>/dev/null
	return 0
}
cleanup() {
	kill "$sim" 2>/dev/null || true
	wait "$sim" 2>/dev/null || true
}
trap stop INT TERM
trap cleanup EXIT

for _ in $(seq 100); do
	[ -s "$state/auth.json" ] && (echo >"/dev/tcp/${sim_listen%:*}/${sim_listen##*:}") 2>/dev/null && break
	if ! kill -0 "$sim" 2>/dev/null; then echo "clodex-sim did not start:"; cat "$state/sim.log"; exit 1; fi
	sleep 0.1
done
if [ ! -s "$state/auth.json" ]; then echo "clodex-sim did not write $state/auth.json in 10 s:"; cat "$state/sim.log"; exit 1; fi

# In the background so a signal reaches the trap at once; stop() forwards it and the data plane shuts
# down gracefully (in-flight turns finish, at most 30 s) before the emulator is stopped.
bin/clodex-dataplane --listen "$listen" --codex-auth "$state/auth.json" \
	--upstream-url "ws://$sim_listen/backend-api/codex/responses" \
	--token-endpoint "http://$sim_listen/oauth/token" "$@" &
dp=$!
status=0
wait "$dp" || status=$?
while kill -0 "$dp" 2>/dev/null; do # a trapped signal interrupted wait: wait for the shutdown
	status=0
	wait "$dp" || status=$?
done
exit "$status"
