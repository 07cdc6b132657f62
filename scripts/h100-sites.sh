#!/usr/bin/env bash
# What recording costs the PyTorch loop (docs/memory.md, "Where the memory goes"),
# on the GPU machine: the small CNN (batch 64, PyTorch's caching off, under
# gpupool), ROUNDS rounds, the modes interleaved in a new order each round:
#   off         nothing recorded
#   trace       GPUPOOL_TRACE_FILE
#   sites-64M   GPUPOOL_SITES=64MiB (one allocation per 64 MiB asked for)
#   sites-100   GPUPOOL_SITES=100 (one allocation in 100)
#   sites-all   GPUPOOL_SITES=all
#   trace+all   both
# Then the trace's bytes per event, and `gpupool report` of the trace+all
# run when the launcher has it. Results under $OUT: sites.txt, the report.
#   scripts/h100-sites.sh LIB LAUNCHER [ROUNDS]
set -u -o pipefail
LIB=$(realpath "$1")
LAUNCHER=$(realpath "$2")
ROUNDS=${3:-5}
OUT=${OUT:-h100-out}
mkdir -p "$OUT"
T=$(mktemp -d)
R=$OUT/sites.txt
: >"$R"
run() {  # mode round
  local mode=$1 i=$2 extra=()
  case $mode in
    off) ;;
    trace) extra=(GPUPOOL_TRACE_FILE=$T/trace-$i) ;;
    sites-64M) extra=(GPUPOOL_SITES=64MiB) ;;
    sites-100) extra=(GPUPOOL_SITES=100) ;;
    sites-all) extra=(GPUPOOL_SITES=all) ;;
    trace+all) extra=(GPUPOOL_SITES=all GPUPOOL_TRACE_FILE=$T/traceall-$i) ;;
  esac
  local line
  line=$(env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" "${extra[@]}" timeout 120 \
    python3 scripts/gpu_torch.py --model cnn --batch 64 --steps 60 --infer-iters 10 --tag "$mode" \
    2>>"$T/stderr" | grep '^RESULT' | head -n 1)
  echo "$i $mode ${line#RESULT }" >>"$R"
}
MODES=(off trace sites-64M sites-100 sites-all trace+all)
for ((i = 0; i < ROUNDS; i++)); do
  # A new order each round (rotated): no mode always first or last.
  for ((k = 0; k < ${#MODES[@]}; k++)); do
    run "${MODES[$(((k + i) % ${#MODES[@]}))]}" "$i"
  done
done
python3 - "$R" <<'PY' | tee "$OUT/sites-summary.txt"
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    i, mode, js = line.split(" ", 2)
    try:
        rows.setdefault(mode, {})[int(i)] = json.loads(js)["step_ms_median"]
    except Exception:
        pass
base = rows.get("off", {})
print("mode        step ms (median of rounds)   ratio to off per round: median [min, max]")
for mode, r in rows.items():
    ratios = [r[i] / base[i] for i in r if i in base]
    print(f"{mode:10s}  {statistics.median(r.values()):8.3f}   "
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]  n={len(ratios)}")
PY
for f in "$T"/trace-0 "$T"/traceall-0; do
  [[ -f $f ]] || continue
  ev=$(grep -c '^[af] ' "$f")
  decl=$(grep -c '^\(site\|module\|pyframe\) ' "$f")
  echo "$(basename "$f"): $(stat -c %s "$f") bytes, $ev events, $decl declarations," \
    "$(python3 -c "print(round($(stat -c %s "$f") / max($ev, 1), 1))") bytes per event" | tee -a "$OUT/sites-summary.txt"
done
grep -c "leaks\|error\|warn" "$T/stderr" | sed 's/^/stderr warn\/error lines: /' >>"$OUT/sites-summary.txt"
tail -n 20 "$T/stderr" >>"$OUT/sites-summary.txt"
if "$LAUNCHER" report --help >/dev/null 2>&1 && [[ -f $T/traceall-0 ]]; then
  /usr/bin/time -f "report: %e s, %M KiB" "$LAUNCHER" report "$T/traceall-0" -o "$OUT/torch-report.html" \
    2>&1 | tee -a "$OUT/sites-summary.txt"
fi
# The leak report of one run, as the program's user sees it.
env PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD="$LIB" GPUPOOL_SITES=all GPUPOOL_LEAKS=1 \
  GPUPOOL_STATS_FILE="$OUT/torch-leaks.txt" timeout 120 python3 scripts/gpu_torch.py --model cnn \
  --batch 64 --steps 10 --infer-iters 2 --tag leaks >/dev/null 2>&1
head -c 6000 "$OUT/torch-leaks.txt" >"$T/l" && mv "$T/l" "$OUT/torch-leaks.txt"
