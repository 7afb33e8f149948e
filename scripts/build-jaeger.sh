#!/usr/bin/env bash
# Build the demo's Jaeger, pinned in tools/jaeger/go.mod, into the cache
# outside the repository (once: it takes about ten minutes of two cores).
#
#   scripts/build-jaeger.sh        # prints the binary's path
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(awk '$1 == "github.com/jaegertracing/jaeger" {print $2}' tools/jaeger/go.mod)
if [ -z "$version" ]; then
	echo "build-jaeger: tools/jaeger/go.mod does not pin github.com/jaegertracing/jaeger" >&2
	exit 1
fi
out="${CLODEX_CACHE:-$HOME/.cache/clodex}/jaeger/jaeger-$version"
if [ ! -x "$out" ]; then
	echo "build-jaeger: building Jaeger $version into $out (about ten minutes the first time)" >&2
	mkdir -p "$(dirname "$out")"
	(cd tools/jaeger && go build -trimpath -o "$out.tmp" github.com/jaegertracing/jaeger/cmd/jaeger)
	mv "$out.tmp" "$out"
fi
echo "$out"
