#!/usr/bin/env python3
"""What joining the node registry costs at start-up, with many processes at once.

Starts N copies of `NEIGHBOUR hold 1 1` (allocate one 1 MiB block, free it,
wait) under gpupool at the same moment and measures the wall time until
every one has said "held" (so its GPU has been added to the registry and its
slot claimed), then lets them exit. Rounds alternate GPUPOOL_NEIGHBOURS=1 and
=0 (the registry not used at all), order swapped each round; the report is
the per-round ratio on/off, median and range.

  scripts/bench_join.py LIBGPUPOOL NEIGHBOUR [--procs 32] [--rounds 7]

On the stand-in driver set LD_LIBRARY_PATH to its directory and STANDIN_SHARED
to a file; on a GPU machine NEIGHBOUR is tests/cuda/neighbour.c built with -lcuda.
"""
import argparse
import os
import selectors
import statistics
import subprocess
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("neighbour")
ap.add_argument("--procs", type=int, default=32)
ap.add_argument("--rounds", type=int, default=7)
a = ap.parse_args()
registry = os.path.join(tempfile.mkdtemp(prefix="gpupool-join-"), "registry")


def one(neighbours):
    env = dict(os.environ, LD_PRELOAD=os.path.abspath(a.lib), GPUPOOL_NEIGHBOURS=str(neighbours),
               GPUPOOL_REGISTRY=registry)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([a.neighbour, "hold", "1", "1"], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(a.procs)]
    for p in procs:
        for line in p.stdout:
            if line.startswith("held"):
                break
    took = time.perf_counter() - t0
    for p in procs:
        p.stdin.write("exit\n")
        p.stdin.flush()
    for p in procs:
        p.communicate(timeout=60)
    return took


on, off = [], []
for r in range(a.rounds):
    order = (1, 0) if r % 2 == 0 else (0, 1)
    got = {n: one(n) for n in order}
    on.append(got[1])
    off.append(got[0])
    print(f"round {r + 1}: registry {got[1] * 1000:.1f} ms, none {got[0] * 1000:.1f} ms, "
          f"ratio {got[1] / got[0]:.3f}", flush=True)
ratios = [x / y for x, y in zip(on, off)]
print(f"\n{a.procs} processes at once, {a.rounds} rounds: until all held, registry "
      f"{statistics.median(on) * 1000:.1f} ms vs none {statistics.median(off) * 1000:.1f} ms "
      f"(medians); ratio median {statistics.median(ratios):.3f}, range "
      f"{min(ratios):.3f}-{max(ratios):.3f}")
