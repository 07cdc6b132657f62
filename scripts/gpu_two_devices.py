#!/usr/bin/env python3
"""Sharing one of two GPUs (docs/sharing.md): processes name a GPU
by its UUID, whatever ordinal CUDA_VISIBLE_DEVICES gives it, and memory held
on one GPU is released only for that GPU.

The holder, under gpupool, allocates HOLD_GIB 1 GiB blocks on its device 1
and frees them. Then, each with CUDA_VISIBLE_DEVICES naming one GPU (so the
holder's device 1 is their device 0), a neighbour allocates 1 GiB blocks
until the driver says no: under gpupool (asks), and without (the watch, 1
GiB every 50 ms). After each: what the holder still holds (`gpupool ps`).
Expected: on the other GPU the neighbour gets it all and the holder keeps
everything; on the holder's GPU the neighbour gets it all too.

usage: gpu_two_devices.py LIBGPUPOOL NEIGHBOUR_PROGRAM LAUNCHER [--hold-gib 40]
"""
import argparse
import json
import os
import re
import subprocess
import time

ap = argparse.ArgumentParser()
ap.add_argument("lib")
ap.add_argument("neighbour")
ap.add_argument("launcher")
ap.add_argument("--hold-gib", type=int, default=40)
ap.add_argument("--logs", help="folder for each process's log (stderr)")
a = ap.parse_args()
LIB = os.path.abspath(a.lib)
GIB = 1 << 30


def env(pooled, **extra):
    e = {k: v for k, v in os.environ.items()
         if not k.startswith("GPUPOOL_") and k not in ("LD_PRELOAD", "CUDA_VISIBLE_DEVICES")}
    e["GPUPOOL_LOG"] = "info"
    if pooled:
        e["LD_PRELOAD"] = LIB
    e.update({k: str(v) for k, v in extra.items()})
    return e


try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout
    uuids = [line.split(", ")[1] for line in smi.splitlines() if ", " in line]
except OSError:
    uuids = []
uuids += ["?", "?"]
print(f"GPUs: {uuids}")


def held_on(pid):
    r = subprocess.run([a.launcher, "ps", "--json"], env=env(False), capture_output=True,
                       text=True, timeout=30)
    out = {}
    for p in json.loads(r.stdout)["processes"]:
        if p["pid"] == pid:
            for d in p["devices"]:
                out[d["uuid"]] = round(d["held_bytes"] / GIB, 1)
    return out


print("| neighbour | its GPU | neighbour got | holder's held after (GiB per GPU) |")
print("|---|---|---|---|")
for pooled, interval in ((True, 0), (False, 50)):
    for gpu in (0, 1):
        h = subprocess.Popen([a.neighbour, "hold", "1024", str(a.hold_gib)],
                             env=env(True, NEIGHBOUR_DEVICE=1), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for line in h.stdout:
            if line.startswith("held"):
                break
        time.sleep(0.3)
        before = held_on(h.pid)
        r = subprocess.run([a.neighbour, "grab", "1024", str(interval)],
                           env=env(pooled, CUDA_VISIBLE_DEVICES=gpu), capture_output=True,
                           text=True, timeout=300)
        m = re.search(r"got (\d+) blocks", r.stdout)
        time.sleep(0.3)
        after = held_on(h.pid)
        h.stdin.write("exit\n")
        h.stdin.flush()
        herr = h.communicate(timeout=60)[1]
        if a.logs:
            tag = f"{'pooled' if pooled else 'plain'}-gpu{gpu}"
            with open(os.path.join(a.logs, f"{tag}-holder.log"), "w") as f:
                f.write(herr)
            with open(os.path.join(a.logs, f"{tag}-neighbour.log"), "w") as f:
                f.write(r.stdout + r.stderr)
        who = "under gpupool" if pooled else "no gpupool, 1 GiB every 50 ms"
        print(f"| C program {who} | {gpu} ({uuids[gpu][:12]}...) | "
              f"{m.group(1) if m else '? ' + r.stderr[-200:]} GiB | before {before}, after {after} |",
              flush=True)
