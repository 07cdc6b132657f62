#!/usr/bin/env bash
# Two GPUs, one process each, DistributedDataParallel over NCCL under
# gpupool (the nvidia-h200-x2 machine; scripts/gpu_ddp.py): bitwise-identical
# losses and parameters with PyTorch's caching allocator off, with and
# without gpupool; gpupool's hits on both ranks; then the step time under
# gpupool (caching off) against PyTorch's caching allocator, ROUNDS rounds
# interleaved in this one call (scripts/interleave.py).
#   scripts/h200-ddp.sh LIB [ROUNDS]
set -u -o pipefail
LIB=$(realpath "$1")
ROUNDS=${2:-6}
OUT=${OUT:-h100-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$PY" scripts/gpu_ddp.py >"$OUT/ddp-off.txt" 2>&1
echo "caching off, no gpupool: rc $?"
PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB GPUPOOL_STATS_AT_EXIT=1 \
  GPUPOOL_STATS_FILE="$OUT/ddp-stats-%p.txt" "$PY" scripts/gpu_ddp.py >"$OUT/ddp-gpupool.txt" 2>&1
echo "caching off, gpupool: rc $?"
"$PY" - "$OUT/ddp-off.txt" "$OUT/ddp-gpupool.txt" <<'PY'
import json, sys
def result(path):
    lines = [l for l in open(path) if l.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else None
a, b = result(sys.argv[1]), result(sys.argv[2])
if not a or not b:
    print("FAIL DDP: a run printed no RESULT"); sys.exit(0)
same = a["losses"] == b["losses"] and a["params_sha256"] == b["params_sha256"]
print(("PASS" if same and a["ranks_agree"] and b["ranks_agree"] else "FAIL") +
      f" DDP losses and parameters identical, caching off vs off under gpupool: "
      f"{len(a['losses'])} losses, last {a['losses'][-1]} vs {b['losses'][-1]}; ranks agree {a['ranks_agree']}/{b['ranks_agree']}")
PY
for f in "$OUT"/ddp-stats-*.txt; do
  [[ -f $f ]] && echo "$(basename "$f"): $(grep -m1 '^total' "$f")"
done
"$PY" scripts/interleave.py --rounds "$ROUNDS" --metric 'step_ms_median": ([0-9.]+)' \
  caching="$PY scripts/gpu_ddp.py" \
  gpupool="PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB $PY scripts/gpu_ddp.py" \
  | tee "$OUT/ddp-interleave.txt" | tail -6
