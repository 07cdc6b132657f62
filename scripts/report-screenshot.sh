#!/usr/bin/env bash
# A picture of `gpupool report`'s page, as headless Chromium draws it (the
# browser the tests use): for docs/memory.md and results files.
#   scripts/report-screenshot.sh TRACE|REPORT.html OUT.png [HEIGHT]
# A trace is made into its page first, with $GPUPOOL, else the gpupool on
# PATH, else this checkout's build/bin/gpupool; make it on the machine that
# ran the traced program (frames are named from its files).
set -euo pipefail
[[ $# -ge 2 ]] || { echo "usage: $0 TRACE|REPORT.html OUT.png [HEIGHT]" >&2; exit 2; }
input=$(realpath "$1")
png=$2
height=${3:-2400}
chromium=$(command -v chromium || command -v chromium-browser) || {
  echo "report-screenshot.sh: chromium is needed (scripts/install-deps.sh installs it)" >&2
  exit 1
}
html=$input
if [[ $(head -c 15 "$input") == "# gpupool trace" ]]; then
  gpupool=${GPUPOOL:-$(command -v gpupool || echo "$(dirname "$0")/../build/bin/gpupool")}
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  html=$tmp/report.html
  "$gpupool" report "$input" -o "$html"
fi
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 \
  --window-size=1280,"$height" --screenshot="$png" "file://$html" 2>/dev/null
[[ -s $png ]] || { echo "report-screenshot.sh: no picture written" >&2; exit 1; }
echo "$png"
