#!/usr/bin/env bash
# Stream-ordered allocations on a GPU, without and with gpupool managing the
# driver's memory pools (docs/guarantees.md), interleaved A B A B:
#   driver  a driver-API program on the default pool (cuMemAllocAsync /
#           cuMemFreeAsync, cuStreamSynchronize every step: threshold 0
#           gives the memory back at each one without gpupool);
#   torch   PyTorch, PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync, a small
#           training loop (PyTorch sets the threshold to UINT64_MAX itself);
#   cupy    CuPy with cupy.cuda.MemoryAsyncPool.
# Each run prints "RESULT name mode median_ms spread_ms checksum"; gpupool's
# exit stats go to OUTDIR/stats.NAME.ROUND.txt. Then, with gpupool: the
# driver program holds its pool's memory while `gpupool free-held PID` and,
# separately, an arriving neighbour (a second process allocating 90% of the
# GPU with cuMemAlloc) get it back.
#
# usage: LIB=/path/libgpupool.so [GPUPOOL=/path/gpupool] bash scripts/gpu/async_bench.sh OUTDIR [ROUNDS]
# Look for: identical checksums per workload; median "on" <= 1.05 x "off"
# (driver: faster); the stats' cuda-async rows with hits; "free-held: ok" and
# "neighbour: ok".
set -euo pipefail
OUT=${1:?usage: LIB=... bash $0 OUTDIR [ROUNDS]}
ROUNDS=${2:-5}
LIB=$(realpath "${LIB:?set LIB to libgpupool.so}")
GPUPOOL=${GPUPOOL:-$(dirname "$LIB")/gpupool}
CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
mkdir -p "$OUT"
cd "$OUT"

cat > steps.c <<'EOF'
/* steps [N [HOLD]]: N steps of 8 buffers (1..64 MiB) from the default pool,
   written by cuMemsetD32Async, read back, freed, stream synchronized. HOLD:
   then allocate HOLD MiB once, free it, say "held", wait for stdin. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define OK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, r_); exit(1); } } while (0)
static double ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 200, hold = argc > 2 ? atoi(argv[2]) : 0;
  CUdevice dev; CUcontext ctx; CUstream s;
  OK(cuInit(0)); OK(cuDeviceGet(&dev, 0)); OK(cuDevicePrimaryCtxRetain(&ctx, dev)); OK(cuCtxSetCurrent(ctx));
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  double* t = calloc(n, sizeof *t); unsigned long long sum = 0; unsigned v;
  for (int i = 0; i < n; ++i) {
    double t0 = ms(); CUdeviceptr p[8];
    for (int k = 0; k < 8; ++k) {
      size_t bytes = (size_t)1 << (20 + k % 7);
      OK(cuMemAllocAsync(&p[k], bytes, s));
      OK(cuMemsetD32Async(p[k], i * 8 + k, bytes / 4, s));
      OK(cuMemcpyDtoHAsync(&v, p[k] + bytes - 4, 4, s));
    }
    for (int k = 0; k < 8; ++k) OK(cuMemFreeAsync(p[k], s));
    OK(cuStreamSynchronize(s)); sum = sum * 31 + v; t[i] = ms() - t0;
  }
  qsort(t + 10, n - 10, sizeof *t, cmp);
  int m = n - 10; printf("steps %.4f %.4f %llu\n", t[10 + m / 2], t[10 + m * 9 / 10] - t[10 + m / 10], sum);
  if (hold) {
    CUdeviceptr p; OK(cuMemAllocAsync(&p, (size_t)hold << 20, s)); OK(cuMemFreeAsync(p, s)); OK(cuStreamSynchronize(s));
    printf("held\n"); fflush(stdout); getchar();
  }
  return 0;
}
EOF
cat > grab.c <<'EOF'
/* grab PERCENT: cuMemAlloc PERCENT% of the GPU's total, trying for up to 10 s
   (the holder notices the arrival meanwhile): "grab ok after <ms>" or "grab <CUresult>". */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char** argv) {
  CUdevice dev; CUcontext ctx; CUdeviceptr p; size_t total; CUresult r = CUDA_SUCCESS;
  cuInit(0); cuDeviceGet(&dev, 0); cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx);
  cuDeviceTotalMem(&total, dev);
  for (int i = 0; i < 100; ++i, usleep(100000))
    if ((r = cuMemAlloc(&p, total / 100 * atoi(argv[1]))) == CUDA_SUCCESS) { printf("grab ok after %d ms\n", i * 100); return 0; }
  printf("grab %d\n", r);
  return 0;
}
EOF
cc -O2 -I"$CUDA_INC" steps.c -o steps -lcuda
cc -O2 -I"$CUDA_INC" grab.c -o grab -lcuda

cat > torch_async.py <<'EOF'
import hashlib, statistics, time, torch, torch.nn as nn
torch.manual_seed(0); torch.backends.cudnn.deterministic = True; torch.backends.cuda.matmul.allow_tf32 = False
m = nn.Sequential(nn.Flatten(), nn.Linear(3072, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(m.parameters(), lr=0.01); g = torch.Generator(device="cuda").manual_seed(1)
t, losses = [], []
for i in range(300):
    t0 = time.perf_counter()
    x = torch.randn(256, 3, 32, 32, device="cuda", generator=g); y = torch.randint(0, 10, (256,), device="cuda", generator=g)
    loss = nn.functional.cross_entropy(m(x), y); opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    losses.append(loss.item()); t.append((time.perf_counter() - t0) * 1e3)
t = sorted(t[20:]); q = len(t) // 10
print("torch %.4f %.4f %s" % (statistics.median(t), t[-q] - t[q], hashlib.sha256(repr(losses).encode()).hexdigest()[:16]))
EOF
cat > cupy_async.py <<'EOF'
import hashlib, statistics, time, numpy as np, cupy as cp
cp.cuda.set_allocator(cp.cuda.MemoryAsyncPool().malloc)
rng = np.random.default_rng(7); x = cp.asarray(rng.standard_normal((1024, 1024), dtype=np.float32))
s = cp.cuda.Stream(non_blocking=True); t, sums = [], []
with s:
    for i in range(300):
        t0 = time.perf_counter()
        y = cp.tanh(x * (1 + i % 7) + 0.5) @ x.T; z = (y - y.mean()) / (y.std() + 1)
        sums.append(float(z.sum())); s.synchronize(); t.append((time.perf_counter() - t0) * 1e3)
t = sorted(t[20:]); q = len(t) // 10
print("cupy %.4f %.4f %s" % (statistics.median(t), t[-q] - t[q], hashlib.sha256(repr(sums).encode()).hexdigest()[:16]))
EOF

run() {  # name round mode command...
  local name=$1 round=$2 mode=$3; shift 3
  local env=(env)
  [ "$name" = torch ] && env+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)
  [ "$mode" = on ] && env+=(LD_PRELOAD="$LIB" GPUPOOL_STATS_AT_EXIT=1 GPUPOOL_STATS_FILE="$PWD/stats.$name.$round.txt")
  echo "RESULT $name $mode $("${env[@]}" "$@" | tail -1 | cut -d' ' -f2-)"
}
for r in $(seq "$ROUNDS"); do
  for mode in off on; do
    run driver "$r" "$mode" ./steps 200
    run torch "$r" "$mode" python3 torch_async.py
    run cupy "$r" "$mode" python3 cupy_async.py
  done
done | tee results.txt
echo "medians (off on, ms) and checksums:"
for w in driver torch cupy; do
  for mode in off on; do
    awk -v w=$w -v m=$mode '$2==w && $3==m {print $4}' results.txt | sort -n | awk -v w=$w -v m=$mode '{a[NR]=$1} END {printf "%s %s median %.4f\n", w, m, a[int((NR+1)/2)]}'
  done
  echo "$w checksums: $(awk -v w=$w '$2==w {print $6}' results.txt | sort -u | tr '\n' ' ')"
done

# Held memory given back: free-held, then an arriving neighbour.
hold_check() {  # what: free-held | neighbour
  local total_mib; total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0)
  coproc H { exec env LD_PRELOAD="$LIB" GPUPOOL_STATS_AT_EXIT=1 GPUPOOL_STATS_FILE="$PWD/stats.hold.$1.txt" ./steps 20 $((total_mib * 60 / 100)); }
  local line; read -r line <&"${H[0]}"; read -r line <&"${H[0]}"
  [ "$line" = held ] || { echo "$1: holder said '$line'"; return; }
  sleep 2
  held() { "$GPUPOOL" stats "$H_PID" --json | python3 -c 'import json,sys; print(sum(a["stats"]["held_bytes"] for a in json.load(sys.stdin)["arenas"] if a["kind"] == "cuda-async"))'; }
  local before after; before=$(held)
  if [ "$1" = free-held ]; then
    "$GPUPOOL" free-held "$H_PID"; sleep 1; after=$(held)
    echo "free-held: held $before -> $after bytes: $([ "$before" -gt 0 ] && [ "$after" = 0 ] && echo ok || echo FAIL)"
  else
    local got; got=$(./grab 60)  # not gpupool's: only the holder's release makes room
    echo "neighbour: held $before bytes; $got: $([[ $got == "grab ok"* ]] && echo ok || echo FAIL)"
  fi
  echo >&"${H[1]}"; wait "$H_PID" || true
}
hold_check free-held
hold_check neighbour
