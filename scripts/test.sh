#!/usr/bin/env bash
# The whole test suite: what `make test` and CI run.
#
#   1. generated protobuf/gRPC code matches the .proto sources (and buf lint passes)
#   2. the static checks are clean: gofmt, go vet, golangci-lint, govulncheck (scripts/lint.sh)
#   3. the pinned real clients (Claude Code, Codex CLI) are installed into a cache outside the repo,
#      and tmux; under CI=true anything missing fails here, otherwise the tests that need it skip
#      and a note at the end says so
#   4. redis-server is installed (the Redis store's tests start their own on a free loopback port), and
#      chromium (the web console's browser test drives it headless)
#   5. every package's tests, with the race detector
#   6. each fuzz target of a listener's input runs for a short, fixed time (CLODEX_FUZZTIME, default
#      10s each); a finding fails the suite and leaves its input in the package's testdata/fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's Go release (see the Makefile): fetched from the module proxy once.
export GOTOOLCHAIN=${GOTOOLCHAIN:-$(sed -n 's/^toolchain //p' go.mod)} # the project's Go release: go.mod's toolchain line

step() { printf '\n==> %s\n' "$*"; }

step "generated code is current"
./scripts/check-generated.sh

step "static checks: gofmt, go vet, golangci-lint, govulncheck"
./scripts/lint.sh

step "real clients (pinned Claude Code and Codex CLI, cached outside the repo)"
./scripts/install-clients.sh

step "redis-server (the Redis store's tests start their own)"
if ! command -v redis-server >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
	fi
	if ! command -v redis-server >/dev/null; then
		echo "redis-server is not installed (apt-get install redis-server); the Redis tests fail under CI=true and skip otherwise"
		if [ "${CI:-}" = true ]; then exit 1; fi
	fi
fi
redis-server --version 2>/dev/null || true

step "chromium (the web console's browser test drives it headless)"
if ! command -v chromium >/dev/null; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
	fi
	if ! command -v chromium >/dev/null; then
		echo "chromium is not installed (apt-get install chromium); the console's browser test fails under CI=true and skips otherwise"
		if [ "${CI:-}" = true ]; then exit 1; fi
	fi
fi
chromium --version 2>/dev/null || true

step "go test -race"
# -p 2: this runs on 2 cores; packages that drive real clients serialise themselves.
status=0
go test -race -count=1 -p 2 -timeout 30m ./... || status=$?

step "fuzz the listeners' inputs (${CLODEX_FUZZTIME:-10s} each)"
# fuzz_one PKG NAME fuzzes one target. Go 1.26's fuzzing coordinator can
# fail a run at the -fuzztime boundary with a bare "context deadline
# exceeded" and no input (golang/go#75804, fixed in Go 1.27): such a run,
# one that wrote no failing input, is run once more. A finding always
# writes its input and fails at once.
fuzz_one() {
	local out rc
	out=$(mktemp)
	go test -run '^$' -fuzz "^${2}\$" -fuzztime "${CLODEX_FUZZTIME:-10s}" "$1" 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	if [[ $rc -ne 0 ]] && grep -q '^    context deadline exceeded$' "$out" && ! grep -q 'Failing input written' "$out"; then
		echo "fuzzing $2 in $1 ended at the -fuzztime boundary with no failing input (golang/go#75804); running it once more"
		go test -run '^$' -fuzz "^${2}\$" -fuzztime "${CLODEX_FUZZTIME:-10s}" "$1"
		rc=$?
	fi
	rm -f "$out"
	return "$rc"
}
# One target per invocation (go test -fuzz takes one target of one package).
# What each reads: the data plane's HTTP body decoder (translate, and the
# whole handler with its encodings), the control plane's gRPC requests
# (every validator behind the real listener), policy.json, auth.json, and
# the emulator's WebSocket frames.
for target in \
	./dataplane/translate:FuzzDecodeRequest \
	./dataplane/gateway:FuzzMessages \
	./controlplane:FuzzRPCRequests \
	./controlplane/store:FuzzLoadPolicyFile \
	./internal/codexauth:FuzzParseAuthFile \
	./internal/codexsim:FuzzDecodeFrame; do
	pkg=${target%%:*} name=${target##*:}
	if ! fuzz_one "$pkg" "$name"; then
		echo "fuzzing $name in $pkg found a failure; the input is in $pkg/testdata/fuzz/$name"
		status=1
	fi
done

# A passing run whose real-client tests skipped must not look like a full pass.
marker="${CLODEX_CLIENT_CACHE:-$HOME/.cache/clodex/clients}/.registry-unreachable"
if [ -f "$marker" ]; then
	printf '\nNOTE: the real-client tests (Claude Code, Codex CLI) were skipped: %s\n' "$(sed -n 2p "$marker")"
	printf 'NOTE: make the npm registry reachable and run scripts/install-clients.sh; with CI=true this fails.\n'
fi
exit "$status"
