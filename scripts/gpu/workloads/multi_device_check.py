#!/usr/bin/env python3
"""Several GPUs in one process (issue 14), for the two-GPU machine.

Four threads, each switching between the GPUs every iteration
(torch.cuda.set_device), allocate tensors on the current GPU, copy them to
the other GPU (a peer copy between two pooled blocks when gpupool runs with
PyTorch's caching allocator off), compute there and copy back. Prints one
line RESULT {"digest": ...}: a hash of every thread's results, which must be
the same with and without gpupool (harness.sh multi-device)."""
import hashlib
import json
import os
import sys
import threading

import torch

ITERS = int(os.environ.get("ITERS", "200"))


def work(tid, out):
    h = hashlib.sha256()
    g = torch.Generator().manual_seed(tid)
    for i in range(ITERS):
        dev = (tid + i) % 2
        torch.cuda.set_device(dev)
        n = 1 << (10 + (i % 8))
        a = torch.rand(n, generator=g).to(f"cuda:{dev}")
        b = a.to(f"cuda:{1 - dev}")  # peer copy
        c = (b * 3 + 1).sum()
        back = (b - 1).to(f"cuda:{dev}")
        torch.cuda.synchronize(dev)
        h.update(repr(float(c)).encode())
        h.update(back.cpu().numpy().tobytes())
    out[tid] = h.hexdigest()


def main():
    if torch.cuda.device_count() < 2:
        print("gpu_multi_device: needs two GPUs", file=sys.stderr)
        return 77
    out = {}
    ts = [threading.Thread(target=work, args=(t, out)) for t in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    digest = hashlib.sha256("".join(out[t] for t in sorted(out)).encode()).hexdigest()
    print("RESULT " + json.dumps({"digest": digest, "threads": len(out), "iters": ITERS}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
