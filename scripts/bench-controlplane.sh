#!/usr/bin/env bash
# bench-controlplane.sh: Admit against a no-op RPC floor over a real
# loopback listener, side by side.
#
# Builds clodex-controlplane and the load generator (bench/controlplane, a
# separate process), starts the control plane on a free loopback port with
# the no-op BenchService, and runs {noop, admit} x {1, 16, 64 in flight} x
# {1, 10000 accounts}. Both RPCs share the server's authentication,
# interceptors and otelgrpc stats handler; the no-op is the floor.
# New accounts get rate 600/min and burst 1000 so the bucket really runs
# (debits, waits and refusals) without turning every call into a refusal.
# Then it runs the store's in-process Admit microbenchmark.
#
# Each combination runs BENCH_ROUNDS rounds of BENCH_DURATION per RPC, the
# two alternating so load drift on a shared machine hits both alike.
#
# Environment: BENCH_DURATION (default 2s), BENCH_ROUNDS (3), BENCH_INFLIGHT (1,16,64),
# BENCH_ACCOUNTS (1,10000), BENCH_CONNS (1). Whole run: about two minutes.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
DURATION=${BENCH_DURATION:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
INFLIGHT=${BENCH_INFLIGHT:-1,16,64}
ACCOUNTS=${BENCH_ACCOUNTS:-1,10000}
CONNS=${BENCH_CONNS:-1}

work=$(mktemp -d)
server_pid=""
cleanup() {
	if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
		kill -TERM "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

echo "building..." >&2
"$GO" build -trimpath -o "$work/clodex-controlplane" ./cmd/clodex-controlplane
"$GO" build -trimpath -o "$work/controlplane-bench" ./bench/controlplane

umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin.token"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/agent.token"

# A free loopback port: bind :0, read it, release it.
port=$("$GO" run ./bench/controlplane/freeport 2>/dev/null || true)
if [[ -z "$port" ]]; then
	echo "bench-controlplane: could not find a free port" >&2
	exit 1
fi
addr="127.0.0.1:$port"

"$work/clodex-controlplane" --listen "$addr" --data-dir "$work/data" \
	--admin-token-file "$work/admin.token" --agent-token-file "$work/agent.token" \
	--bench-service --default-rate 600 --default-burst 1000 --log-level warn \
	2>"$work/server.log" &
server_pid=$!

echo "control plane on $addr (pid $server_pid); $(nproc) CPUs shared by server and load generator" >&2
if ! "$work/controlplane-bench" --addr "$addr" --token-file "$work/agent.token" \
	--inflight "$INFLIGHT" --accounts "$ACCOUNTS" --duration "$DURATION" --rounds "$ROUNDS" --conns "$CONNS"; then
	echo "bench-controlplane: load generator failed; server log:" >&2
	cat "$work/server.log" >&2
	exit 1
fi

kill -TERM "$server_pid"
wait "$server_pid" || true
server_pid=""

echo
echo "store Admit in process (bucket + shard lock, no RPC):"
"$GO" test -run='^$' -bench='BenchmarkMemoryAdmit' -benchmem ./controlplane/store | grep -E '^Benchmark'
