#!/usr/bin/env python3
"""Compare commands as ratios measured in one call, interleaved.

Processes on the shared hosts differ by up to 2x in speed, so one process
per mode proves nothing. This runs each command once per round, rotating
the order every round (A B C, B C A, ...), takes one number from each
run's output, and reports per round the ratio of every command to the
first (the baseline), then the median ratio and its range.

  scripts/interleave.py --rounds 10 --metric 'step_ms_median": ([0-9.]+)' \
      caching='python3 scripts/gpu/workloads/torch_loop.py --model mlp' \
      gpupool='PYTORCH_NO_CUDA_MEMORY_CACHING=1 LD_PRELOAD=... python3 ...'

The metric is the first group of the last match of --metric in stdout.
A run that fails or prints no match stops the comparison with its output.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time


def run_one(cmd, metric):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    found = re.findall(metric, p.stdout)
    if p.returncode != 0 or not found:
        sys.stderr.write(f"interleave: '{cmd}' exited {p.returncode}, "
                         f"{len(found)} matches of {metric!r}\n")
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        sys.exit(1)
    last = found[-1]
    return float(last[0] if isinstance(last, tuple) else last)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--metric", required=True, help="regex, group 1 is the number")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start no round that would end after this, judged by the "
                         "longest round so far (then summarise the rounds done)")
    ap.add_argument("commands", nargs="+", help="name=shell command; the first is the baseline")
    a = ap.parse_args()
    named = []
    for c in a.commands:
        name, sep, cmd = c.partition("=")
        if not sep or not name or not cmd:
            ap.error(f"'{c}' is not name=command")
        named.append((name, cmd))
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")

    values = {name: [] for name, _ in named}
    start = time.monotonic()
    done = 0
    longest = 0.0  # the longest round so far: the next is expected to fit the budget
    for r in range(a.rounds):
        if r and a.budget and time.monotonic() - start + longest > a.budget:
            print(f"time budget of {a.budget:g} s: {r} of {a.rounds} rounds", flush=True)
            break
        began = time.monotonic()
        order = named[r % len(named):] + named[:r % len(named)]
        for name, cmd in order:
            values[name].append(run_one(cmd, a.metric))
        base = values[named[0][0]][-1]
        cells = " ".join(f"{n}={values[n][-1]:.4g}" for n, _ in named)
        ratios = " ".join(f"{n}/{named[0][0]}={values[n][-1] / base:.3f}" for n, _ in named[1:])
        print(f"round {r + 1}: {cells}  {ratios}", flush=True)
        done = r + 1
        longest = max(longest, time.monotonic() - began)

    base_name = named[0][0]
    print(f"\n{done} rounds, order rotated each round; ratio to {base_name} within each round")
    print("| command | median | min | max | median ratio | ratio range |")
    print("|---|---|---|---|---|---|")
    for name, _ in named:
        v = values[name]
        rat = [x / b for x, b in zip(v, values[base_name])]
        print(f"| {name} | {statistics.median(v):.4g} | {min(v):.4g} | {max(v):.4g} "
              f"| {statistics.median(rat):.3f} | {min(rat):.3f}-{max(rat):.3f} |")


if __name__ == "__main__":
    main()
