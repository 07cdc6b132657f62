#!/usr/bin/env bash
# `gpupool report` of the PyTorch loop on the GPU machine (issue 13): the
# small CNN at batch 64 then 256, PyTorch's caching off, under gpupool with
# GPUPOOL_SITES=all, a trace and the leak report. The page is made there,
# where the traced libraries are (names come from their files). Results
# under $OUT: torch-report.html, report.txt (sizes, times, the leak report).
#   scripts/h100-report.sh LIB LAUNCHER
set -u -o pipefail
LIB=$(realpath "$1")
LAUNCHER=$(realpath "$2")
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=$(mktemp -d)
{
  env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" GPUPOOL_SITES=all GPUPOOL_LEAKS=1 \
    GPUPOOL_STATS_FILE="$T/leaks.txt" GPUPOOL_TRACE_FILE="$T/torch.trace" timeout 200 \
    python3 scripts/gpu_torch.py --model cnn --batch 64,256 --steps 40 --infer-iters 10 --tag report |
    grep '^RESULT' | cut -c1-400
  echo "trace: $(stat -c %s "$T/torch.trace") bytes, $(grep -c '^[af] ' "$T/torch.trace") events," \
    "$(grep -c '^site ' "$T/torch.trace") sites, $(grep -c '^module ' "$T/torch.trace") module segments"
  /usr/bin/time -f "report: %e s, %M KiB" "$LAUNCHER" report "$T/torch.trace" -o "$OUT/torch-report.html"
  ls -la "$OUT/torch-report.html"
  echo "== leak report (first 4000 bytes)"
  head -c 4000 "$T/leaks.txt"
} >"$OUT/report.txt" 2>&1
cat "$OUT/report.txt"
