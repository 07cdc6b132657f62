#!/usr/bin/env python3
"""What a trace, the allocation sites, the leak report and `gpupool report
--text` say of stream-ordered allocations (cuda_async traced): each
allocation and free the program made, as records of kind 'd' of its
memory pool's arena; none made while a stream captured; the one left
allocated at exit listed as still held.

usage: run_async_trace.py CUDA_ASYNC GPUPOOL_LAUNCHER   (under the shim)"""
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupool_check  # noqa: E402
from harness import bare_env, fail, finish  # noqa: E402

client, launcher = sys.argv[1:3]
MiB = 1 << 20


def expect(what, got, want):
    if got != want:
        fail(f"{what}: {got}, expected {want}")


with tempfile.TemporaryDirectory() as tmp:
    trace = os.path.join(tmp, "trace.txt")
    stats = os.path.join(tmp, "stats.json")
    env = bare_env()
    env.update(LD_PRELOAD=os.environ["GPUPOOL_TEST_PRELOAD"], CLIENT_POOLED="1",
               GPUPOOL_LOG="warn", GPUPOOL_TRACE_FILE=trace, GPUPOOL_STATS_AT_EXIT="1",
               GPUPOOL_STATS_FORMAT="json", GPUPOOL_STATS_FILE=stats, GPUPOOL_LEAKS="1",
               GPUPOOL_SITES="all")
    p = subprocess.run([client, "traced"], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        fail(f"client exited {p.returncode}: {p.stderr[-2000:]}")
    counts, problems = gpupool_check.replay_trace(trace)
    for pr in problems[:20]:
        fail(pr)
    arenas, allocs, frees, active = {}, [], [], {}
    with open(trace) as f:
        for line in f:
            w = line.split()
            if w[:1] == ["arena"]:
                arenas[w[1]] = w[2]
            elif w[:1] == ["a"]:
                allocs.append((arenas.get(w[3]), int(w[5]), w[7], len(w) > 8))
                active[(w[3], w[4])] = int(w[5])
            elif w[:1] == ["f"]:
                frees.append((arenas.get(w[3]), int(w[5])))
                active.pop((w[3], w[4]), None)
    print(f"trace: {counts}; allocations {allocs}; frees {frees}")
    # The refused free shows as the 8 MiB block's end and its start again.
    want = Counter([MiB + 100, 3 * MiB, 2 * MiB, 5 * MiB, 7 * MiB, 6 * MiB, 8 * MiB, 8 * MiB])
    expect("stream-ordered allocations traced", Counter(r for k, r, _, _ in allocs
                                                        if k == "cuda-async"), want)
    expect("allocations of other kinds", [a for a in allocs if a[0] != "cuda-async"], [])
    expect("letters", {h for _, _, h, _ in allocs}, {"d"})
    expect("allocations without a site", [a for a in allocs if not a[3]], [])
    expect("frees traced", Counter(r for k, r in frees if k == "cuda-async"),
           Counter([MiB + 100, 3 * MiB, 2 * MiB, 5 * MiB, 6 * MiB, 8 * MiB, 8 * MiB]))
    expect("active at the end", sorted(active.values()), [7 * MiB])
    expect("replay's counts", (counts["outside"], counts["hits"], counts["misses"],
                               counts["active"]), (8, 0, 0, 1))
    with open(stats) as f:
        dumped = f.read()  # JSON dumps, then the leak report
    m = re.search(r"leaks: pid \d+: (\d+) blocks? \(([^)]*)\)", dumped)
    expect("the leak report", m and (m.group(1), m.group(2)), ("1", "7.0 MiB"))
    r = subprocess.run([launcher, "report", "--text", trace], capture_output=True, text=True,
                       timeout=120)
    print(r.stdout)
    expect("gpupool report's exit status", r.returncode, 0)
    if "Still held at the end (7.0 MiB in 1 block)" not in r.stdout:
        fail("gpupool report --text does not list the 7 MiB still held at the end")
    # (A line longer than 100 columns goes on, indented, on the next.)
    if "8 stream-ordered, served by the driver's memory pools" not in re.sub(r"\n {4,}", " ",
                                                                             r.stdout):
        fail("gpupool report --text does not count the stream-ordered allocations")

finish()
