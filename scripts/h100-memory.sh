#!/usr/bin/env bash
# Memory overhead on real programs, on the GPU machine (docs/memory.md,
# "Memory overhead"): gpupool's default, GPUPOOL_SPLIT, and the frameworks' own pools.
#   scripts/h100-memory.sh LIB memory   driver-API checks (scripts/gpu_split.py:
#        no gpupool, gpupool, gpupool with splitting), then each loop once per
#        allocator: PyTorch's caching allocator, gpupool (caching off), gpupool
#        with GPUPOOL_SPLIT=on, and with GPUPOOL_REUSE=immediate besides (one
#        stream: what PyTorch's allocator does); CuPy's pools against gpupool
#        and gpupool split.
#        gpupool runs are traced and dump their stats at exit; everything lands
#        in $OUT/memory.tar.gz for scripts/memory_summary.py.
#   [LOOPS="cnn:128 mnist:64"] scripts/h100-memory.sh LIB speed [ROUNDS]   step
#        times, interleaved (scripts/interleave.py): caching, gpupool, and
#        gpupool split as in memory, ROUNDS rounds (default 6) of each loop;
#        $OUT/speed.log.
set -u -o pipefail
LIB=$(realpath "$1")
WHAT=${2:-memory}
ROUNDS=${3:-6}
LOOPS=${LOOPS:-cnn:128 mnist:64}
SPLIT_ONLY=${SPLIT_ONLY:-}   # memory: only the GPUPOOL_SPLIT=on runs (the others as before)
IMMEDIATE=${IMMEDIATE-1}     # speed: also GPUPOOL_REUSE=immediate with splitting ('' leaves it out)
OUT=${OUT:-./h100-memory-out}
S=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
T="python3 $S/gpu_torch.py"
NOCACHE="PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=$LIB"

if [ "$WHAT" = memory ]; then
  W=$(mktemp -d)
  {
    echo "== driver API: no gpupool"; timeout 60 python3 "$S/gpu_split.py"
    echo "== driver API: gpupool"; LD_PRELOAD=$LIB timeout 60 python3 "$S/gpu_split.py"
    echo "== driver API: gpupool, GPUPOOL_SPLIT=on"
    LD_PRELOAD=$LIB GPUPOOL_SPLIT=on timeout 60 python3 "$S/gpu_split.py"
  } 2>&1 | tee "$W/checks.log"
  one() {  # name, then the command (env assignments first)
    local name=$1
    shift
    echo "== $name"
    env "$@" >"$W/$name.out" 2>"$W/$name.err" || echo "$name failed: $?"
    grep -h '^RESULT' "$W/$name.out" | cut -c1-160
  }
  pooled() {  # name split reuse growth, then the program
    local name=$1 split=$2 reuse=$3 growth=$4
    shift 4
    one "$name" PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" GPUPOOL_SPLIT="$split" \
      GPUPOOL_REUSE="$reuse" GPUPOOL_PENDING_GROWTH="$growth" \
      GPUPOOL_TRACE_FILE="$W/$name.trace" GPUPOOL_STATS_AT_EXIT=1 GPUPOOL_STATS_FORMAT=json \
      GPUPOOL_STATS_FILE="$W/$name.stats" timeout 200 "$@"
  }
  for loop in "cnn 64" "cnn 128" "cnn 256" "cnn 512" "mlp 64" "mnist 64"; do
    set -- $loop
    args=(--model "$1" --batch "$2" --steps 40 --infer-iters 10)
    [ -n "$SPLIT_ONLY" ] || one "torch-$1-$2-caching" timeout 200 python3 "$S/gpu_torch.py" "${args[@]}" --tag caching
    [ -n "$SPLIT_ONLY" ] || pooled "torch-$1-$2-gpupool" off safe 2% python3 "$S/gpu_torch.py" "${args[@]}" --tag gpupool
    pooled "torch-$1-$2-split" on safe 2% python3 "$S/gpu_torch.py" "${args[@]}" --tag split
    # PyTorch's loops run on one stream: immediate reuse is what its own
    # allocator does there.
    [ -n "$SPLIT_ONLY" ] || pooled "torch-$1-$2-splitimm" on immediate 2% python3 "$S/gpu_torch.py" "${args[@]}" --tag split-imm
  done
  [ -n "$SPLIT_ONLY" ] || one cupy-caching timeout 200 python3 "$S/gpu_cupy.py" --pool cupy --iters 60 --tag cupy-pool
  [ -n "$SPLIT_ONLY" ] || pooled cupy-gpupool off safe 2% python3 "$S/gpu_cupy.py" --pool none --iters 60 --tag gpupool
  pooled cupy-split on safe 2% python3 "$S/gpu_cupy.py" --pool none --iters 60 --tag split
  tar -C "$W" -czf "$OUT/memory.tar.gz" .
  ls -la "$OUT"
else
  for loop in $LOOPS; do
    set -- ${loop/:/ }
    A="--model $1 --batch $2 --steps 30 --infer-iters 5"
    echo "== $1 batch $2: step_ms_median"
    modes=(caching="$T $A" gpupool="$NOCACHE $T $A" split="$NOCACHE GPUPOOL_SPLIT=on $T $A")
    [ -z "$IMMEDIATE" ] || modes+=(split-imm="$NOCACHE GPUPOOL_SPLIT=on GPUPOOL_REUSE=immediate $T $A")
    timeout 285 python3 "$S/interleave.py" --rounds "$ROUNDS" --metric 'step_ms_median": ([0-9.]+)' \
      "${modes[@]}"
  done 2>&1 | tee "$OUT/speed.log"
fi
