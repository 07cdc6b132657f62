#!/usr/bin/env bash
# Thread scaling of the full shim path on the GPU machine (docs/measurements.md,
# "Measured"): tests/gpu/bench_alloc --scaling, where each round runs one
# thread's batch and N threads' batch back to back, so the host's moment-to-
# moment speed cancels in their ratio; beside warm device pairs (64 KiB and
# 4 MiB) the same rounds measure workloads that share nothing ("host":
# arithmetic; "ctx": the same and cuCtxGetCurrent), how far the host lets N
# threads scale at all. Each library runs under safe and then immediate
# reuse, PROCS processes each, the libraries' order rotating from one round
# of processes to the next. Prints per library
# and mode the median (range) of the per-round scalings.
#   scripts/h100-threads.sh LIB [LIB ...]     env: PROCS (3), ROUNDS (7), THREADS (16)
set -eu -o pipefail
OUT=${OUT:-h100-out}
PROCS=${PROCS:-3}
ROUNDS=${ROUNDS:-7}
THREADS=${THREADS:-16}
(($# > 0)) || { echo "usage: $0 LIB [LIB ...]" >&2; exit 2; }
libs=()
for l in "$@"; do
  [[ -f $l ]] || { echo "h100-threads.sh: no library $l" >&2; exit 2; }
  libs+=("$(realpath "$l")")
done
mkdir -p "$OUT"
T=$(mktemp -d)
g++ -O2 -std=c++20 -I/usr/local/cuda/include -o "$T/bench_alloc" tests/gpu/bench_alloc.cpp \
  -L/usr/local/cuda/lib64/stubs -lcuda -lpthread
: >"$OUT/threads.json"
for p in $(seq 1 "$PROCS"); do
  for i in "${!libs[@]}"; do
    # Rotate the order of the libraries from one process round to the next.
    lib=${libs[$(((i + p) % ${#libs[@]}))]}
    n=$(((i + p) % ${#libs[@]}))
    for mode in safe immediate; do
      LD_PRELOAD=$lib GPUPOOL_REUSE=$mode "$T/bench_alloc" --scaling "$ROUNDS" \
        --threads "$THREADS" --label "$n-$mode" | grep '^{' >>"$OUT/threads.json"
    done
  done
done
{
  echo "host: $(nproc) CPUs; $(lscpu 2>/dev/null | grep -E '^(Thread\(s\) per core|Core\(s\) per socket|Socket\(s\)|Model name)' | tr -s ' ' | paste -sd ';')"
  for i in "${!libs[@]}"; do echo "library $i = ${libs[$i]}"; done
  python3 - "$OUT/threads.json" "$THREADS" <<'PY'
import collections, json, statistics, sys
v = collections.defaultdict(list)
one = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["label"], r["workload"], r["size"])
    v[key].append(r["scaling"])
    one[key].append(r["one_ns"])
print(f"| library-mode | workload | size | {sys.argv[2]} threads over 1, median (range) | rounds | 1 thread, ns per op, median |")
print("|---|---|---|---|---|---|")
for key in sorted(v):
    s = v[key]
    size = f"{key[2] >> 10} KiB" if key[2] else ""
    print(f"| {key[0]} | {key[1]} | {size} | {statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f}) "
          f"| {len(s)} | {statistics.median(one[key]):.1f} |")
PY
} | tee "$OUT/threads.md"
