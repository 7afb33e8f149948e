#!/usr/bin/env bash
# lint.sh: the static checks of `make lint` and `make test`.
#
#   1. gofmt and go vet
#   2. golangci-lint (pinned in tools/go.mod, configured by .golangci.yml)
#   3. govulncheck against a vulnerability database built offline from the
#      pinned golang.org/x/vulndb module (the machines that run this reach the
#      Go module proxy, not vuln.go.dev). The database is built once per
#      vulndb version into $CLODEX_VULNDB_CACHE (default
#      ~/.cache/clodex/vulndb/<version>), outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN=${GOTOOLCHAIN:-$(sed -n 's/^toolchain //p' go.mod)} # the project's Go release: go.mod's toolchain line
GO=${GO:-go}
TOOL=("$GO" tool -modfile=tools/go.mod)

step() { printf 'lint: %s\n' "$*"; }

step "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [[ -n "$unformatted" ]]; then
	echo "gofmt would change these files (run: make fmt):"; echo "$unformatted"; exit 1
fi

step "go vet"
"$GO" vet ./...

step "golangci-lint"
"${TOOL[@]}" golangci-lint run ./...

step "govulncheck"
vulndb_version=$("$GO" list -modfile=tools/go.mod -m -f '{{.Version}}' golang.org/x/vulndb)
db=${CLODEX_VULNDB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clodex/vulndb}/$vulndb_version
if [[ ! -f "$db/index/db.json" ]]; then
	src=$("$GO" mod download -modfile=tools/go.mod -json golang.org/x/vulndb | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	if [[ -z "$src" || ! -d "$src/data/osv" ]]; then
		echo "lint: golang.org/x/vulndb@$vulndb_version has no data/osv folder (download: ${src:-failed})" >&2
		exit 1
	fi
	step "building the vulnerability database from golang.org/x/vulndb@$vulndb_version into $db (once)"
	tmp=$(mktemp -d "${db%/*}.tmp.XXXXXX" 2>/dev/null || { mkdir -p "${db%/*}"; mktemp -d "${db%/*}.tmp.XXXXXX"; })
	trap 'rm -rf "$tmp"' EXIT
	"${TOOL[@]}" indexdb -vulns "$src/data/osv" -out "$tmp/db"
	mkdir -p "${db%/*}"
	rm -rf "$db" && mv "$tmp/db" "$db"
fi
"${TOOL[@]}" govulncheck -db "file://$db" ./...
