#!/usr/bin/python3
"""PyOpenCL array workload: no pool vs PyOpenCL's own MemoryPool vs gpupool.

Each run is a separate process doing repeated elementwise expressions on
pyopencl.array.Array objects; every operation allocates a temporary.
  none     - plain PyOpenCL, every temporary is a clCreateBuffer
  pyopencl - allocator=pyopencl.tools.MemoryPool(ImmediateAllocator(queue))
  gpupool  - plain PyOpenCL (unmodified) with LD_PRELOAD=libgpupool.so

Prints per-mode median time and the acceptance check: gpupool within 1.1x of
PyOpenCL's pool and faster than no pool.
  scripts/bench_pyopencl.py [--lib build/libgpupool.so] [--size 65536]
                            [--iters 400] [--repeat 5] [--json FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODES = ("none", "pyopencl", "gpupool")


def child(mode, size, iters):
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla
    import pyopencl.tools as clt

    platforms = cl.get_platforms()
    want = os.environ.get("CLTEST_PLATFORM", "")
    dev = [d for p in platforms if want in p.name for d in p.get_devices()][0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx)
    alloc = None
    if mode == "pyopencl":
        alloc = clt.MemoryPool(clt.ImmediateAllocator(q))
    rng = np.random.default_rng(3)
    a = cla.to_device(q, rng.random(size, dtype=np.float32) + 1, allocator=alloc)
    b = cla.to_device(q, rng.random(size, dtype=np.float32), allocator=alloc)
    c = cla.zeros(q, size, np.float32, allocator=alloc)

    def step(c):
        # five temporaries per step
        return (a * 2 + b) * a - b / 3 + c * np.float32(0.5)

    for _ in range(20):  # compile the kernels, warm everything
        c = step(c)
    q.finish()
    t0 = time.perf_counter()
    for _ in range(iters):
        c = step(c)
    q.finish()
    t = time.perf_counter() - t0
    checksum = float(c.get().sum(dtype=np.float64))
    print(json.dumps({"mode": mode, "seconds": t, "checksum": checksum}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build", "libgpupool.so"))
    ap.add_argument("--size", type=int, default=65536, help="elements per array (float32)")
    ap.add_argument("--iters", type=int, default=400)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.size, args.iters)
        return 0

    lib = os.path.abspath(args.lib)
    if not os.path.exists(lib):
        print(f"no {lib}: build gpupool first (cmake -B build && cmake --build build)", file=sys.stderr)
        return 2
    times = {m: [] for m in MODES}
    checksums = {}
    for r in range(args.repeat):
        for mode in MODES:  # interleaved, so drift hits every mode alike
            env = dict(os.environ)
            env.pop("LD_PRELOAD", None)
            if mode == "gpupool":
                env["LD_PRELOAD"] = lib
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--child", mode, "--size", str(args.size),
                 "--iters", str(args.iters)],
                env=env, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{mode} run failed:\n{out.stderr}", file=sys.stderr)
                return 1
            res = json.loads(out.stdout.strip().splitlines()[-1])
            times[mode].append(res["seconds"])
            checksums.setdefault(mode, res["checksum"])
    med = {m: statistics.median(v) for m, v in times.items()}
    per_op = 5 * args.iters
    print(f"PyOpenCL array workload: {args.iters} steps x 5 temporaries of {args.size} float32 "
          f"({args.size * 4 // 1024} KiB), median of {args.repeat} runs each")
    for m in MODES:
        print(f"  {m:9s} {med[m] * 1e3:9.1f} ms   {med[m] / per_op * 1e6:8.1f} us/op   "
              f"runs: {' '.join(f'{t * 1e3:.0f}' for t in times[m])}")
    ratio_pool = med["gpupool"] / med["pyopencl"]
    ratio_none = med["gpupool"] / med["none"]
    same = len(set(checksums.values())) == 1
    print(f"  gpupool / pyopencl MemoryPool = {ratio_pool:.3f} (acceptance <= 1.10)")
    print(f"  gpupool / no pool             = {ratio_none:.3f} (acceptance < 1)")
    print(f"  identical results: {same}")
    ok = ratio_pool <= 1.10 and ratio_none < 1 and same
    print("  PASS" if ok else "  FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": args.size, "iters": args.iters, "repeat": args.repeat, "times": times,
                       "median": med, "ratio_pool": ratio_pool, "ratio_none": ratio_none,
                       "identical": same, "pass": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
