#!/usr/bin/env python3
"""What the trace and the exit stats say of blocks whose context the program
destroyed while they were active: the driver freed them with the context, so
the trace must record their end and agree with the stats on what is active
(the report's memory over time and the leak report read the trace).

usage: run_trace.py CLIENT SCENARIO   (CLIENT linked, under the shim)"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupool_check  # noqa: E402
from harness import bare_env, fail, finish  # noqa: E402

client, scenario = sys.argv[1:3]


with tempfile.TemporaryDirectory() as tmp:
    trace = os.path.join(tmp, "trace.txt")
    stats = os.path.join(tmp, "stats.json")
    env = bare_env()
    env.update(LD_PRELOAD=os.environ["GPUPOOL_TEST_PRELOAD"], CLIENT_POOLED="1",
               GPUPOOL_LOG="warn", GPUPOOL_TRACE_FILE=trace, GPUPOOL_STATS_AT_EXIT="1",
               GPUPOOL_STATS_FORMAT="json", GPUPOOL_STATS_FILE=stats, GPUPOOL_LEAKS="1")
    p = subprocess.run([client, "linked", scenario], env=env, capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        fail(f"client exited {p.returncode}: {p.stderr[-2000:]}")
    counts, problems = gpupool_check.replay_trace(trace)
    for pr in problems[:20]:
        fail(pr)
    with open(stats) as f:
        dumped = f.read()  # JSON dumps, then the leak report if any
    last = json.loads([l for l in dumped.splitlines() if l.startswith("{")][-1])
    t = last["totals"]
    print(f"trace: {counts}; stats at exit: active_blocks {t['active_blocks']}")
    if counts["active"] != t["active_blocks"]:
        fail(f"the trace leaves {counts['active']} blocks active, the stats say "
             f"{t['active_blocks']}")
    if counts["active"] != 0:
        fail(f"{counts['active']} blocks active at exit in the trace; every context was destroyed")
    m = re.search(r"leaks: pid \d+: (\d+) blocks", dumped)
    if not m or m.group(1) != "0":
        fail(f"the leak report should list nothing (the driver freed the memory with its "
             f"contexts): {dumped[-600:]}")

finish()
