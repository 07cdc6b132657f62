#!/bin/sh
# clCreateBuffer+clReleaseMemObject pairs, raw vs gpupool, on the default
# OpenCL device (PoCL here; on NVIDIA set OCL_ICD_VENDORS as in
# tests/opencl/README.md). Prints ns per pair (best of 5 rounds).
#   scripts/bench_opencl.sh [BUILD_DIR] [PAIRS]
set -eu
b=${1:-build}
pairs=${2:-20000}
exe=$b/tests/opencl/cl_bench_create
lib=$(cd "$b" && pwd)/libgpupool.so
[ -x "$exe" ] || { echo "build $exe first (cmake --build $b --target cl_bench_create)" >&2; exit 2; }
run() { "$@" 2>/dev/null; }
printf '%-10s %-44s %12s %12s\n' size case raw_ns gpupool_ns
for size in 4096 1048576 67108864; do
  raw=$(run "$exe" "$pairs" "$size")
  hit=$(LD_PRELOAD=$lib run "$exe" "$pairs" "$size")
  printf '%-10s %-44s %12s %12s\n' "$size" "create+release (warm pool: hit)" "$raw" "$hit"
  n=$((pairs / 10))
  raw=$(run "$exe" "$n" "$size" 1)
  hit=$(LD_PRELOAD=$lib run "$exe" "$n" "$size" 1)
  printf '%-10s %-44s %12s %12s\n' "$size" "create+1-byte write+release" "$raw" "$hit"
  miss=$(GPUPOOL_HOLD=0 LD_PRELOAD=$lib run "$exe" "$n" "$size")
  nop=$(GPUPOOL_HOLD=0 GPUPOOL_PROBE=0 LD_PRELOAD=$lib run "$exe" "$n" "$size")
  printf '%-10s %-44s %12s %12s\n' "$size" "miss path (GPUPOOL_HOLD=0), probe on" "-" "$miss"
  printf '%-10s %-44s %12s %12s\n' "$size" "miss path (GPUPOOL_HOLD=0), GPUPOOL_PROBE=0" "-" "$nop"
done
