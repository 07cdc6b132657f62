#!/usr/bin/env python3
"""Two-GPU DistributedDataParallel training for gpupool's verification.

One process per GPU (torch.multiprocessing), NCCL all-reduce of the
gradients every step, the small CNN of torch_loop.py on synthetic data
(fixed seeds, each rank its own shard), deterministic algorithms, TF32 off.
Run unmodified under different allocators by harness.sh ddp: PyTorch's
caching allocator, PYTORCH_NO_CUDA_MEMORY_CACHING=1, and that under
LD_PRELOAD=libgpupool.so (every rank inherits the environment). Losses and
parameters must be bitwise identical with caching off, with and without
gpupool.

Rank 0 prints per-step lines and one final line
  RESULT {"losses": [...repr...], "params_sha256": ..., "step_ms_median": ...}
where a loss is the mean over ranks (all-reduced) of that step's loss.
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
# The machines' rule: NVLink multicast stays off.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_loop import build_model, input_shape  # noqa: E402


def rank_main(rank, world, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda", rank)

    torch.manual_seed(1234)  # the same initial model on every rank
    g = torch.Generator().manual_seed(42 + rank)  # each rank its own data
    shape = input_shape("cnn")
    n_batches = 8
    xs = [torch.randn(args.batch, *shape, generator=g).pin_memory() for _ in range(n_batches)]
    ys = [torch.randint(0, 10, (args.batch,), generator=g).pin_memory() for _ in range(n_batches)]
    model = torch.nn.parallel.DistributedDataParallel(build_model("cnn").to(dev), device_ids=[rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

    losses, step_ms = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        x = xs[step % n_batches].to(dev, non_blocking=True)
        y = ys[step % n_batches].to(dev, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        out = model(x)
        onehot = torch.nn.functional.one_hot(y, 10).to(out.dtype)
        loss = -(torch.log_softmax(out, dim=1) * onehot).sum(dim=1).mean()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        lv = mean.item() / world  # synchronizes
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(lv)
        if rank == 0:
            print(f"step {step:3d} loss {lv!r} ms {step_ms[-1]:.3f}", flush=True)
    params = hashlib.sha256(b"".join(
        p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, params)
    if rank == 0:
        res = {
            "world": world,
            "batch": args.batch,
            "torch": torch.__version__,
            "env": {k: os.environ.get(k, "") for k in
                    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "LD_PRELOAD", "GPUPOOL_REUSE")},
            "losses": [repr(v) for v in losses],
            "params_sha256": params,
            "ranks_agree": len(set(digests)) == 1,
            "step_ms_median": statistics.median(step_ms[args.warmup:]),
        }
        print("RESULT " + json.dumps(res), flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    ap.add_argument("--batch", type=int, default=64, help="per rank")
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    world = torch.cuda.device_count()
    if world < 2:
        print(f"gpu_ddp: needs two GPUs, found {world}", file=sys.stderr)
        return 77
    mp.spawn(rank_main, args=(2, args), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
