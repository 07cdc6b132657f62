#!/usr/bin/env python3
"""Should held memory be released after an idle time by default? Both sides,
measured on a real GPU (docs/sharing.md, "Sharing a GPU").

What it costs the program: after an idle release, the program's next
allocations of that memory go to the driver again. Timed here without
gpupool (so every call is the driver's), as block sizes programs use:
1 GiB device blocks, 2 MiB device blocks, 64 MiB pinned host blocks.

What it gives the others: a process that sizes itself from cuMemGetInfo at
start (TensorFlow's default, vLLM's gpu_memory_utilization check), beside a
holder under gpupool that freed HOLD_GIB GiB and went idle. The pressure
watch cannot help it (free memory never falls: it allocates what it was
shown). Shown: its free memory 1 s after the holder went idle and
AFTER+2 s after, with GPUPOOL_RELEASE_AFTER off and set to AFTER.

usage: idle_release.py LIBGPUPOOL NEIGHBOUR_PROGRAM [--hold-gib 40] [--after 5] [--rounds 3]
NEIGHBOUR_PROGRAM is tests/cuda/neighbour.c built against the real libcuda.
"""
import argparse
import os
import re
import statistics
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("neighbour")
ap.add_argument("--hold-gib", type=int, default=40)
ap.add_argument("--after", type=float, default=5)
ap.add_argument("--rounds", type=int, default=3)
a = ap.parse_args()
LIB = os.path.abspath(a.lib)
GIB = 1 << 30


def env(pooled, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "LD_PRELOAD"}
    if pooled:
        e["LD_PRELOAD"] = LIB
    e.update({k: str(v) for k, v in extra.items()})
    return e


def grab_ms(block_mib, count, host=False):
    """Sum of the driver's allocation times for `count` blocks, in ms."""
    cmd = [a.neighbour, "grab", str(block_mib), "0", str(count)] + (["host"] if host else [])
    r = subprocess.run(cmd, env=env(False), capture_output=True, text=True, timeout=300)
    us = [float(m) for m in re.findall(r"^block \d+ ([0-9.]+)", r.stdout, re.M)]
    if len(us) != count:
        raise RuntimeError(f"{cmd}: {r.returncode} {r.stdout[-300:]} {r.stderr[-300:]}")
    return sum(us) / 1000


print("## What an idle release costs the program: its next allocations go to the driver")
print(f"(no gpupool: every call is the driver's; median of {a.rounds} rounds, min-max)\n")
print("| blocks | driver time to allocate them again |")
print("|---|---|")
for label, mib, count, host in ((f"{a.hold_gib} x 1 GiB device", 1024, a.hold_gib, False),
                                ("2000 x 2 MiB device", 2, 2000, False),
                                ("16 x 64 MiB pinned host", 64, 16, True)):
    t = [grab_ms(mib, count, host) for _ in range(a.rounds)]
    print(f"| {label} | {statistics.median(t):.1f} ms ({min(t):.1f}-{max(t):.1f}) |", flush=True)


def free_seen():
    r = subprocess.run([a.neighbour, "info"], env=env(False), capture_output=True, text=True,
                       timeout=60)
    m = re.search(r"free (\d+) total (\d+)", r.stdout)
    return int(m.group(1)) / GIB if m else float("nan")


print("\n## What it gives a process that sizes itself from cuMemGetInfo")
print(f"(holder under gpupool: {a.hold_gib} x 1 GiB allocated and freed, then idle; "
      "the other process without gpupool)\n")
print(f"| GPUPOOL_RELEASE_AFTER | free memory it sees 1 s after | {a.after + 2:g} s after |")
print("|---|---|---|")
for after in ("off", f"{a.after:g}s"):
    h = subprocess.Popen([a.neighbour, "hold", "1024", str(a.hold_gib)],
                         env=env(True, GPUPOOL_RELEASE_AFTER=after, GPUPOOL_LOG="info"),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    for line in h.stdout:
        if line.startswith("held"):
            break
    t0 = time.time()
    time.sleep(1)
    early = free_seen()
    time.sleep(max(0, t0 + a.after + 2 - time.time()))
    late = free_seen()
    h.stdin.write("exit\n")
    h.stdin.flush()
    h.communicate(timeout=60)
    print(f"| {after} | {early:.1f} GiB | {late:.1f} GiB |", flush=True)
