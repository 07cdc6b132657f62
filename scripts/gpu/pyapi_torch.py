#!/usr/bin/env python3
"""`import gpupool` inside a PyTorch loop on a CUDA GPU: gpupool.stats(),
reset_peak(), free_held(), snapshot() and trace() against what PyTorch says
of its own memory, and the last stats() against the exit dump.

usage: PYTHONPATH=python python3 scripts/gpu/pyapi_torch.py --gpupool build/bin/gpupool [--out DIR]

Runs itself twice under `gpupool run --stats --json --stats-file F --set
GPUPOOL_LEAKS=1`: once with PyTorch's caching allocator (gpupool sees its
segments: what PyTorch calls reserved is what gpupool's CUDA arenas have
active), once with it off (PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor
is a cudaMalloc gpupool serves). Each check prints a line; the last line is
"pyapi torch: ok" when every check passed (exit 0), else "pyapi torch:
FAILED" (exit 1).

What the docs promise and the checks hold to (docs/stats.md):
  - active_bytes: the sizes the program asked for: with caching, PyTorch's
    segments (memory_reserved() and each memory_snapshot() segment's
    address and total_size) plus a fixed amount libraries allocate
    themselves (cuBLAS's and cuDNN's workspaces); without, each tensor's
    nbytes at its data_ptr();
  - peaks: exact with one allocating thread, an upper bound with several
    (autograd's backward runs on its own thread): gpupool's peak after
    reset_peak() is at least PyTorch's max_memory_reserved() after
    reset_peak_memory_stats(), and equals the current value right after;
  - free_held() leaves no held bytes; counters at the last stats() equal
    the exit dump's (hits, misses, driver allocations: nothing is
    allocated after it).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MiB = 1 << 20
failures = []


def check(cond, what):
    print(("ok      " if cond else "FAILED  ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def child(caching, out):
    import torch
    import torch.nn as nn

    import gpupool

    check(gpupool.available(), "gpupool is loaded")
    dev = torch.device("cuda")

    def cuda_totals():
        """Active and held bytes of gpupool's device-memory arenas."""
        s = gpupool.stats()
        rows = [a["stats"] for a in s["arenas"] if a["kind"] == "cuda"]
        return {k: sum(r[k] for r in rows) for k in rows[0]} if rows else {}

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1),
                          nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 3, 64, 64, device=dev)
    y = torch.randint(0, 10, (128,), device=dev)

    def steps(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        return float(loss)

    steps(5)
    gpupool.free_held()
    t = cuda_totals()
    check(t["held_bytes"] == 0, f"free_held(): held_bytes {t['held_bytes']}")

    if caching:
        # gpupool sees every device allocation of the process: PyTorch's
        # segments and what libraries take themselves (cuBLAS's and cuDNN's
        # workspaces: 128.3 MiB on the H200's first run), a fixed amount.
        reserved = torch.cuda.memory_reserved()
        outside = t["active_bytes"] - reserved
        check(outside >= 0,
              f"gpupool's active_bytes {t['active_bytes']} >= PyTorch's memory_reserved() {reserved} "
              f"(outside PyTorch's allocator: {outside})")
        # A tensor no cached segment fits: one more segment, of the same size both ways.
        before_t, before_r = t["active_bytes"], reserved
        big = torch.empty(300 * MiB, dtype=torch.uint8, device=dev)
        t = cuda_totals()
        grew = torch.cuda.memory_reserved() - before_r
        check(grew > 0 and t["active_bytes"] - before_t == grew,
              f"a 300 MiB tensor: reserved grew {grew}, gpupool's active_bytes {t['active_bytes'] - before_t}")
        snap = gpupool.snapshot()
        blocks = {b["handle"]: b for b in snap["blocks"]}
        segs = [s for s in torch.cuda.memory_snapshot() if s.get("device", 0) == torch.cuda.current_device()]
        missing = [(s["address"], s["total_size"]) for s in segs
                   if blocks.get(s["address"], {}).get("requested") != s["total_size"]]
        check(segs and not missing,
              f"snapshot(): each of PyTorch's {len(segs)} segments a live block of its size (missing {missing[:3]})")
        # empty_cache(): PyTorch gives back its free segments, gpupool holds them; free_held() gives them back.
        del big
        torch.cuda.empty_cache()
        t = cuda_totals()
        check(t["active_bytes"] - torch.cuda.memory_reserved() == outside,
              f"after empty_cache(): active_bytes {t['active_bytes']} - reserved {torch.cuda.memory_reserved()} "
              f"== the {outside} outside PyTorch's allocator, as before")
        check(t["held_bytes"] >= 300 * MiB, f"after empty_cache(): gpupool holds {t['held_bytes']} (>= 300 MiB)")
        gpupool.free_held()
        check(cuda_totals()["held_bytes"] == 0, "free_held() after empty_cache(): nothing held")
        torch.cuda.reset_peak_memory_stats()
        gpupool.reset_peak()
        t = cuda_totals()
        check(t["peak_active_bytes"] == t["active_bytes"],
              f"reset_peak(): peak_active_bytes {t['peak_active_bytes']} == active_bytes {t['active_bytes']}")
        steps(5)
        t = cuda_totals()
        check(t["peak_active_bytes"] >= torch.cuda.max_memory_reserved(),
              f"peak after reset: gpupool {t['peak_active_bytes']} >= PyTorch's max_memory_reserved() "
              f"{torch.cuda.max_memory_reserved()} (equal with one allocating thread)")
    else:
        # Every tensor its own cudaMalloc: gpupool's counts are the tensors'.
        before = cuda_totals()["active_bytes"]
        sizes = [1000, 3 * MiB + 7, 64 * MiB]
        kept = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
        t = cuda_totals()
        check(t["active_bytes"] - before == sum(sizes),
              f"3 tensors of {sum(sizes)} bytes: active_bytes grew {t['active_bytes'] - before}")
        snap = gpupool.snapshot()
        blocks = {b["handle"]: b for b in snap["blocks"]}
        check(all(blocks.get(k.data_ptr(), {}).get("requested") == k.nbytes for k in kept),
              "snapshot(): each tensor's data_ptr() a live block of its nbytes")
        del kept
        t = cuda_totals()
        check(t["held_bytes"] > 0 and t["active_bytes"] == before, f"freed: held {t['held_bytes']}, active back to {before}")
        gpupool.free_held()
        check(cuda_totals()["held_bytes"] == 0, "free_held(): nothing held")
        gpupool.reset_peak()
        t = cuda_totals()
        check(t["peak_active_bytes"] == t["active_bytes"], "reset_peak(): peak == current")
        one = torch.empty(32 * MiB, dtype=torch.uint8, device=dev)
        check(cuda_totals()["peak_active_bytes"] >= t["active_bytes"] + 32 * MiB, "the peak grows from there")
        del one

    trace = os.path.join(out, "pyapi_torch.gpupool-trace")
    with gpupool.trace(trace) as written:
        steps(3)
        # With caching, the steps above may take nothing new from the
        # driver: one allocation PyTorch cannot serve from its cache.
        extra = torch.empty(400 * MiB, dtype=torch.uint8, device=dev)
        del extra
    with open(written) as f:
        lines = f.read().splitlines()
    allocs = sum(1 for l in lines if l.startswith("a "))
    check("# attached" in lines and lines[-1].startswith("# end ") and allocs > 0,
          f"trace(): {written}: {allocs} allocations, ends with '# end'")
    print("LAST " + json.dumps(gpupool.stats()["totals"]), flush=True)
    sys.exit(1 if failures else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpupool", help="the gpupool launcher (build/bin/gpupool); the children run without it")
    ap.add_argument("--out", default=None, help="where to keep the traces and dumps")
    ap.add_argument("--child", choices=["caching", "nocache"])
    a = ap.parse_args()
    out = a.out or tempfile.mkdtemp(prefix="pyapi_torch.")
    os.makedirs(out, exist_ok=True)
    if a.child:
        child(a.child == "caching", out)
        return
    if not a.gpupool:
        ap.error("--gpupool is required")
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(here, "..", "..", "python")] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    for mode in ("caching", "nocache"):
        print(f"== {mode}", flush=True)
        dump = os.path.join(out, f"{mode}.stats.json")
        if os.path.exists(dump):
            os.remove(dump)
        e = dict(env)
        if mode == "nocache":
            e["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
        r = subprocess.run([a.gpupool, "run", "--stats", "--json", "--stats-file", dump, "--set", "GPUPOOL_LEAKS=1",
                            "--", sys.executable, os.path.abspath(__file__), "--child", mode, "--out", out],
                           env=e, capture_output=True, text=True, timeout=900)
        print(r.stdout, end="")
        failures.extend(l for l in r.stdout.splitlines() if l.startswith("FAILED"))
        if not check(r.returncode == 0, f"{mode}: the loop ran (exit {r.returncode})"):
            print(r.stderr[-3000:])
            continue
        last = json.loads(next(l for l in reversed(r.stdout.splitlines()) if l.startswith("LAST "))[5:])
        with open(dump) as f:
            exit_dump = [json.loads(l) for l in f if l.startswith("{")][-1]
        check(exit_dump["reason"] == "exit", "the exit dump")
        for k in ("hits", "misses", "backend_allocs", "peak_active_bytes", "peak_active_blocks"):
            check(last[k] == exit_dump["totals"][k],
                  f"{mode}: stats()[totals][{k}] {last[k]} == the exit dump's {exit_dump['totals'][k]}")
    print("pyapi torch: " + ("FAILED" if failures else "ok"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
