#!/usr/bin/env python3
"""Sharing a GPU, measured on a real one (docs/sharing.md).

A holder allocates HOLD_GIB 1 GiB blocks, frees them and stays alive, idle;
a neighbour then allocates 1 GiB blocks until the driver says no. Each
neighbour kind runs twice in this one call, right after each other: holder
without gpupool (the reference: the neighbour gets the whole GPU) and holder
under gpupool. The ratio is what gpupool leaves the neighbour.

usage: neighbours.py LIBGPUPOOL NEIGHBOUR_PROGRAM [--hold-gib 40] [--rounds 2]
                         [--opencl-holder OPENCL_HOLD]

NEIGHBOUR_PROGRAM is tests/cuda/neighbour.c built against the real libcuda.
With --opencl-holder (tests/gpu/opencl_hold.c built against libOpenCL, the
OpenCL ICD set up in the environment) the holder is an OpenCL program that
released its buffers, and only the C neighbours run.
Prints a markdown table and the release latencies the neighbours under
gpupool saw (from their log lines).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("neighbour")
ap.add_argument("--hold-gib", type=int, default=40)
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--opencl-holder")
a = ap.parse_args()
LIB = os.path.abspath(a.lib)
GIB = 1 << 30

TORCH_GRAB = r"""
import sys, time, torch
interval = float(sys.argv[1]); xs = []
torch.cuda.init()
while True:
    try:
        xs.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if "out of memory" not in str(e).lower(): raise
        break
    if interval: time.sleep(interval)
print(f"got {len(xs)} blocks {len(xs) << 30} bytes err 2", flush=True)
"""
CUPY_GRAB = r"""
import sys, time, cupy
cupy.cuda.set_allocator(None)
interval = float(sys.argv[1]); xs = []
while True:
    try:
        xs.append(cupy.empty(1 << 30, dtype=cupy.uint8))
    except (cupy.cuda.memory.OutOfMemoryError, cupy.cuda.runtime.CUDARuntimeError) as e:
        if "memory" not in str(e).lower(): raise
        break
    if interval: time.sleep(interval)
print(f"got {len(xs)} blocks {len(xs) << 30} bytes err 2", flush=True)
"""
TORCH_EMPTY_CACHE = r"""
import subprocess, sys, os, torch
def used_mib():
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        pid, mem = [x.strip() for x in line.split(",")]
        if int(pid) == os.getpid(): return int(mem)
    return 0
x = torch.empty(10 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
del x; torch.cuda.empty_cache()
print(f"after-empty-cache {used_mib()}", flush=True)
sys.stdin.readline()
print(f"after-pressure {used_mib()}", flush=True)
sys.stdin.readline()
"""


def env(pooled, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "LD_PRELOAD"}
    e["GPUPOOL_LOG"] = "info"
    if pooled:
        e["LD_PRELOAD"] = LIB
    e.update({k: str(v) for k, v in extra.items()})
    return e


def holder(pooled):
    prog = [a.opencl_holder] if a.opencl_holder else [a.neighbour]
    p = subprocess.Popen(prog + ["hold", "1024", str(a.hold_gib)], env=env(pooled),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    for line in p.stdout:
        if line.startswith("held"):
            break
    time.sleep(0.3)  # published (the registry) within a control-thread round
    return p


def finish(p):
    try:
        p.stdin.write("exit\n")
        p.stdin.flush()
    except BrokenPipeError:
        pass
    return p.communicate(timeout=60)[1]


def neighbour_cmd(kind, interval):
    if kind == "c":
        return [a.neighbour, "grab", "1024", str(int(interval * 1000))]
    if kind == "torch":
        return [sys.executable, "-c", TORCH_GRAB, str(interval)]
    return [sys.executable, "-c", CUPY_GRAB, str(interval)]


latencies = []


def run(kind, pooled_neighbour, interval, extra):
    out = {}
    for holder_pooled in (False, True):
        h = holder(holder_pooled)
        e = env(pooled_neighbour, **extra)
        t0 = time.time()
        r = subprocess.run(neighbour_cmd(kind, interval), env=e, capture_output=True, text=True,
                           timeout=300)
        took = time.time() - t0
        herr = finish(h)
        m = re.search(r"got (\d+) blocks (\d+) bytes", r.stdout)
        got = int(m.group(2)) / GIB if m else float("nan")
        if holder_pooled:
            latencies.extend(float(x) for x in re.findall(r"released \d+ MiB in ([0-9.]+) ms", r.stderr))
        out[holder_pooled] = (got, took, r.returncode, r.stderr[-300:] if not m else "",
                              len(re.findall("GPUPOOL_PRESSURE_FREE", herr)))
    return out


CASES = [
    ("C program under gpupool", "c", True, 0, {"PYTORCH_NO_CUDA_MEMORY_CACHING": 1}),
    ("PyTorch, caching off, under gpupool", "torch", True, 0, {"PYTORCH_NO_CUDA_MEMORY_CACHING": 1}),
    ("CuPy, pools off, under gpupool", "cupy", True, 0, {}),
    ("C program, no gpupool, 1 GiB every 50 ms", "c", False, 0.05, {}),
    ("PyTorch caching allocator, no gpupool, 1 GiB every 50 ms", "torch", False, 0.05, {}),
    ("C program, no gpupool, one burst", "c", False, 0, {}),
]

if a.opencl_holder:
    CASES = [c for c in CASES if c[1] == "c"]
    uuid = subprocess.run([a.opencl_holder, "uuid"], capture_output=True, text=True).stdout.strip()
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip()
    print(f"OpenCL device: {uuid}; nvidia-smi -L: {smi}")
    print(f"Holder: {a.hold_gib} x 1 GiB OpenCL buffers created and released (opencl_hold hold).")
else:
    print(f"Holder: {a.hold_gib} x 1 GiB allocated and freed (C program, cuda_neighbour hold).")
print("| neighbour | holder without gpupool: neighbour got | holder under gpupool: neighbour got | ratio | rounds |")
print("|---|---|---|---|---|")
for name, kind, pooled, interval, extra in CASES:
    ratios, plain, pooled_got, notes = [], [], [], []
    for _ in range(a.rounds):
        o = run(kind, pooled, interval, extra)
        plain.append(o[False][0])
        pooled_got.append(o[True][0])
        ratios.append(o[True][0] / o[False][0] if o[False][0] else float("nan"))
        for k in (False, True):
            if o[k][3]:
                notes.append(o[k][3].replace("\n", " ")[:200])
    print(f"| {name} | {min(plain):.1f}-{max(plain):.1f} GiB | {min(pooled_got):.1f}-{max(pooled_got):.1f} GiB "
          f"| {min(ratios):.3f}-{max(ratios):.3f} | {a.rounds} |", flush=True)
    for n in notes[:2]:
        print(f"  note: {n}")

if latencies:
    s = sorted(latencies)
    p99 = s[min(len(s) - 1, int(round(0.99 * (len(s) - 1))))]
    print(f"\nRelease on request, as the neighbour saw it (ask to answer), {len(s)} releases: "
          f"p50 {statistics.median(s):.2f} ms, p99 {p99:.2f} ms, max {s[-1]:.2f} ms")

if a.opencl_holder:
    sys.exit(0)

# empty_cache under gpupool: what nvidia-smi shows for the process, before
# and after a plain neighbour needs the memory.
p = subprocess.Popen([sys.executable, "-c", TORCH_EMPTY_CACHE], env=env(True), stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
before = p.stdout.readline().split()
r = subprocess.run(neighbour_cmd("c", 0.05), env=env(False), capture_output=True, text=True, timeout=300)
p.stdin.write("\n")
p.stdin.flush()
after = p.stdout.readline().split()
p.stdin.write("\n")
p.stdin.flush()
p.communicate(timeout=60)
m = re.search(r"got (\d+) blocks", r.stdout)
print(f"\nPyTorch caching allocator under gpupool, 10 GiB tensor freed, empty_cache(): nvidia-smi shows "
      f"{before[-1] if before else '?'} MiB for it; after a plain neighbour took "
      f"{m.group(1) if m else '?'} GiB at 1 GiB every 50 ms: {after[-1] if after else '?'} MiB")
