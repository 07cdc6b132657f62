#!/usr/bin/env bash
# One thread's warm pair through the shim on the GPU machine, two libraries
# interleaved in one call (docs/measurements.md, "Measured"): CUDA device pairs (safe and
# immediate reuse) and NVIDIA OpenCL pairs at 64 KiB and 4 MiB, ROUNDS rounds
# alternating the order; cuCtxGetCurrent alone (the driver call the shim
# makes on every allocation); and where LIB_B's time goes (perf, when the
# machine has it). Results under $OUT: hotpath.txt, hotpath-runs.txt (every
# run, one line each), perf-*.txt.
#   [SIZES="65536 4194304"] scripts/h100-hotpath.sh LIB_A LIB_B [ROUNDS]
set -u -o pipefail
A=$(realpath "$1")
B=$(realpath "$2")
ROUNDS=${3:-5}
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=$(mktemp -d)
CUDA=${CUDA_HOME:-/usr/local/cuda}
gcc -O2 -g -DPAIR_CUDA -I"$CUDA/include" -o "$T/cuda_pair" tests/gpu/pair_loop.c \
  -L"$CUDA/lib64/stubs" -lcuda || exit 1
OCL=$(ldconfig -p | awk '/libOpenCL\.so\.1 /{print $NF; exit}')
[[ -z $OCL ]] && OCL=$CUDA/lib64/libOpenCL.so.1
NV=$(ldconfig -p | awk '/libnvidia-opencl\.so\.1 /{print $NF; exit}')
HAVE_CL=0
if [[ -f $OCL && -n $NV ]]; then
  mkdir -p "$T/vendors" "$T/lib"
  echo "$NV" >"$T/vendors/nvidia.icd"
  ln -sf "$OCL" "$T/lib/libOpenCL.so"
  gcc -O2 -g -DPAIR_OPENCL -I"$CUDA/include" -o "$T/cl_pair" tests/gpu/pair_loop.c \
    -L"$T/lib" -lOpenCL -Wl,-rpath,"$(dirname "$OCL")" && HAVE_CL=1
  export OCL_ICD_VENDORS=$T/vendors OCL_ICD_FILENAMES=$NV
fi
R=$T/runs.txt
: >"$R"
for r in $(seq 1 "$ROUNDS"); do
  order=(a b)
  ((r % 2 == 0)) && order=(b a)
  for which in "${order[@]}"; do
    lib=$A
    [[ $which == b ]] && lib=$B
    for size in ${SIZES:-65536 4194304}; do
      for mode in safe immediate; do
        echo "$which cuda-$mode $(LD_PRELOAD=$lib GPUPOOL_REUSE=$mode "$T/cuda_pair" device $size 2000000)" >>"$R"
      done
      ((HAVE_CL)) && echo "$which opencl $(LD_PRELOAD=$lib "$T/cl_pair" opencl $size 1000000)" >>"$R"
    done
  done
done
{
  echo "a = $A"
  echo "b = $B"
  echo "cuCtxGetCurrent alone: $("$T/cuda_pair" ctx 0 20000000 | awk '{print $3}') ns per call"
  python3 - "$R" <<'PY'
import collections, statistics, sys
v = collections.defaultdict(list)
def human(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or n % 1024: return f"{n} {unit}"
        n >>= 10
    return f"{n} GiB"
for line in open(sys.argv[1]):
    lib, case, _, size, ns = line.split()
    v[(case, int(size), lib)].append(float(ns))
print("| pair | size | a median ns (range) | b median ns (range) | b/a per round, median |")
print("|---|---|---|---|---|")
for case, size in sorted({(k[0], k[1]) for k in v}):
    a, b = v[(case, size, "a")], v[(case, size, "b")]
    ratios = [y / x for x, y in zip(a, b)]
    print(f"| {case} | {human(size)} | {statistics.median(a):.0f} ({min(a):.0f}-{max(a):.0f}) | "
          f"{statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f}) | {statistics.median(ratios):.3f} |")
PY
} | tee "$OUT/hotpath.txt"
cp "$R" "$OUT/hotpath-runs.txt"
if command -v perf >/dev/null; then
  LD_PRELOAD=$B perf record -q -g -o "$T/cuda.data" "$T/cuda_pair" device 65536 5000000 >/dev/null 2>&1 &&
    perf report -i "$T/cuda.data" --no-children --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | head -40 >"$OUT/perf-cuda.txt"
  ((HAVE_CL)) && LD_PRELOAD=$B perf record -q -g -o "$T/cl.data" "$T/cl_pair" opencl 65536 2000000 >/dev/null 2>&1 &&
    perf report -i "$T/cl.data" --no-children --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' | head -40 >"$OUT/perf-opencl.txt"
else
  echo "perf: not on this machine" | tee "$OUT/perf-cuda.txt"
fi
