#!/usr/bin/env bash
# fork() in a real GPU program, on the GPU machine: scripts/gpu_fork.py
# (PyTorch, caching off, DataLoader workers forked every epoch and bare
# children, a second thread allocating all along) without gpupool, under it,
# and under it with a stats dump every millisecond (gpupool's thread busy
# when the forks come), ROUNDS rounds. Every run must finish (150 s each)
# with the same checksum. One line per run on stdout, logs under $OUT.
#   scripts/h100-fork.sh LIB [ROUNDS]
set -u
LIB=$(realpath "$1")
ROUNDS=${2:-3}
OUT=${OUT:-./h100-fork-out}
mkdir -p "$OUT"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
one() {
  local tag=$1; shift
  env "$@" timeout 150 python3 "$(dirname "$0")/gpu_fork.py" 6 > "$OUT/$tag.log" 2>&1
  local rc=$?
  printf '  %-9s rc=%s %s\n' "$tag" "$rc" "$(tail -1 "$OUT/$tag.log")"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "round $r"
  one "plain$r"
  one "gpupool$r" LD_PRELOAD="$LIB"
  one "busy$r" LD_PRELOAD="$LIB" GPUPOOL_STATS_INTERVAL=1ms GPUPOOL_STATS_FILE=/dev/null
done
