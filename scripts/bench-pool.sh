#!/usr/bin/env bash
# bench-pool.sh: memory per idle pooled conversation with REAL sockets.
# Builds clodex-sim and bench/pool into a temp dir, starts the emulator on
# a free loopback port in its own process, and runs the benchmark against
# it: N idle pooled conversations (Claude Code 2.1.332 shape, translated
# with dataplane/translate, one coder/websocket socket each), RSS growth
# and heap after runtime.GC() per conversation; then the upstream bytes of
# a 30-turn conversation vs full resend and the new sockets per 100 turns
# of a 20-subagent fan-out. Extra arguments go to the benchmark, e.g.
#   ./scripts/bench-pool.sh --runs one-message:1000:1,cc:1000:20 --timeout 10m
# (./scripts/bench-pool.sh --help lists them). 10,000 sockets need 10,000
# descriptors in each process: the script raises the soft limit to the
# hard one and refuses to run below 10,200.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}

ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt 10200 ]; then
	echo "bench-pool: ulimit -n is $(ulimit -n); 10,000 pooled sockets need about 10,200 descriptors per process (raise the hard limit)" >&2
	exit 2
fi

work=$(mktemp -d)
sim_pid=
cleanup() {
	if [ -n "$sim_pid" ]; then
		kill "$sim_pid" 2>/dev/null || true
		wait "$sim_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building..." >&2
"$GO" build -trimpath -o "$work/clodex-sim" ./cmd/clodex-sim
"$GO" build -trimpath -o "$work/poolbench" ./bench/pool

"$work/clodex-sim" --listen 127.0.0.1:0 --accept-token tok=acct-bench --upgrade-limit 1000000 \
	--log-level warn >"$work/sim.out" 2>"$work/sim.err" &
sim_pid=$!

url=
for _ in $(seq 100); do
	url=$(grep -o 'ws://[^[:space:]]*' "$work/sim.out" | head -n1 || true)
	[ -n "$url" ] && break
	if ! kill -0 "$sim_pid" 2>/dev/null; then
		echo "bench-pool: clodex-sim exited:" >&2
		cat "$work/sim.err" >&2
		exit 1
	fi
	sleep 0.1
done
if [ -z "$url" ]; then
	echo "bench-pool: clodex-sim printed no URL within 10 s" >&2
	exit 1
fi
echo "clodex-sim (pid $sim_pid) at $url" >&2

"$work/poolbench" --url "$url" --token tok --account acct-bench "$@"
