#!/usr/bin/env python3
"""An arriving neighbour on a real GPU (issue 25; docs/sharing.md).

A holder (tests/cuda/neighbour.c "hold") allocates HOLD_GIB blocks of 1 GiB,
frees them and stays idle; IDLE seconds later (--idle, 1.5) a program without gpupool starts and
takes memory at once. Each case runs beside a holder without gpupool (the
reference) and beside one under gpupool, in this one call.

  arrival.py LIBGPUPOOL NEIGHBOUR_PROGRAM [--hold-gib 60] [--cases c,torch,...]

Cases:
  c          C program, 1 GiB blocks in one burst right after its context
  c-load     the same after 300 ms (a program that loads before it allocates)
  torch      PyTorch (caching allocator on), 1 GiB tensors in one burst
  memgetinfo PyTorch sizes itself from cudaMemGetInfo 1 s after its context
  jax        JAX with its default preallocation: what XLA took
  loop       the holder itself busy (PyTorch, caching off, under gpupool) when
             a C program arrives: its step time before / during / after
  release    how long the holder takes to give back HOLD_GIB x 1 GiB and
             2000 x 2 MiB (its log line)
Prints one markdown table row per case.
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
ap.add_argument("--hold-gib", type=int, default=60)
ap.add_argument("--cases", default="c,c-load,torch,memgetinfo,jax,loop,release")
ap.add_argument("--idle", type=float, default=1.5)
a = ap.parse_args()
LIB = os.path.realpath(a.lib)
GIB = 1 << 30

TORCH_BURST = r"""
import sys, torch
torch.cuda.init(); torch.empty(1, device="cuda")
xs = []
try:
    while True:
        xs.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
print(f"got {len(xs)} blocks {len(xs) << 30} bytes", flush=True)
"""
TORCH_MEMGETINFO = r"""
import time, torch
torch.empty(1, device="cuda"); time.sleep(1.0)
free, total = torch.cuda.mem_get_info()
n = free // (1 << 30) - 1
x = torch.empty(n << 30, dtype=torch.uint8, device="cuda")
print(f"saw free {free >> 20} MiB; got {n} blocks {n << 30} bytes", flush=True)
"""
JAX_PREALLOC = r"""
import jax, jax.numpy as jnp
x = jnp.ones(16); x.block_until_ready()
s = jax.devices()[0].memory_stats() or {}
print(f"got 0 blocks {s.get('bytes_limit', 0)} bytes", flush=True)
"""
TORCH_LOOP = r"""
import sys, time, torch
t_end = time.time() + float(sys.argv[1])
torch.empty(1, device="cuda")
print("started", flush=True)
t_end = time.time() + float(sys.argv[1])
out = []
bad = 0
while time.time() < t_end:
    t0 = time.time()
    xs = [torch.empty(256 << 20, dtype=torch.uint8, device="cuda") for _ in range(8)]
    for x in xs: x.fill_(1)
    s = sum(int(x.sum(dtype=torch.int64)) for x in xs)
    bad += s != 8 * (256 << 20)
    del xs
    torch.cuda.synchronize()
    out.append((t0, time.time() - t0))
for t0, dt in out: print(f"step {t0:.4f} {dt * 1e3:.3f}")
print(f"wrong sums {bad}")
"""


def env(pooled, **extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "LD_PRELOAD"}
    e["GPUPOOL_LOG"] = "info"
    if pooled:
        e["LD_PRELOAD"] = LIB
    e.update({k: str(v) for k, v in extra.items()})
    return e


def holder(pooled, mib=1024, count=None, **extra):
    p = subprocess.Popen([a.neighbour, "hold", str(mib), str(count or a.hold_gib)],
                         env=env(pooled, **extra), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stdout:
        if line.startswith("held"):
            break
    return p


def finish(p):
    try:
        p.stdin.write("exit\n")
        p.stdin.flush()
    except BrokenPipeError:
        pass
    return p.communicate(timeout=120)[1]


def newcomer(case):
    if case == "c":
        return [a.neighbour, "grab", "1024"], {}
    if case == "c-load":
        return [a.neighbour, "grab", "1024"], {"NEIGHBOUR_START_DELAY_MS": 300}
    if case == "torch":
        return [sys.executable, "-c", TORCH_BURST], {}
    if case == "memgetinfo":
        return [sys.executable, "-c", TORCH_MEMGETINFO], {}
    if case == "jax":
        return [sys.executable, "-c", JAX_PREALLOC], {}
    raise ValueError(case)


def side_by_side(case):
    got = {}
    notes = []
    for pooled in (False, True):
        h = holder(pooled)
        time.sleep(a.idle)  # idle past GPUPOOL_ARRIVAL_IDLE or not
        cmd, extra = newcomer(case)
        t0 = time.time()
        r = subprocess.run(cmd, env=env(False, **extra), capture_output=True, text=True, timeout=240)
        took = time.time() - t0
        herr = finish(h)
        m = re.search(r"got (\d+) blocks (\d+) bytes", r.stdout)
        got[pooled] = int(m.group(2)) / GIB if m else float("nan")
        if not m:
            notes.append(f"{'pooled' if pooled else 'plain'} holder: rc {r.returncode} {r.stderr[-300:]}")
        if pooled:
            rel = re.findall(r"arrived on the GPU: released (\d+) MiB \((\d+) blocks.*?in ([0-9.]+) ms", herr)
            notes.append(f"holder's release: {rel[:2]}; newcomer took {took:.2f} s; {r.stdout.strip()[:120]}")
    return got, notes


print(f"Holder: {a.hold_gib} x 1 GiB allocated, freed, idle {a.idle} s (cuda_neighbour hold).")
print("| newcomer (no gpupool) | beside a holder without gpupool | beside a holder under gpupool | ratio |")
print("|---|---|---|---|")
for case in a.cases.split(","):
    if case in ("c", "c-load", "torch", "memgetinfo", "jax"):
        got, notes = side_by_side(case)
        ratio = got[True] / got[False] if got[False] else float("nan")
        print(f"| {case} | {got[False]:.1f} GiB | {got[True]:.1f} GiB | {ratio:.3f} |", flush=True)
        for n in notes:
            print(f"  {n}", flush=True)
    elif case == "loop":
        # The holder busy: its loop runs 6 s; a C program arrives at 2 s and
        # takes 20 GiB, then exits.
        p = subprocess.Popen([sys.executable, "-c", TORCH_LOOP, "6"],
                             env=env(True, PYTORCH_NO_CUDA_MEMORY_CACHING=1), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        p.stdout.readline()  # "started": torch is up
        time.sleep(2.0)
        t_arrive = time.time()
        r = subprocess.run([a.neighbour, "grab", "1024", "0", "20"], env=env(False),
                           capture_output=True, text=True, timeout=60)
        t_left = time.time()
        out, err = p.communicate(timeout=60)
        steps = [tuple(map(float, l.split()[1:])) for l in out.splitlines() if l.startswith("step")]
        def med(sel):
            v = [dt for t0, dt in steps if sel(t0)]
            return f"{statistics.median(v):.2f} ms ({len(v)} steps)" if v else "-"
        m = re.search(r"got (\d+) blocks", r.stdout)
        print(f"| holder's own loop (PyTorch, caching off, 8 x 256 MiB a step) | before: "
              f"{med(lambda t: t < t_arrive)} | during: {med(lambda t: t_arrive <= t < t_left + 1)}, "
              f"after: {med(lambda t: t >= t_left + 1)} | newcomer got {m.group(1) if m else '?'} of 20 |",
              flush=True)
        said = re.findall(r"arrived on the GPU.*", err)[:2]
        wrong = re.findall(r"wrong sums \d+", out)
        print(f"  holder said: {said}; {wrong}", flush=True)
    elif case == "release":
        for mib, count in ((1024, a.hold_gib), (2, 2000)):
            h = holder(True, mib, count)
            time.sleep(1.5)
            r = subprocess.run([a.neighbour, "grab", "1024", "0", "1"], env=env(False),
                               capture_output=True, text=True, timeout=60)
            herr = finish(h)
            rel = re.findall(r"arrived on the GPU: released (\d+) MiB \((\d+) blocks.*?in ([0-9.]+) ms", herr)
            print(f"| release of {count} x {mib} MiB at an arrival | | {rel[:1]} | |", flush=True)
