#!/usr/bin/env bash
# bench-fleet.sh: the fleet benchmark (make bench-fleet). Real processes on
# loopback: clodex-sim throttling upgrades above 30 per 10 s, 3 data planes
# with 20 concurrent agents each opening new conversations on one account,
# in five configurations side by side:
#   central        one clodex-controlplane owns the account's bucket (120/min, burst 5)
#   per-host       no control plane; every host paces itself at the full 120/min
#   central-kill   central, control plane SIGKILLed 20 s into the run for 20 s
#   replicas-kill  two replicas over one redis-server, one SIGKILLed 20 s in for good
#   replicas-2x2   two replicas x two data planes on a hot account (30/min, burst 5):
#                  the most upgrades in any 60 s window against rate x time + burst
#   central-adaptive-off  central with the learned throttle off (throughput to compare)
#   learned-1/-3   30 new conversations at once through 1 or 3 data planes, default
#                  settings, clodex-sim at 20 upgrades per 60 s: the learned throttle
#                  (learned-off-1/-3: the same with clodexctl set-adaptive ACCOUNT off)
# Each configuration runs about a minute of load plus a bounded drain; the
# whole run is bounded by --timeout (default 20m). The replicas need redis-server. Extra arguments go to
# the benchmark, e.g. ./scripts/bench-fleet.sh --configs central,per-host --duration 30s
# (./scripts/bench-fleet.sh --help lists them).
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "building..." >&2
"$MAKE" --no-print-directory build >&2
"$GO" build -trimpath -o "$work/bench-fleet" ./bench/fleet

# The benchmark owns its children: each runs in its own process group that
# the benchmark kills on exit, Ctrl-C and its hard timeout included.
"$work/bench-fleet" --bin bin "$@"
