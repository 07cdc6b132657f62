#!/usr/bin/env bash
# A picture of `gpupool report`'s page, as headless Chromium draws it (the
# browser the tests use): for README and results files.
#   scripts/report-screenshot.sh REPORT.html OUT.png [HEIGHT]
set -euo pipefail
html=$(realpath "$1")
png=$2
height=${3:-2400}
chromium=$(command -v chromium || command -v chromium-browser) || {
  echo "report-screenshot.sh: chromium is needed (scripts/install-deps.sh installs it)" >&2
  exit 1
}
"$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=5000 \
  --window-size=1240,"$height" --screenshot="$png" "file://$html" 2>/dev/null
[[ -s $png ]] || { echo "report-screenshot.sh: no picture written" >&2; exit 1; }
echo "$png"
