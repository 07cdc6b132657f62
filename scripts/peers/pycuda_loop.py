#!/usr/bin/env python3
"""PyCUDA's gpuarray loop that allocates per intermediate: issue 24, part 5.

Each step is  a = (a * b + c) * 2.0 - a  on float32 arrays of --n elements:
four temporaries a step (a*b, +c, *2.0, -a), and the old `a` is dropped
while the kernel that reads it may still be running. Modes:
  nopool   plain gpuarray: every temporary is cuMemAlloc / cuMemFree
  gpupool  the same code; run.sh starts it under LD_PRELOAD=libgpupool.so
  dmpool   PyCUDA's own pycuda.tools.DeviceMemoryPool (allocator=pool.allocate)
Each mode runs in its own process (run.sh interleaves them, round by round).

Timing: --warmup untimed steps (kernel compiles, pools filled), then
--blocks blocks of --block-steps steps; a block's time runs from a
synchronized start to a Context.synchronize() after its last step. The
median over blocks of the time per step is reported. Between blocks
(outside the timed region) `a` is copied back and its CRC-32 folded into
the checksum, which must be identical in every mode (b is in [0.05, 0.25],
so a stays bounded: |a*(2b - 1) + 2c| contracts).

Prints one line  RESULT pycuda_loop round=R mode=M median_step_ms=... checksum=...
A missing PyCUDA or GPU prints a SKIP line and exits 0.
"""
import argparse
import statistics
import sys
import time
import zlib


def gpupool_loaded():
    try:
        with open("/proc/self/maps") as f:
            return int("libgpupool" in f.read())
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # gpupool-immediate: gpupool with GPUPOOL_REUSE=immediate (run.sh sets it), the
    # single-stream reuse DeviceMemoryPool does, to tell the fence's share of any gap.
    ap.add_argument("--mode", choices=["nopool", "gpupool", "gpupool-immediate", "dmpool"],
                    required=True)
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--n", type=int, default=2 ** 20)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--block-steps", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()

    try:
        import numpy as np
        import pycuda
        import pycuda.driver as drv
        import pycuda.gpuarray as gpuarray
        from pycuda.tools import DeviceMemoryPool, make_default_context
    except Exception as e:  # noqa: BLE001 - any import failure is a skip
        print(f"SKIP pycuda_loop: cannot import pycuda ({type(e).__name__}: {e})")
        return 0
    try:
        drv.init()
        if drv.Device.count() < 1:
            print("SKIP pycuda_loop: no CUDA device")
            return 0
        ctx = make_default_context()
    except Exception as e:  # noqa: BLE001
        print(f"SKIP pycuda_loop: no CUDA context ({type(e).__name__}: {e})")
        return 0

    loaded = gpupool_loaded()
    if a.mode.startswith("gpupool") and not loaded:
        print("WARNING pycuda_loop: mode gpupool but libgpupool is not loaded (LD_PRELOAD?)")
    pool = None
    try:
        kw = {}
        if a.mode == "dmpool":
            pool = DeviceMemoryPool()
            kw["allocator"] = pool.allocate
        rng = np.random.default_rng(a.seed)
        a_d = gpuarray.to_gpu(rng.standard_normal(a.n, dtype=np.float32), **kw)
        b_d = gpuarray.to_gpu(rng.uniform(0.05, 0.25, a.n).astype(np.float32), **kw)
        c_d = gpuarray.to_gpu(rng.uniform(-1.0, 1.0, a.n).astype(np.float32), **kw)

        x = a_d
        del a_d
        for _ in range(a.warmup):
            x = (x * b_d + c_d) * 2.0 - x
        ctx.synchronize()

        crc = 0
        per_step = []
        for _ in range(a.blocks):
            ctx.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.block_steps):
                x = (x * b_d + c_d) * 2.0 - x
            ctx.synchronize()
            per_step.append((time.perf_counter() - t0) / a.block_steps)
            crc = zlib.crc32(x.get().tobytes(), crc)  # outside the timed region
        final = x.get()
        total = float(np.sum(final, dtype=np.float64))
        finite = bool(np.all(np.isfinite(final)))
        held = f" pool_held={pool.held_blocks} pool_active={pool.active_blocks}" if pool else ""
        print(f"RESULT pycuda_loop round={a.round} mode={a.mode} "
              f"median_step_ms={statistics.median(per_step) * 1e3:.4f} "
              f"min_step_ms={min(per_step) * 1e3:.4f} "
              f"steps={a.warmup + a.blocks * a.block_steps} n={a.n} "
              f"checksum={crc:08x} sum={total:.6e} finite={int(finite)}{held} "
              f"gpupool_loaded={loaded} pycuda={pycuda.VERSION_TEXT}")
        sys.stdout.flush()
        del x, b_d, c_d
        if pool is not None:
            pool.stop_holding()
        return 0
    finally:
        ctx.pop()
        ctx.detach()


if __name__ == "__main__":
    sys.exit(main())
