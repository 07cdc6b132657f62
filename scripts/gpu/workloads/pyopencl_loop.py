#!/usr/bin/env python3
"""PyOpenCL array workload for gpupool's benchmarks.

--alloc none: PyOpenCL's default allocator (a clCreateBuffer per array), run
  without and under LD_PRELOAD=libgpupool.so;
--alloc pool: PyOpenCL's own MemoryPool over an ImmediateAllocator;
--alloc both: the two in one process (under gpupool: gpupool serves the
  default allocator's arrays, MemoryPool its own), in alternating phases.

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


class Chain:
    """One allocator's run of the workload: its own arrays, sums and times."""

    def __init__(self, queue, host, alloc):
        self.queue, self.alloc = queue, alloc
        self.x = cla.to_device(queue, host, allocator=alloc)
        self.sums, self.iter_ms = [], []

    def run(self, iters):
        queue, x = self.queue, self.x
        for _ in range(iters):
            t0 = time.perf_counter()
            y = clmath.sin(x) * 1.5 + clmath.cos(x * 0.5) ** 2 - x / 3.0  # ~7 temporaries
            s = cla.sum(y)                                               # reduction temporaries
            x = x * 0.99 + y * 1e-3
            self.sums.append(repr(float(s.get())))
            queue.finish()
            self.iter_ms.append((time.perf_counter() - t0) * 1e3)
        self.x = x

    def alloc_us(self, n):
        """The host cost of one temporary alone: create an array and drop it
        (no kernel), best of 5 batches of 400."""
        best = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(400):
                a = cla.empty(self.queue, n, np.float32, allocator=self.alloc)
                del a
            best.append((time.perf_counter() - t0) / 400 * 1e6)
        return min(best)

    def result(self, warmup):
        final = self.x.get()
        return {
            "checksum": hashlib.sha256(final.tobytes()).hexdigest(),
            "sums_sha256": hashlib.sha256(json.dumps(self.sums).encode()).hexdigest(),
            "last_sum": self.sums[-1],
            "iter_ms_median": statistics.median(self.iter_ms[warmup:]),
            "iter_ms_mean": statistics.fmean(self.iter_ms[warmup:]),
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="run")
    ap.add_argument("--alloc", choices=("none", "pool", "both"), default="none",
                    help="both: the two allocators in one process, in alternating phases")
    ap.add_argument("--iters", type=int, default=int(os.environ.get("GPU_PYOPENCL_ITERS", "200")))
    ap.add_argument("--phase", type=int, default=100, help="iterations per phase with --alloc both")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--n", type=int, default=1 << 20)
    args = ap.parse_args()

    plat, dev = pick_device()
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    rng = np.random.default_rng(11)
    host = rng.standard_normal(args.n).astype(np.float32)
    res = {"tag": args.tag, "alloc": args.alloc, "platform": plat.name, "device": dev.name,
           "pyopencl": cl.VERSION_TEXT}

    if args.alloc != "both":
        alloc = None
        if args.alloc == "pool":
            alloc = cl.tools.MemoryPool(cl.tools.ImmediateAllocator(queue))
        chain = Chain(queue, host, alloc)
        t_all = time.perf_counter()
        chain.run(args.iters)
        res["total_s"] = time.perf_counter() - t_all
        res.update(chain.result(args.warmup))
        res["array_alloc_us"] = chain.alloc_us(args.n)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    # Both in one process: a process's host speed varied by up to 2.5x
    # (11-28 us per temporary) between identical runs on the GPU machine,
    # so runs in separate processes compare hosts as much as allocators.
    # Each chain computes exactly what a single-allocator run computes.
    chains = {"none": Chain(queue, host, None),
              "pool": Chain(queue, host, cl.tools.MemoryPool(cl.tools.ImmediateAllocator(queue)))}
    for c in chains.values():  # compile the kernels, fill both pools
        c.run(args.warmup)
    ratios = []
    done = args.warmup
    k = 0
    while done < args.iters:
        n = min(args.phase, args.iters - done)
        order = ("none", "pool") if k % 2 == 0 else ("pool", "none")
        for m in order:
            chains[m].run(n)
        ratios.append(statistics.median(chains["none"].iter_ms[-n:]) /
                      statistics.median(chains["pool"].iter_ms[-n:]))
        done += n
        k += 1
    for m, c in chains.items():
        res[m] = c.result(args.warmup)
        res[m]["array_alloc_us"] = c.alloc_us(args.n)
    res["phase_ratios"] = ratios
    res["ratio_median"] = statistics.median(ratios)
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
