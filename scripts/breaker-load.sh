#!/usr/bin/env bash
# breaker-load.sh: the Redis breaker on a busy host (issue 21). Two
# control-plane replicas over a healthy redis-server and two data planes
# admit one account under load for DURATION (default 15m) while BURNERS
# CPU burners (default 3 x the CPUs: `yes > /dev/null`) keep the load
# average at 4 or more. Prints the breaker openings (want 0), the Redis
# calls past 100 ms and the load average (TestRedisBreakerUnderLoad).
#   ./scripts/breaker-load.sh [DURATION] [BURNERS]
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
duration=${1:-15m}
burners=${2:-$((3 * $(nproc)))}

pids=()
stop() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap stop EXIT
"$GO" test -c -o /tmp/control.test.$$ ./dataplane/control/ >&2
for _ in $(seq "$burners"); do
	yes > /dev/null &
	pids+=($!)
done
echo "$burners burners; load average now: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
CLODEX_BREAKER_RUN=$duration /tmp/control.test.$$ -test.count=1 -test.v -test.timeout=$((${duration%m} + 10))m \
	-test.run '^TestRedisBreakerUnderLoad$' | grep -v '^=== RUN'
rm -f /tmp/control.test.$$
