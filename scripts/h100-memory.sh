#!/usr/bin/env bash
# Memory overhead on real programs (README, "Memory overhead"): for each
# loop, the framework's own allocator (PyTorch's caching allocator: peak
# reserved / peak allocated; CuPy's pools: totals) and the same loop with its
# pool off under gpupool, traced (GPUPOOL_TRACE_FILE). The traces come back
# in $OUT and are read by bench_replay (peak active, blocks allocated), here
# or anywhere. One process per loop and batch.
#   scripts/h100-memory.sh LIB
set -u -o pipefail
LIB=$(realpath "$1")
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=scripts/gpu_torch.py
run() {  # name, then the command
  local name=$1
  shift
  echo "== $name" | tee -a "$OUT/memory.log"
  timeout 200 "$@" >"$OUT/$name.out" 2>>"$OUT/memory.log" || echo "$name failed: $?" | tee -a "$OUT/memory.log"
  grep '^RESULT' "$OUT/$name.out" | tee -a "$OUT/memory.log"
}
for loop in "cnn 64" "cnn 128" "cnn 256" "cnn 512" "mlp 64" "mnist 64"; do
  set -- $loop
  run "torch-$1-$2-caching" python3 $T --model "$1" --batch "$2" --steps 40 --infer-iters 10 --tag caching
  run "torch-$1-$2-gpupool" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" \
    GPUPOOL_TRACE_FILE="$OUT/torch-$1-$2.trace" python3 $T --model "$1" --batch "$2" --steps 40 \
    --infer-iters 10 --tag nocache+gpupool
done
run cupy-pool python3 scripts/gpu_cupy.py --pool cupy --iters 60 --tag cupy-pool
run cupy-gpupool env LD_PRELOAD="$LIB" GPUPOOL_TRACE_FILE="$OUT/cupy.trace" python3 scripts/gpu_cupy.py \
  --pool none --iters 60 --tag none+gpupool
ls -la "$OUT"
