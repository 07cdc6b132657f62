#!/bin/sh
# gpupool in one command: build the library, then run an unmodified OpenCL
# program (tests/opencl/demo_arraymath.c: array math with a new buffer for
# every intermediate result) on the default OpenCL device (PoCL on a machine
# without a GPU), once plainly and once under gpupool with its stats printed
# at exit, and show how long each run took.
#
#   scripts/demo.sh [STEPS] [ELEMENTS]      (default 150 steps of 1M floats)
#   BUILD_DIR=dir scripts/demo.sh           (build somewhere else than build/)
#
# Needs: cmake, a C/C++ compiler, libfmt-dev, ocl-icd-opencl-dev,
# opencl-headers, pocl-opencl-icd (scripts/install-deps.sh; docs/install.md).
set -eu
cd "$(dirname "$0")/.."
steps=${1:-150}
elements=${2:-1048576}
b=${BUILD_DIR:-build}

echo "== building gpupool (cmake -B $b && cmake --build $b --target gpupool)"
cmake -B "$b" >/dev/null
cmake --build "$b" --target gpupool -j2 >/dev/null
# The demo is an ordinary OpenCL program: built on its own, linked with -lOpenCL.
cc -O2 -o "$b/demo_arraymath" tests/opencl/demo_arraymath.c -lOpenCL

now_ms() { date +%s%3N; }

# Warm-up: the OpenCL compiler caches the kernels, so neither timed run pays
# for compiling them.
rc=0
"$b/demo_arraymath" 2 1024 >/dev/null 2>&1 || rc=$?
if [ "$rc" = 77 ]; then
  echo "No OpenCL device found: install pocl-opencl-icd (CPU OpenCL) or a GPU driver's ICD." >&2
  exit 1
elif [ "$rc" != 0 ]; then
  echo "The demo program failed ($rc) even without gpupool; see:" >&2
  "$b/demo_arraymath" 2 1024 >&2
  exit 1
fi

echo
echo "== without gpupool: $b/demo_arraymath $steps $elements"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
t0=$(now_ms)
"$b/demo_arraymath" "$steps" "$elements" >"$out"
t1=$(now_ms)
plain=$((t1 - t0))
cat "$out"
plain_r=$(grep '^R ' "$out")

echo
echo "== with gpupool: GPUPOOL_STATS_AT_EXIT=1 LD_PRELOAD=$b/libgpupool.so $b/demo_arraymath $steps $elements"
t0=$(now_ms)
GPUPOOL_STATS_AT_EXIT=1 LD_PRELOAD="$(cd "$b" && pwd)/libgpupool.so" "$b/demo_arraymath" "$steps" "$elements" \
  >"$out"
t1=$(now_ms)
pooled=$((t1 - t0))
cat "$out"
pooled_r=$(grep '^R ' "$out")

echo
echo "== wall time: without gpupool ${plain} ms, with gpupool ${pooled} ms"
if [ "$pooled" -gt 0 ]; then
  awk -v a="$plain" -v b="$pooled" 'BEGIN { printf "   speed-up %.2fx\n", a / b }'
fi
# The R lines (device, steps, elements, buffers, checksum) compared, not
# assumed.
if [ -n "$plain_r" ] && [ "$plain_r" = "$pooled_r" ]; then
  echo "   same result in both runs: ${plain_r#R }"
else
  echo "   DIFFERENT results: without gpupool '$plain_r', with gpupool '$pooled_r'" >&2
  exit 1
fi
