#!/usr/bin/env python3
"""The replay table of docs/memory.md, made again from the repository's
traces: each trace under each pool policy, safe and immediate reuse.

    scripts/replay_table.py [BENCH_REPLAY] [TRACE...]

BENCH_REPLAY defaults to build/tests/bench/bench_replay; the traces to
tests/bench/traces/*.trace. Prints the markdown table on stdout."""
import glob
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POLICIES = [  # (name, bench_replay arguments)
    ("default (binned)", []),
    ("GPUPOOL_SPLIT=on", ["GPUPOOL_SPLIT=on"]),
    ("expandable, 2 MiB", ["GPUPOOL_SEGMENTS=expandable"]),
    ("expandable, 20 MiB", ["GPUPOOL_SEGMENTS=expandable", "--granule", "20M"]),
]
REUSE = [("safe (default)", []), ("immediate", ["GPUPOOL_REUSE=immediate"])]


def replay(tool, trace, args):
    out = subprocess.run([tool, trace, "--json", *args], check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def name_of(trace):
    return os.path.basename(trace)[:-len(".trace")]


def main():
    args = sys.argv[1:]
    tool = args.pop(0) if args and not args[0].endswith(".trace") else os.path.join(
        ROOT, "build/tests/bench/bench_replay")
    order = ["torch-cnn", "torch-cnn-256", "torch-cnn-512", "torch-mnist", "torch-mlp", "cupy",
             "pyopencl-nvidia"]
    traces = args or sorted(
        glob.glob(os.path.join(ROOT, "tests/bench/traces/*.trace")),
        key=lambda t: (order.index(name_of(t)) if name_of(t) in order else len(order), t))
    print("| trace | reuse | policy | managed / active | hit rate | waits "
          "| driver allocs / releases | granules mapped (calls) / unmapped |")
    print("|---|---|---|---|---|---|---|---|")
    for trace in traces:
        name = name_of(trace)
        for reuse, r_args in REUSE:
            for policy, p_args in POLICIES:
                j = replay(tool, trace, p_args + r_args)
                granules = "-"
                if j.get("segments") == "expandable":
                    granules = "%d (%d) / %d" % (j["granules_mapped"], j["maps"],
                                                 j["granules_unmapped"])
                print("| %s | %s | %s | **%.3f** | %.2f%% | %d | %d / %d | %s |" %
                      (name, reuse, policy, j["managed_over_active"], 100 * j["hit_rate"],
                       j["fence_waits"], j["driver_allocs"], j["driver_frees"], granules))


if __name__ == "__main__":
    main()
