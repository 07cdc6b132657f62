#!/usr/bin/env bash
# Sharing a GPU, on the lent H100 (docs/sharing.md): the neighbour
# table with a CUDA holder and with an OpenCL holder, and the idle-release
# measurements. LIB is a libgpupool.so built elsewhere (the device machine
# builds nothing else); results go to $OUT (default ./h100-out).
#   scripts/h100-neighbours.sh LIB [HOLD_GIB]
set -eu -o pipefail
LIB=$(realpath "$1")
HOLD=${2:-40}
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=$(mktemp -d)
CUDA=/usr/local/cuda
cc -O2 -o "$T/neighbour" tests/cuda/neighbour.c -I"$CUDA/include" -L"$CUDA/lib64/stubs" -lcuda
CL_LIB=$(ls "$CUDA"/lib64/libOpenCL.so.1 /usr/lib/x86_64-linux-gnu/libOpenCL.so.1 2>/dev/null | head -1 || true)
if [[ -n $CL_LIB ]]; then
  cc -O2 -o "$T/opencl_hold" tests/gpu/opencl_hold.c -I"$CUDA/include" "$CL_LIB" \
    -Wl,-rpath,"$(dirname "$CL_LIB")"
  mkdir -p "$T/vendors"
  echo libnvidia-opencl.so.1 >"$T/vendors/nvidia.icd"
  export OCL_ICD_VENDORS=$T/vendors
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 scripts/gpu_neighbours.py "$LIB" "$T/neighbour" --hold-gib "$HOLD" --rounds 2 \
  2>&1 | tee "$OUT/neighbours.txt"
if [[ -n $CL_LIB ]]; then
  python3 scripts/gpu_neighbours.py "$LIB" "$T/neighbour" --hold-gib "$HOLD" --rounds 2 \
    --opencl-holder "$T/opencl_hold" 2>&1 | tee "$OUT/neighbours-opencl.txt"
else
  echo "no libOpenCL.so.1: OpenCL holder skipped" | tee "$OUT/neighbours-opencl.txt"
fi
python3 scripts/gpu_idle_release.py "$LIB" "$T/neighbour" --hold-gib "$HOLD" 2>&1 | tee "$OUT/idle.txt"
