#!/usr/bin/env python3
"""What preloading gpupool costs a process that never touches a GPU: the
time to exec and exit a small program with LD_PRELOAD set, against the same
program without it, interleaved (A B A B ...) so that both see the same host.

usage: scripts/bench_preload.py [--rounds N] LIB [LIB ...]
  Each LIB is preloaded in turn; "none" runs without LD_PRELOAD. Prints,
  per command, the median time per exec and the median of the per-round
  differences from "none" (with the 10th-90th percentile spread).
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
COMMANDS = [["/bin/true"], [PYTHON, "-c", "pass"], ["/bin/sh", "-c", "true"]]


def one(cmd, env):
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True)
    return time.perf_counter() - t0


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("GPUPOOL_")}
    modes = [("none", base)] + [(lib, dict(base, LD_PRELOAD=os.path.abspath(lib)))
                                for lib in a.libs if lib != "none"]
    for cmd in COMMANDS:
        rounds = a.rounds if cmd[0] != PYTHON else max(30, a.rounds // 5)
        times = {m: [] for m, _ in modes}
        for _ in range(3):  # warm the page cache
            for _, env in modes:
                one(cmd, env)
        for i in range(rounds):
            order = modes if i % 2 == 0 else list(reversed(modes))
            for m, env in order:
                times[m].append(one(cmd, env))
        print(f"{' '.join(cmd)} ({rounds} rounds)")
        for m, _ in modes:
            med = statistics.median(times[m]) * 1e3
            if m == "none":
                print(f"  {m:40s} {med:8.3f} ms")
                continue
            diff = [(x - y) * 1e3 for x, y in zip(times[m], times["none"])]
            print(f"  {m:40s} {med:8.3f} ms  +{statistics.median(diff):.3f} ms "
                  f"(p10 {pct(diff, 0.1):+.3f}, p90 {pct(diff, 0.9):+.3f})")


if __name__ == "__main__":
    main()
