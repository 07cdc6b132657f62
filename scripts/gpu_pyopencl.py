#!/usr/bin/env python3
"""PyOpenCL array workload for gpupool's benchmarks (issue 4).

--alloc none: PyOpenCL's default allocator (a clCreateBuffer per array), run
  without and under LD_PRELOAD=libgpupool.so;
--alloc pool: PyOpenCL's own MemoryPool over an ImmediateAllocator.

Array expressions with many temporaries and a reduction per iteration. Prints
one final line
  RESULT {"tag": ..., "checksum": ..., "iter_ms_median": ..., ...}
whose checksum must be identical in every mode. Platform: the first with a
GPU (else the first), or the first whose name contains $GPU_CHECK_CL_PLATFORM.
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import time

import numpy as np
import pyopencl as cl
import pyopencl.array as cla
import pyopencl.clmath as clmath


def pick_device():
    want = os.environ.get("GPU_CHECK_CL_PLATFORM", "")
    plats = [p for p in cl.get_platforms() if want in p.name]
    for kind in (cl.device_type.GPU, cl.device_type.ALL):
        for p in plats:
            try:
                devs = p.get_devices(device_type=kind)
            except cl.Error:
                continue
            if devs:
                return p, devs[0]
    raise SystemExit("no OpenCL device")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="run")
    ap.add_argument("--alloc", choices=("none", "pool"), default="none")
    ap.add_argument("--iters", type=int, default=int(os.environ.get("GPU_PYOPENCL_ITERS", "200")))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--n", type=int, default=1 << 20)
    args = ap.parse_args()

    plat, dev = pick_device()
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    alloc = None
    if args.alloc == "pool":
        alloc = cl.tools.MemoryPool(cl.tools.ImmediateAllocator(queue))

    rng = np.random.default_rng(11)
    host = rng.standard_normal(args.n).astype(np.float32)
    x = cla.to_device(queue, host, allocator=alloc)
    sums, iter_ms = [], []
    t_all = time.perf_counter()
    for _ in range(args.iters):
        t0 = time.perf_counter()
        y = clmath.sin(x) * 1.5 + clmath.cos(x * 0.5) ** 2 - x / 3.0  # ~7 temporaries
        s = cla.sum(y)                                               # reduction temporaries
        x = x * 0.99 + y * 1e-3
        sums.append(repr(float(s.get())))
        queue.finish()
        iter_ms.append((time.perf_counter() - t0) * 1e3)
    total_s = time.perf_counter() - t_all
    final = x.get()
    # The host cost of one temporary alone: create an array and drop it
    # (no kernel), best of 5 batches.
    alloc_us = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(400):
            a = cla.empty(queue, args.n, np.float32, allocator=alloc)
            del a
        alloc_us.append((time.perf_counter() - t0) / 400 * 1e6)
    res = {
        "tag": args.tag,
        "alloc": args.alloc,
        "platform": plat.name,
        "device": dev.name,
        "pyopencl": cl.VERSION_TEXT,
        "checksum": hashlib.sha256(final.tobytes()).hexdigest(),
        "sums_sha256": hashlib.sha256(json.dumps(sums).encode()).hexdigest(),
        "last_sum": sums[-1],
        "iter_ms_median": statistics.median(iter_ms[args.warmup:]),
        "iter_ms_mean": statistics.fmean(iter_ms[args.warmup:]),
        "total_s": total_s,
        "array_alloc_us": min(alloc_us),
    }
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
