#!/usr/bin/env python3
"""PyTorch training loop and inference for gpupool's GPU verification.

Run unmodified under different allocators by scripts/gpu/harness.sh:
  (a) PyTorch's caching allocator (default),
  (b) PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc/cudaFree),
  (c) (b) under LD_PRELOAD=libgpupool.so.
Results must be bitwise identical between runs; step times are compared.

Prints per-step lines and one final line
  RESULT {"tag": ..., "losses": [...repr...], "step_ms_median": ..., ...}
The model (--model) is a small CNN, an MLP whose steps are shorter, so
allocation is a larger part of them, or the network and optimizer of
PyTorch's own MNIST example (Adadelta, whose foreach update allocates
temporaries for every parameter). --batch takes a list (64,256): each
batch size trains a fresh model from the same seed in the same process and
prints its own RESULT line (with "batch"). Synthetic data (fixed seeds),
deterministic algorithms asked for, TF32 off so the losses are plain float32
arithmetic.
"""
import argparse
import hashlib
import json
import os
import statistics
import sys
import time

# Needed by deterministic cuBLAS; must be set before cuBLAS starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402


class MnistNet(nn.Module):
    """The network of PyTorch's own MNIST example (pytorch/examples,
    mnist/main.py), trained as there: NLL loss, Adadelta at lr 1.0."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        F = nn.functional
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(self.dropout1(F.max_pool2d(x, 2)), 1)
        x = self.fc2(self.dropout2(F.relu(self.fc1(x))))
        return F.log_softmax(x, dim=1)


def input_shape(kind):
    return (1, 28, 28) if kind == "mnist" else (3, 32, 32)


def build_model(kind):
    if kind == "mnist":
        return MnistNet()
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(),
            nn.Linear(3 * 32 * 32, 512), nn.ReLU(),
            nn.Linear(512, 512), nn.ReLU(),
            nn.Linear(512, 256), nn.ReLU(),
            nn.Linear(256, 10),
        )
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.AvgPool2d(4), nn.Flatten(),  # 16x16 -> 4x4
        nn.Linear(64 * 16, 256), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(256, 10),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tag", default="run")
    ap.add_argument("--model", choices=("cnn", "mlp", "mnist"), default="cnn")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="steps left out of the timing")
    ap.add_argument("--batch", default="64", help="batch size, or a comma-separated list")
    ap.add_argument("--infer-iters", type=int, default=40)
    args = ap.parse_args()

    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # warn_only: an op without a deterministic kernel must not end the run;
    # the ops used here (no adaptive pooling, no gather/scatter in the loss)
    # all have one.
    torch.use_deterministic_algorithms(True, warn_only=True)
    dev = torch.device("cuda")

    for batch in [int(b) for b in args.batch.split(",")]:
        torch.manual_seed(1234)
        # Data on the host, pinned, as a data loader hands it over.
        g = torch.Generator().manual_seed(42)
        n_batches = 8
        shape = input_shape(args.model)
        xs = [torch.randn(batch, *shape, generator=g).pin_memory() for _ in range(n_batches)]
        ys = [torch.randint(0, 10, (batch,), generator=g).pin_memory() for _ in range(n_batches)]

        model = build_model(args.model).to(dev)
        if args.model == "mnist":
            opt = torch.optim.Adadelta(model.parameters(), lr=1.0)

            def loss_fn(out, y):
                return torch.nn.functional.nll_loss(out, y)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)

            def loss_fn(out, y):
                # Cross entropy through a one-hot product rather than NLLLoss, whose
                # CUDA backward scatters with atomics.
                onehot = torch.nn.functional.one_hot(y, 10).to(out.dtype)
                return -(torch.log_softmax(out, dim=1) * onehot).sum(dim=1).mean()

        losses, step_ms = [], []
        torch.cuda.synchronize()
        t_train = time.perf_counter()
        for step in range(args.steps):
            t0 = time.perf_counter()
            x = xs[step % n_batches].to(dev, non_blocking=True)
            y = ys[step % n_batches].to(dev, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            out = model(x)
            loss = loss_fn(out, y)
            loss.backward()
            opt.step()
            lv = loss.item()  # synchronizes
            dt = (time.perf_counter() - t0) * 1e3
            losses.append(lv)
            step_ms.append(dt)
            print(f"batch {batch} step {step:3d} loss {lv!r} ms {dt:.3f}", flush=True)
        torch.cuda.synchronize()
        train_s = time.perf_counter() - t_train

        model.eval()
        xi = torch.randn(256, *shape, generator=g).to(dev)
        infer_ms, digests = [], set()
        with torch.inference_mode():
            for _ in range(args.infer_iters):
                t0 = time.perf_counter()
                o = torch.softmax(model(xi), dim=1)
                torch.cuda.synchronize()
                infer_ms.append((time.perf_counter() - t0) * 1e3)
                digests.add(hashlib.sha256(o.cpu().numpy().tobytes()).hexdigest())
        params = hashlib.sha256(b"".join(
            p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()

        timed = step_ms[args.warmup:]
        res = {
            "tag": args.tag,
            "model": args.model,
            "batch": batch,
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0),
            "env": {k: os.environ.get(k, "") for k in
                    ("PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF", "LD_PRELOAD",
                     "GPUPOOL_REUSE")},
            "losses": [repr(v) for v in losses],
            "params_sha256": params,
            "infer_sha256": sorted(digests),
            "infer_consistent": len(digests) == 1,
            "step_ms_median": statistics.median(timed),
            "step_ms_mean": statistics.fmean(timed),
            "train_s": train_s,
            # The first three inferences warm up; fewer than four: no figure.
            "infer_ms_median": statistics.median(infer_ms[3:]) if len(infer_ms) > 3 else None,
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            # The caching allocator's: what it held from the driver at most.
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
        }
        print("RESULT " + json.dumps(res), flush=True)
        del model, opt, xs, ys
    return 0


if __name__ == "__main__":
    sys.exit(main())
