#!/usr/bin/env bash
# Several GPUs in one process under gpupool (nvidia-h200-x2): the results of
# scripts/gpu_multi_device.py (threads switching GPUs, peer copies between
# pooled blocks) with PyTorch's caching allocator off, with and without
# gpupool, must be identical; gpupool's stats show each GPU's own pool.
#   scripts/h200-multi-device.sh LIB
set -u -o pipefail
LIB=$(realpath "$1")
OUT=${OUT:-h100-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PY" scripts/gpu_multi_device.py >"$OUT/multi-off.txt" 2>&1
echo "no gpupool: rc $?"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB GPUPOOL_STATS_AT_EXIT=1 GPUPOOL_STATS_FILE="$OUT/multi-stats.txt" \
  "$PY" scripts/gpu_multi_device.py >"$OUT/multi-gpupool.txt" 2>&1
echo "gpupool: rc $?"
a=$(grep '^RESULT' "$OUT/multi-off.txt")
b=$(grep '^RESULT' "$OUT/multi-gpupool.txt")
if [[ -n $a && $a == "$b" ]]; then echo "PASS results identical: $a"; else echo "FAIL: '$a' vs '$b'"; fi
grep -E "^cuda dev|^total" "$OUT/multi-stats.txt" | cut -c1-160
