#!/usr/bin/env bash
# Thread scaling of the full shim path, two libraries interleaved in one
# call (README, "Measured"): tests/gpu/bench_alloc --threads-only (warm
# device pairs, 1-16 threads, 64 KiB and 4 MiB), safe and immediate reuse,
# ROUNDS rounds alternating the libraries' order. Prints the median rate per
# library, mode, size and thread count, and the 16-thread/1-thread scaling.
#   scripts/h100-threads.sh LIB_A LIB_B [ROUNDS]
set -eu -o pipefail
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-5}
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=$(mktemp -d)
g++ -O2 -std=c++20 -I/usr/local/cuda/include -o "$T/bench_alloc" tests/gpu/bench_alloc.cpp \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread
: >"$OUT/threads.json"
for r in $(seq 1 "$ROUNDS"); do
  order=(a b)
  ((r % 2 == 0)) && order=(b a)
  for which in "${order[@]}"; do
    lib=$A
    [[ $which == b ]] && lib=$B
    for mode in safe immediate; do
      LD_PRELOAD=$lib GPUPOOL_REUSE=$mode "$T/bench_alloc" --threads-only --label "$which-$mode" \
        | grep '^{' >>"$OUT/threads.json"
    done
  done
done
python3 - "$OUT/threads.json" "$A" "$B" <<'PY'
import collections, json, statistics, sys
rates = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rates[(r["label"], r["size"], r["threads"])].append(r["pairs_per_s"])
print(f"a = {sys.argv[2]}\nb = {sys.argv[3]}")
print("| library-mode | size | 1 thread (M pairs/s) | 16 threads | 16/1 | per-pair ns, 1 thread |")
print("|---|---|---|---|---|---|")
for label in sorted({k[0] for k in rates}):
    for size in sorted({k[1] for k in rates}):
        one = statistics.median(rates[(label, size, 1)])
        six = statistics.median(rates[(label, size, 16)])
        print(f"| {label} | {size >> 10} KiB | {one / 1e6:.2f} | {six / 1e6:.2f} | {six / one:.2f} | {1e9 / one:.0f} |")
PY
