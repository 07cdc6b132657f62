#!/usr/bin/env python3
"""fork() on a real GPU program: PyTorch training whose DataLoader forks its
workers every epoch, while a second thread keeps allocating on the GPU and
the main process forks bare children too. Under gpupool (caching off, so
every tensor is a cuMemAlloc) nothing may hang and the result must be the
one without gpupool.

usage: fork_check.py [EPOCHS]     prints one line: result <checksum> forks <n> seconds <s>
Run it twice (with and without LD_PRELOAD=libgpupool.so) and compare the
checksums; a hang is caught by the caller's timeout."""
import os
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self):
        return 512

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(64, generator=g)
        return x, (x * x).sum(dim=0, keepdim=True)


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    stop = threading.Event()

    def churn():  # another thread inside the allocator whenever a fork comes
        while not stop.is_set():
            a = torch.empty(1 << 18, device=dev)
            b = torch.empty(3 << 20, device=dev)
            del a, b

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    forks = 0
    start = time.monotonic()
    for _ in range(epochs):
        loader = DataLoader(Squares(), batch_size=32, num_workers=4, shuffle=False,
                            multiprocessing_context="fork")
        forks += 4
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        for _ in range(4):  # bare children: no CUDA, exit at once
            pid = os.fork()
            if pid == 0:
                os._exit(0 if sum(range(1000)) == 499500 else 1)
            _, status = os.waitpid(pid, 0)
            if status != 0:
                print(f"a forked child exited with status {status}", file=sys.stderr)
                sys.exit(1)
            forks += 1
    stop.set()
    t.join()
    torch.cuda.synchronize()
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print(f"result {checksum:.12e} forks {forks} seconds {time.monotonic() - start:.2f}")


if __name__ == "__main__":
    main()
