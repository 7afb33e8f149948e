#!/usr/bin/env bash
# Build every clodex binary, static and reproducible: the one build command
# shared by `make build` and the Dockerfile (deploy/dockerfile_test.go checks
# that both call it).
#
#   scripts/build.sh OUTDIR VERSION
#
# The binaries are static (CGO_ENABLED=0) and carry no path of this machine
# (-trimpath), no build id (-buildid=) and no VCS stamp (-buildvcs=false: the
# image build has no .git), so the same source, VERSION and Go toolchain give
# the same bytes anywhere. Each binary prints VERSION with --version.
set -euo pipefail
if [ $# -ne 2 ] || [ -z "$1" ] || [ -z "$2" ]; then
	echo "usage: scripts/build.sh OUTDIR VERSION" >&2
	exit 2
fi
out=$1
version=$2
cd "$(dirname "$0")/.."

: "${GO:=go}"
export CGO_ENABLED=0
mkdir -p "$out"
for b in clodex-dataplane clodex-controlplane clodexctl clodex-sim; do
	"$GO" build -trimpath -buildvcs=false \
		-ldflags "-s -w -buildid= -X main.version=$version" \
		-o "$out/$b" "./cmd/$b"
done
