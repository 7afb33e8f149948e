#!/usr/bin/env bash
# The whole test suite: what `make test` and CI run.
#
#   1. generated protobuf/gRPC code matches the .proto sources (and buf lint passes)
#   2. gofmt and go vet are clean
#   3. the pinned real clients (Claude Code, Codex CLI) are installed into a cache outside the repo
#   4. every package's tests, with the race detector
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "generated code is current"
./scripts/check-generated.sh

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change these files:"; echo "$unformatted"; exit 1
fi

step "go vet"
go vet ./...

step "real clients (pinned Claude Code and Codex CLI, cached outside the repo)"
./scripts/install-clients.sh

step "go test -race"
# -p 2: this runs on 2 cores; packages that drive real clients serialise themselves.
go test -race -count=1 -p 2 -timeout 30m ./...
