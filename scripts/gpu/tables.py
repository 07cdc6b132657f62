#!/usr/bin/env python3
"""The tables of harness.sh's experiments, from their raw lines.

  tables.py hotpath RUNS          RUNS: "lib case _ size ns" per run (lib a or b)
  tables.py threads JSON THREADS  JSON: bench_alloc --scaling lines
  tables.py sites RUNS            RUNS: "round mode RESULT-json" per run
  tables.py ddp OFF GPUPOOL       the two runs' output (RESULT lines)
"""
import collections
import json
import statistics
import sys


def human(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or n % 1024:
            return f"{n} {unit}"
        n >>= 10
    return f"{n} GiB"


def hotpath(path):
    v = collections.defaultdict(list)
    for line in open(path):
        lib, case, _, size, ns = line.split()
        v[(case, int(size), lib)].append(float(ns))
    print("| pair | size | a median ns (range) | b median ns (range) | b/a per round, median |")
    print("|---|---|---|---|---|")
    for case, size in sorted({(k[0], k[1]) for k in v}):
        a, b = v[(case, size, "a")], v[(case, size, "b")]
        ratios = [y / x for x, y in zip(a, b)]
        print(f"| {case} | {human(size)} | {statistics.median(a):.0f} ({min(a):.0f}-{max(a):.0f}) | "
              f"{statistics.median(b):.0f} ({min(b):.0f}-{max(b):.0f}) | {statistics.median(ratios):.3f} |")


def threads(path, nthreads):
    v = collections.defaultdict(list)
    one = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        key = (r["label"], r["workload"], r["size"])
        v[key].append(r["scaling"])
        one[key].append(r["one_ns"])
    print(f"| library-mode | workload | size | {nthreads} threads over 1, median (range) | rounds "
          "| 1 thread, ns per op, median |")
    print("|---|---|---|---|---|---|")
    for key in sorted(v):
        s = v[key]
        size = f"{key[2] >> 10} KiB" if key[2] else ""
        print(f"| {key[0]} | {key[1]} | {size} | {statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f}) "
              f"| {len(s)} | {statistics.median(one[key]):.1f} |")


def sites(path):
    rows = {}
    for line in open(path):
        i, mode, js = line.split(" ", 2)
        try:
            rows.setdefault(mode, {})[int(i)] = json.loads(js)["step_ms_median"]
        except Exception:
            pass
    base = rows.get("off", {})
    print("mode        step ms (median of rounds)   ratio to off per round: median [min, max]")
    for mode, r in rows.items():
        ratios = [r[i] / base[i] for i in r if i in base]
        print(f"{mode:10s}  {statistics.median(r.values()):8.3f}   "
              f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]  n={len(ratios)}")


def ddp(off, gpupool):
    def result(path):
        lines = [l for l in open(path) if l.startswith("RESULT ")]
        return json.loads(lines[-1][7:]) if lines else None

    a, b = result(off), result(gpupool)
    if not a or not b:
        print("FAIL DDP: a run printed no RESULT")
        return
    same = a["losses"] == b["losses"] and a["params_sha256"] == b["params_sha256"]
    print(("PASS" if same and a["ranks_agree"] and b["ranks_agree"] else "FAIL") +
          f" DDP losses and parameters identical, caching off vs off under gpupool: "
          f"{len(a['losses'])} losses, last {a['losses'][-1]} vs {b['losses'][-1]}; "
          f"ranks agree {a['ranks_agree']}/{b['ranks_agree']}")


if __name__ == "__main__":
    cmds = {"hotpath": hotpath, "threads": threads, "sites": sites, "ddp": ddp}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])
