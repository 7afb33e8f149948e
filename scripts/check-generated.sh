#!/usr/bin/env bash
# check-generated.sh: fail when the committed generated protobuf/gRPC code
# (proto/gen/go) differs from what the .proto files produce with the pinned
# buf and plugins (tools/go.mod), and run buf lint.
#
# It regenerates into a temporary directory and never touches the tree.
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
BUF=("$GO" tool -modfile=tools/go.mod buf)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! "${BUF[@]}" lint; then
	echo "check-generated: buf lint failed (see above)" >&2
	exit 1
fi

if ! "${BUF[@]}" generate -o "$tmp" >"$tmp.log" 2>&1; then
	cat "$tmp.log" >&2
	rm -f "$tmp.log"
	echo "check-generated: buf generate failed" >&2
	exit 1
fi
rm -f "$tmp.log"

if [[ ! -d proto/gen/go ]]; then
	echo "check-generated: proto/gen/go is missing; run: make generate" >&2
	exit 1
fi
if ! diff -ru proto/gen/go "$tmp/proto/gen/go" >"$tmp/diff"; then
	echo "check-generated: proto/gen/go is stale: it differs from what proto/*.proto produce." >&2
	echo "Run 'make generate' (go tool -modfile=tools/go.mod buf generate) and commit the result. Differences:" >&2
	head -n 60 "$tmp/diff" >&2
	exit 1
fi
echo "check-generated: proto/gen/go is up to date; buf lint ok"
