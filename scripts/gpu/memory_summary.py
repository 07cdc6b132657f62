#!/usr/bin/env python3
"""Summarise `scripts/gpu/harness.sh memory`: the memory-overhead table.

  scripts/gpu/memory_summary.py DIR BENCH_REPLAY

DIR holds what memory.tar.gz unpacks to. For each loop: PyTorch's caching
allocator's peak reserved / peak allocated, and for gpupool binned, with
GPUPOOL_SPLIT and with GPUPOOL_SEGMENTS=expandable the peak bytes it took from the driver (the exit dump's
totals.peak_managed_bytes, exact: driver calls are counted under a lock)
over the peak bytes the program asked for (from the trace, by bench_replay:
exact, where the dump's per-thread peaks would be an upper bound), and
the pool's waits for the device with the time they took. Also
whether the runs' losses, parameters and inference outputs (CuPy: the
checksum) are identical.
"""
import glob
import json
import os
import subprocess
import sys


def result(path):
    lines = [l for l in open(path) if l.startswith("RESULT ")]
    return json.loads(lines[-1][7:]) if lines else None


def last_dump(path):
    dumps = [json.loads(l) for l in open(path) if l.strip()]
    return dumps[-1] if dumps else None


def peak_active(trace, replay):
    out = subprocess.run([replay, trace, "--rounds", "1", "--json"], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)["peak_active_bytes"]


def main():
    d, replay = sys.argv[1], sys.argv[2]
    names = sorted({os.path.basename(p).rsplit("-", 1)[0] for p in glob.glob(f"{d}/*-caching.out")})
    print("| loop | PyTorch / CuPy own pool | gpupool (binned) | gpupool, GPUPOOL_SPLIT=on "
          "| the same, GPUPOOL_REUSE=immediate | gpupool, GPUPOOL_SEGMENTS=expandable "
          "| the same, GPUPOOL_REUSE=immediate | identical results |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        own = result(f"{d}/{n}-caching.out")
        cells, runs = [], [own]
        if own and "max_memory_reserved" in own:
            cells.append(f"{own['max_memory_reserved'] / own['max_memory_allocated']:.2f}")
        else:
            cells.append("n/a")
        for mode in ("gpupool", "split", "splitimm", "expandable", "expandableimm"):
            if not os.path.exists(f"{d}/{n}-{mode}.out"):
                cells.append("-")
                continue
            r = result(f"{d}/{n}-{mode}.out")
            runs.append(r)
            stats, trace = f"{d}/{n}-{mode}.stats", f"{d}/{n}-{mode}.trace"
            if not (r and os.path.exists(stats) and os.path.exists(trace)):
                cells.append("failed")
                continue
            totals = last_dump(stats)["totals"]
            managed = totals["peak_managed_bytes"]
            active = peak_active(trace, replay)
            cell = f"{managed / active:.2f} ({managed / 2**20:.0f} / {active / 2**20:.0f} MiB"
            if "fence_wait_ns" in totals:  # what safe reuse's waits stalled the program
                cell += f"; {totals['fence_waits']} waits, {totals['fence_wait_ns'] / 1e6:.1f} ms"
            cells.append(cell + ")")
        if all(runs):
            keys = ("losses", "params_sha256", "infer_sha256") if "losses" in runs[0] else ("checksum",)
            same = all(all(r.get(k) == runs[0].get(k) for k in keys) for r in runs[1:])
        else:
            same = False
        print(f"| {n} | " + " | ".join(cells) + f" | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
