#!/usr/bin/env python3
"""CuPy array workload for gpupool's GPU verification.

--pool none: cupy.cuda.set_allocator(None) and set_pinned_memory_allocator(None),
  so every array is a cudaMalloc/cudaFree and every pinned buffer a
  cudaHostAlloc/cudaFreeHost (run without and under LD_PRELOAD=libgpupool.so);
--pool cupy: CuPy's own device and pinned memory pools, for comparison.

The workload makes many temporaries (elementwise chains, a matrix product, a
reduction) and moves data through freshly allocated pinned buffers each
iteration. Prints one final line
  RESULT {"tag": ..., "checksum": ..., "iter_ms_median": ..., ...}
and the checksum must be identical in every mode.
"""
import argparse
import hashlib
import json
import statistics
import sys
import time

import numpy as np
import cupy as cp
import cupyx


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="run")
    ap.add_argument("--pool", choices=("none", "cupy"), default="none")
    ap.add_argument("--iters", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--n", type=int, default=1024)
    args = ap.parse_args()

    if args.pool == "none":
        cp.cuda.set_allocator(None)
        cp.cuda.set_pinned_memory_allocator(None)

    n = args.n
    rng = np.random.default_rng(7)
    x = cp.asarray(rng.standard_normal((n, n), dtype=np.float32))
    w = cp.asarray(rng.standard_normal((n, n), dtype=np.float32) / np.float32(np.sqrt(n)))
    stream = cp.cuda.Stream(non_blocking=True)
    dev = cp.cuda.Device()
    dev.synchronize()

    iter_ms = []
    sums = []
    t_all = time.perf_counter()
    for i in range(args.iters):
        t0 = time.perf_counter()
        y = cp.sin(x) * 1.5 + cp.cos(x * 0.5) ** 2 - x / 3.0   # ~6 temporaries
        z = cp.tanh(y @ w)                                     # cuBLAS product
        s = z.sum(axis=0)                                      # reduction
        x = x * 0.99 + s[None, :] * 1e-3
        # Pinned round trip through buffers allocated this iteration.
        h_out = cupyx.empty_pinned((n,), dtype=np.float32)
        s.get(out=h_out, stream=stream)
        stream.synchronize()
        h_in = cupyx.empty_pinned((n,), dtype=np.float32)
        h_in[:] = h_out * 0.5
        back = cp.empty((n,), dtype=np.float32)
        back.set(h_in, stream=stream)
        stream.synchronize()
        x[0, :] += back * 1e-3
        sums.append(float(h_out.sum(dtype=np.float64)))
        del y, z, s, h_out, h_in, back
        dev.synchronize()
        iter_ms.append((time.perf_counter() - t0) * 1e3)
    total_s = time.perf_counter() - t_all

    final = cp.asnumpy(x)
    res = {
        "tag": args.tag,
        "pool": args.pool,
        "cupy": cp.__version__,
        "checksum": hashlib.sha256(final.tobytes()).hexdigest(),
        "sums_sha256": hashlib.sha256(json.dumps([repr(v) for v in sums]).encode()).hexdigest(),
        "last_sum": repr(sums[-1]),
        "iter_ms_median": statistics.median(iter_ms[args.warmup:]),
        "iter_ms_mean": statistics.fmean(iter_ms[args.warmup:]),
        "total_s": total_s,
    }
    if args.pool == "cupy":
        # CuPy's pools never shrink unless asked: their totals at the end are
        # what they took from the driver at most.
        res["pool_total_bytes"] = cp.get_default_memory_pool().total_bytes()
        res["pool_used_bytes"] = cp.get_default_memory_pool().used_bytes()
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
