#!/usr/bin/env bash
# bench-controlplane.sh: Admit on the memory store and on the Redis store
# against a no-op RPC floor over real loopback listeners, side by side.
#
# Builds clodex-controlplane and the load generator (bench/controlplane, a
# separate process), starts redis-server on a free loopback port, starts
# two control planes with the no-op BenchService (one on the memory store,
# one with --redis), and runs {noop, admit, redis} x {1, 16, 64 in flight}
# x {1, 10000 accounts}. All RPCs share the server's authentication,
# interceptors and otelgrpc stats handler; the no-op is the floor. For
# each Redis round it also reads redis-server's CPU time (/proc/PID/stat)
# and the admit script's time (INFO commandstats, cmdstat_evalsha), and
# prints both per Admit. The targets: the script at most 8 µs of
# redis-server time a call; at 64 in flight the Redis store at least 80 %
# of the floor (10,000 accounts and one hot key), the memory store at
# least 90 %, and the Redis store's p99 at most 2x the memory store's.
# New accounts get rate 600/min and burst 1000 so the bucket really runs
# (debits, waits and refusals) without turning every call into a refusal.
# Then it runs the stores' in-process Admit microbenchmarks.
#
# Each combination runs BENCH_ROUNDS rounds of BENCH_DURATION per RPC, the
# two alternating so load drift on a shared machine hits both alike.
#
# Environment: BENCH_DURATION (default 2s), BENCH_ROUNDS (3), BENCH_INFLIGHT (1,16,64),
# BENCH_ACCOUNTS (1,10000), BENCH_CONNS (1), BENCH_MEMORY_LIMIT (460MiB; off: Go's GC defaults), BENCH_MODES (noop,admit,redis;
# without redis-server the redis mode is left out with a notice),
# BENCH_PROFILE (a directory: both control planes serve --pprof and a CPU
# profile of each is taken over the first BENCH_PROFILE_SECONDS (10) of the
# load into memory.cpu.pprof and redis.cpu.pprof, the load generator's
# into client.cpu.pprof; run with one BENCH_MODES to profile that mode).
# At the end the CPU seconds each process used are printed.
# Whole run: about three minutes on 2 CPUs.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
DURATION=${BENCH_DURATION:-2s}
ROUNDS=${BENCH_ROUNDS:-3}
INFLIGHT=${BENCH_INFLIGHT:-1,16,64}
ACCOUNTS=${BENCH_ACCOUNTS:-1,10000}
CONNS=${BENCH_CONNS:-1}
MODES=${BENCH_MODES:-noop,admit,redis}
PROFILE=${BENCH_PROFILE:-}
PROFILE_SECONDS=${BENCH_PROFILE_SECONDS:-10}

work=$(mktemp -d)
server_pid=""
redis_server_pid=""
redis_pid=""
stop() {
	if [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; then
		kill -TERM "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
	fi
}
cleanup() {
	stop "$server_pid"
	stop "$redis_server_pid"
	stop "$redis_pid"
	rm -rf "$work"
}
trap cleanup EXIT

echo "building..." >&2
"$GO" build -trimpath -o "$work/clodex-controlplane" ./cmd/clodex-controlplane
"$GO" build -trimpath -o "$work/controlplane-bench" ./bench/controlplane

umask 077
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/admin.token"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/agent.token"

# Both control planes run under the soft memory limit the deploy files give
# them (0.9 of the pods' 512 MiB; the process takes it from the cgroup):
# under a limit the control plane runs at GOGC=400, without one at Go's 100
# (cmd/clodex-controlplane/memory.go), and a machine without a cgroup limit
# would otherwise measure a configuration no deployment runs.
MEMORY_LIMIT=${BENCH_MEMORY_LIMIT:-460MiB}

# A free loopback port: bind :0, read it, release it.
"$GO" build -trimpath -o "$work/freeport" ./bench/controlplane/freeport
freeport() {
	local p
	p=$("$work/freeport" 2>/dev/null || true)
	if [[ -z "$p" ]]; then
		echo "bench-controlplane: could not find a free port" >&2
		exit 1
	fi
	echo "$p"
}
addr="127.0.0.1:$(freeport)"

# With BENCH_PROFILE, each control plane serves pprof on a loopback port.
pprof_args() {
	if [[ -n "$PROFILE" ]]; then
		local p
		p="127.0.0.1:$(freeport)"
		echo "$1=$p" >>"$work/pprof.addrs"
		echo "--admin-listen $p --pprof"
	fi
}
client_profile=()
if [[ -n "$PROFILE" ]]; then
	mkdir -p "$PROFILE"
	client_profile=(--cpuprofile "$PROFILE/client.cpu.pprof")
fi

# The flags are computed before the server starts in the background: a
# command substitution on a backgrounded command runs in that background
# job, and would record the pprof address only after it is read below.
memory_pprof=$(pprof_args memory)
# shellcheck disable=SC2086 # memory_pprof is empty or whole flags
"$work/clodex-controlplane" --listen "$addr" --data-dir "$work/data" $memory_pprof \
	--admin-token-file "$work/admin.token" --agent-token-file "$work/agent.token" \
	--bench-service --max-agent-accounts 100000 --default-rate 600 --default-burst 1000 --log-level warn \
	--memory-limit "$MEMORY_LIMIT" 2>"$work/server.log" &
server_pid=$!

echo "control plane (memory store) on $addr (pid $server_pid)" >&2

redis_args=()
if [[ ",$MODES," == *",redis,"* ]]; then
	if ! command -v redis-server >/dev/null; then
		echo "bench-controlplane: redis-server is not installed; leaving out the Redis column (apt-get install redis-server)" >&2
		MODES=$(echo ",$MODES," | sed 's/,redis,/,/; s/^,//; s/,$//')
	else
		redis_addr="127.0.0.1:$(freeport)"
		redis-server --port "${redis_addr##*:}" --bind 127.0.0.1 --save '' --appendonly no \
			--dir "$work" --logfile "$work/redis.log" &
		redis_pid=$!
		for _ in $(seq 1 200); do
			redis-cli -h 127.0.0.1 -p "${redis_addr##*:}" ping >/dev/null 2>&1 && break
			sleep 0.05
		done
		raddr="127.0.0.1:$(freeport)"
		redis_pprof=$(pprof_args redis)
		# shellcheck disable=SC2086 # redis_pprof is empty or whole flags
		CLODEX_REDIS_URL="redis://$redis_addr" "$work/clodex-controlplane" --listen "$raddr" $redis_pprof \
			--admin-token-file "$work/admin.token" --agent-token-file "$work/agent.token" \
			--bench-service --max-agent-accounts 100000 --default-rate 600 --default-burst 1000 --log-level warn \
			--memory-limit "$MEMORY_LIMIT" 2>"$work/redis-server.log" &
		redis_server_pid=$!
		redis_args=(--redis-addr "$raddr" --redis-server "$redis_addr" --redis-pid "$redis_pid" --clk-tck "$(getconf CLK_TCK)")
		echo "control plane (Redis store, redis-server $(redis-server --version | awk '{print $3}') on $redis_addr) on $raddr (pid $redis_server_pid)" >&2
	fi
fi

# cpu_seconds PID: user+system CPU seconds the process used so far.
cpu_seconds() {
	awk -v hz="$(getconf CLK_TCK)" '{ sub(/^.*\) /, ""); printf "%.1f", ($12 + $13) / hz }' "/proc/$1/stat" 2>/dev/null || echo "?"
}

profile_pids=()
if [[ -n "$PROFILE" ]]; then
	while IFS='=' read -r name paddr; do
		curl -sf -o "$PROFILE/$name.cpu.pprof" "http://$paddr/debug/pprof/profile?seconds=$PROFILE_SECONDS" &
		profile_pids+=($!)
	done <"$work/pprof.addrs"
fi

echo "$(nproc) CPUs shared by the servers, redis-server and the load generator" >&2
if ! "$work/controlplane-bench" --addr "$addr" --token-file "$work/agent.token" "${redis_args[@]}" --modes "$MODES" \
	--inflight "$INFLIGHT" --accounts "$ACCOUNTS" --duration "$DURATION" --rounds "$ROUNDS" --conns "$CONNS" \
	"${client_profile[@]}"; then
	echo "bench-controlplane: load generator failed; server logs:" >&2
	cat "$work/server.log" >&2
	[[ -f "$work/redis-server.log" ]] && cat "$work/redis-server.log" >&2
	exit 1
fi

echo
echo "CPU seconds used: control plane (memory store) $(cpu_seconds "$server_pid")" \
	"${redis_server_pid:+, control plane (Redis store) $(cpu_seconds "$redis_server_pid"), redis-server $(cpu_seconds "$redis_pid")}"
for p in "${profile_pids[@]}"; do
	wait "$p" || echo "bench-controlplane: a CPU profile failed (the run may be shorter than BENCH_PROFILE_SECONDS)" >&2
done
stop "$server_pid"
server_pid=""
stop "$redis_server_pid"
redis_server_pid=""
[[ -n "$PROFILE" ]] && echo "profiles in $PROFILE (go tool pprof -top FILE)"

echo
echo "store Admit in process (bucket + shard lock, no RPC):"
"$GO" test -run='^$' -bench='BenchmarkMemoryAdmit' -benchmem ./controlplane/store | grep -E '^Benchmark'
if [[ ",$MODES," == *",redis,"* ]]; then
	echo "Redis store Admit in process against a real redis-server (allocs/op: the store's, client side):"
	"$GO" test -run='^$' -bench='BenchmarkRedisAdmit' -benchtime=2s -benchmem ./controlplane/store/redisstore | grep -E '^Benchmark'
fi
