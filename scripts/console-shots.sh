#!/usr/bin/env bash
# console-shots.sh: screenshots of the web console, for a reviewer.
#
# Runs the console's browser test (e2e/console: headless Chromium against
# real processes) and copies the pages it saved into DIR (default
# ./console-shots): 1-fleet.png, 2-account.png, 3-set-rate.png,
# 4-cross-origin-refused.png, 5-used-link.png. Needs Debian's chromium
# (apt-get install chromium).
set -euo pipefail

cd "$(dirname "$0")/.."
GO=${GO:-go}
out=${1:-console-shots}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$GO" test -count=1 -run '^TestConsoleInABrowser$' -artifacts -outputdir "$work" ./e2e/console
mkdir -p "$out"
find "$work/_artifacts" -name '*.png' -exec cp {} "$out/" \;
ls -1 "$out"/*.png
