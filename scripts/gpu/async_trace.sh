#!/usr/bin/env bash
# Stream-ordered allocations in gpupool's trace on a GPU (docs/trace.md, the
# letter `d`): CuPy's MemoryAsyncPool, a loop of 50 steps that allocates 1,
# 3 and 5 MiB and frees them, then one 7 MiB array kept until exit (the
# leak), under `gpupool run --trace` with sites, then `gpupool report
# --text`.
#
# usage: GPUPOOL=/path/build/bin/gpupool bash scripts/gpu/async_trace.sh OUTDIR
# (the launcher preloads the libgpupool.so next to it)
# Look for (the script checks them and prints "async trace: ok"):
#   - at least 150 records `a ... d` on arenas of kind cuda-async (CuPy may
#     allocate more: its own small buffers), as many `f` but one, and no
#     `a ... h|m` on those arenas;
#   - `gpupool report --text`: "N stream-ordered, served by the driver's
#     memory pools" in the summary, and under "Still held at the end" a row
#     of 7.0 MiB whose stack names async_trace_leak.py;
#   - the stats' leak report (GPUPOOL_LEAKS) listing 7.0 MiB in 1 block.
set -euo pipefail
OUT=${1:?usage: GPUPOOL=... bash $0 OUTDIR}
GPUPOOL=$(realpath "${GPUPOOL:?set GPUPOOL to the gpupool launcher}")
mkdir -p "$OUT"
cd "$OUT"
cat > async_trace_leak.py <<'PY'
import cupy as cp
cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
s = 0.0
for i in range(50):
    a = cp.full(1 << 18, i, dtype=cp.float32)          # 1 MiB
    b = cp.ones(3 << 18, dtype=cp.float32)             # 3 MiB
    c = cp.ones(5 << 18, dtype=cp.float32)             # 5 MiB
    s += float(a.sum() + b.sum() + c.sum())
    del a, b, c
kept = cp.zeros(7 << 18, dtype=cp.float32)             # 7 MiB, never freed:
# a reference nothing gives back, or Python's finalization would free it
# (module globals and cycles are freed at exit: the first run on the H200
# saw 551 frees of 551).
import ctypes
ctypes.pythonapi.Py_IncRef(ctypes.py_object(kept))
cp.cuda.Device().synchronize()
print("checksum", s)
PY
rm -f trace.txt stats.txt
"$GPUPOOL" run --trace trace.txt --set GPUPOOL_SITES=all --set GPUPOOL_LEAKS=1 \
  --stats --stats-file stats.txt -- python3 async_trace_leak.py
"$GPUPOOL" report --text trace.txt > report.txt
cat report.txt
python3 - <<'PY'
import re, sys
arenas, d, hm, frees = {}, 0, 0, 0
for line in open("trace.txt"):
    w = line.split()
    if w[:1] == ["arena"]:
        arenas[w[1]] = w[2]
    elif w[:1] == ["a"] and arenas.get(w[3]) == "cuda-async":
        d += w[7] == "d"; hm += w[7] != "d"
    elif w[:1] == ["f"] and arenas.get(w[3]) == "cuda-async":
        frees += 1
# The text is wrapped at 100 columns: continuation lines joined.
rep = re.sub(r"\n\s+", " ", open("report.txt").read())
stats = re.sub(r"\n\s+", " ", open("stats.txt").read())
print(f"cuda-async: {d} allocations (d), {hm} h|m, {frees} frees")
checks = {
    "records": d >= 150 and hm == 0 and frees == d - 1,
    "summary": "stream-ordered, served by the driver's memory pools" in rep,
    "still held": bool(re.search(r"Still held at the end \(7\.0 MiB in 1 block\)", rep)),
    "leak report": bool(re.search(r"leaks: pid \d+: 1 block \(7\.0 MiB\)", stats)),
}
for name, good in checks.items():
    if not good:
        print("FAILED:", name)
if not checks["leak report"]:
    print(stats[-2000:])
ok = all(checks.values())
print("async trace:", "ok" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
