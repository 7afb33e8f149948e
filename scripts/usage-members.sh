#!/usr/bin/env bash
# usage-members.sh: three members on two data planes, and the usage ledger
# beside what the backend counted.
#
# Builds the binaries into a temp dir, starts clodex-sim, one control plane
# (memory store), three members (clodexctl member create) and two data
# planes serving member keys (--member-keys, usage sent every second),
# sends turns with each member's key (alice 5 on the first data plane, bob
# 3 on each, carol 7 on the second), then prints `clodexctl usage --by
# member` and `--by member,agent` and clodex-sim's /sim/stats totals: the
# ledger's turns, tokens and new sockets are the backend's responses,
# tokens and upgrades. Ports are free ones on 127.0.0.1; nothing is kept.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
"$GO" build -o "$work/bin/" ./cmd/clodex-sim ./cmd/clodex-controlplane ./cmd/clodex-dataplane ./cmd/clodexctl
export PATH="$work/bin:$PATH"
cd "$work"
free() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
SIM=$(free) CP=$(free) DP1=$(free) DP2=$(free)
mkdir -p data etc
head -c 32 /dev/urandom | base64 >etc/admin.token
head -c 32 /dev/urandom | base64 >etc/agent.token
chmod 600 etc/*
clodex-sim --listen 127.0.0.1:$SIM --write-auth etc/auth.json >sim.log 2>&1 &
clodex-controlplane --listen 127.0.0.1:$CP --data-dir data --admin-token-file etc/admin.token --agent-token-file etc/agent.token >cp.log 2>&1 &
ctl() { clodexctl --control-plane 127.0.0.1:$CP --token-file etc/admin.token "$@"; }
ctl health --wait 10s >/dev/null
for i in $(seq 50); do [ -s etc/auth.json ] && break; sleep 0.1; done
for m in alice bob carol; do ctl member create $m --out $m.key >/dev/null; done
for p in $DP1 $DP2; do
	clodex-dataplane --listen 127.0.0.1:$p --control-plane 127.0.0.1:$CP --agent-token-file etc/agent.token --codex-auth etc/auth.json \
		--upstream-url ws://127.0.0.1:$SIM/backend-api/codex/responses --token-endpoint http://127.0.0.1:$SIM/oauth/token \
		--member-keys --usage-flush 1s >dp-$p.log 2>&1 &
done
for p in $DP1 $DP2; do ctl health --wait 20s http://127.0.0.1:$p/readyz >/dev/null; done
sleep 1 # the member list reaches both data planes
turn() { # MEMBER PORT N
	local body='{"model":"claude-sonnet-4-5","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Say hello, '"$1 $3"'"}]}'
	code=$(curl -sS -o /dev/null -w '%{http_code}' -H "x-api-key: $(cat "$1.key")" -H 'content-type: application/json' \
		-H 'anthropic-version: 2023-06-01' --data "$body" http://127.0.0.1:$2/v1/messages)
	[ "$code" = 200 ] || { echo "turn of $1 on :$2 answered $code" >&2; exit 1; }
}
for i in $(seq 5); do turn alice $DP1 "$i"; done
for i in $(seq 3); do turn bob $DP1 "$i"; turn bob $DP2 "$i"; done
for i in $(seq 7); do turn carol $DP2 "$i"; done
sleep 3 # every data plane sent its usage (--usage-flush 1s) and was acknowledged
ctl usage --by member
echo
ctl usage --by member,agent
echo
echo "clodex-sim counted:"
curl -s http://127.0.0.1:$SIM/sim/stats | python3 -c 'import json,sys; d=json.load(sys.stdin); print("  responses", d["completed_responses"], " upgrades", d["upgrades"], " input", d["input_tokens"], " cached", d["cached_tokens"], " output", d["output_tokens"])'
