#!/usr/bin/env python3
"""A synthetic GPUPOOL_TRACE_FILE of N events, shaped like a real one: several
threads whose records come in per-thread batches (as the library writes them,
so the file is not in time order), three arenas in two pool groups, a live
set that grows and shrinks, a few blocks never freed, and allocation sites
(version 2) on every allocation. For measuring `gpupool report` and
`gpupool trace convert` (scripts/bench-report.sh); the same seed gives the
same file.

usage: synth_trace.py EVENTS OUT [--pid PID] [--seed SEED] [--start-ns NS]
"""
import argparse
import random

ap = argparse.ArgumentParser()
ap.add_argument("events", type=int)
ap.add_argument("out")
ap.add_argument("--pid", type=int, default=4242)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--start-ns", type=int, default=1_763_790_000_000_000_000)
args = ap.parse_args()
rng = random.Random(args.seed)

THREADS = 4
BATCH = 1024  # a thread's ring (interpose/control/trace.cpp)
SITES = 300
# Sizes a training loop asks for: a few large, many small.
SIZES = [256, 512, 4096, 65536, 1 << 20, 3 << 20, 16 << 20]
WEIGHTS = [30, 20, 20, 15, 8, 5, 2]

head = ["# gpupool trace 2",
        f"# pid {args.pid} start_unix_ns {args.start_ns}",
        "# cmdline python3 train.py --epochs 3",
        "module 0 400000 500000 0 - /nonexistent/bin/train",
        "module 1 7f0000000000 7f0000100000 7f0000000000 - /nonexistent/lib/libcuda.so.1",
        "module 2 7f1000000000 7f1000100000 7f1000000000 - /nonexistent/lib/libmodel.so"]
for i in range(40):
    head.append(f"pyframe {i} {10 + i} fn{i % 13} /src/model_{i % 5}.py")
for s in range(SITES):
    depth = 3 + s % 6
    pcs = ["7f00000%05x" % (0x1000 + 16 * (s % 7))]
    pcs += ["7f10000%05x" % (0x2000 + 32 * ((s * (d + 3)) % 97)) for d in range(depth)]
    pcs += ["4%05x" % (0x1000 + 64 * (s % 11)), "4%05x" % 0x800]
    py = ",".join(str((s * 7 + k) % 40) for k in range(s % 4)) or "-"
    head.append(f"site {s} {','.join(pcs)} {py}")
head += ["arena 0 cuda cuda:0 cuda dev 0 ctx 0x1", "arena 1 cuda cuda:0 cuda dev 0 stream pool",
         "arena 2 cuda-host cuda-host pinned flags 0x1"]

# Events in time order, per thread; a thread's records are written out in
# batches of up to a ring's size, interleaved with the other threads' as the
# drains come (so the file is ordered per thread, not globally).
out = open(args.out, "w")
out.write("\n".join(head) + "\n")
pending = [[] for _ in range(THREADS)]
flush_at = [rng.randint(1, BATCH) for _ in range(THREADS)]
live = [[] for _ in range(THREADS)]  # (arena, handle, requested, size)
handle = 0x7f5000000000
t = 0
target_live = 500
for events in range(args.events):
    th = rng.randrange(THREADS)
    t += rng.randint(50, 400)
    lv = live[th]
    if events % 200000 == 0:
        target_live = rng.randint(50, 2000)
    if lv and (len(lv) > target_live // THREADS or rng.random() < 0.45):
        a, h, req, size = lv.pop(rng.randrange(len(lv)))
        pending[th].append(f"f {t} {1000 + th} {a} {h:x} {req} {size}")
    else:
        req = rng.choices(SIZES, WEIGHTS)[0] - rng.randrange(64)
        size = (req + 511) & ~511
        a = 2 if req < 4096 and rng.random() < 0.3 else (0 if rng.random() < 0.8 else 1)
        handle += size
        hit = "h" if rng.random() < 0.9 else "m"
        pending[th].append(f"a {t} {1000 + th} {a} {handle:x} {req} {size} {hit} "
                           f"{rng.randrange(SITES)}")
        lv.append((a, handle, req, size))
    if len(pending[th]) >= flush_at[th]:
        out.write("\n".join(pending[th]) + "\n")
        pending[th] = []
        flush_at[th] = rng.randint(1, BATCH)
for p in pending:
    if p:
        out.write("\n".join(p) + "\n")
out.close()
