#!/usr/bin/env bash
# Time and memory of `gpupool report` and `gpupool trace convert` on
# synthetic traces (tests/bench/synth_trace.py: several threads, sites on
# every allocation), measured with /usr/bin/time: wall and CPU seconds, and
# the peak resident set. Not a test: the numbers go in docs/trace.md.
#   scripts/bench-report.sh [EVENTS...]     (default: 1000000 5000000)
# GPUPOOL: the gpupool to measure (default: this checkout's build/bin/gpupool);
# BENCH_DIR: where the traces are kept, to measure another gpupool on the
# same ones (default: a temporary directory).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
gpupool=${GPUPOOL:-$here/../build/bin/gpupool}
[[ -x /usr/bin/time ]] || { echo "bench-report.sh: /usr/bin/time is needed (Debian: time)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(($# > 0)) || set -- 1000000 5000000
printf '%-9s %-26s %8s %8s %10s\n' events command wall_s cpu_s max_rss_MB
for events in "$@"; do
  trace=${BENCH_DIR:-$tmp}/synth-$events.trace
  [[ -s $trace ]] || python3 "$here/../tests/bench/synth_trace.py" "$events" "$trace"
  for cmd in "report -o $tmp/r.html" "report --text -o $tmp/r.txt" \
             "trace convert --to perfetto -o $tmp/t.json" "trace convert --to rmm -o $tmp/t.csv"; do
    read -r sub rest <<<"$cmd"
    if [[ $sub == trace ]]; then
      args=(trace convert "$trace" ${rest#convert })
    else
      args=(report "$trace" $rest)
    fi
    if /usr/bin/time -o "$tmp/time" -f '%e %U %S %M' "$gpupool" "${args[@]}" >/dev/null 2>"$tmp/err"; then
      awk -v e="$events" -v c="${cmd%% -o*}" \
        '{printf "%-9s %-26s %8.2f %8.2f %10.0f\n", e, c, $1, $2 + $3, $4 / 1024}' "$tmp/time"
    else
      printf '%-9s %-26s %s\n' "$events" "${cmd%% -o*}" "failed: $(head -1 "$tmp/err")"
    fi
    rm -f "$tmp"/r.* "$tmp"/t.json "$tmp"/t.csv
  done
done
