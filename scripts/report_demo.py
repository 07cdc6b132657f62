#!/usr/bin/env python3
"""A small PyOpenCL "training" program of two processes, for pictures of
`gpupool report` (docs/images/report-flame.png): each process loads
weights, runs forward passes whose activations it frees, and keeps a cache.

    gpupool run --trace DIR/out.%p.trace --set SITES=all -- python3 scripts/report_demo.py
    gpupool report DIR -o report.html

Needs PyOpenCL and NumPy (Debian: python3-pyopencl), and an OpenCL device
(PoCL will do).
"""
import multiprocessing as mp

import numpy as np
import pyopencl as cl
import pyopencl.array as cla

MIB = 1 << 20
KEPT = []  # held until the process ends


def load_weights(queue, layers):
    return [cla.zeros(queue, (2 + k) * MIB // 4, np.float32) for k in range(layers)]


def attention(queue, x):
    return [cla.empty(queue, x.size, np.float32) for _ in range(3)]


def mlp(queue, x):
    return cla.empty(queue, 4 * x.size, np.float32)


def forward(queue, weights, batch):
    x = cla.empty(queue, batch * MIB // 4, np.float32)
    acts = [x]
    for _ in weights:
        acts += attention(queue, x)
        acts.append(mlp(queue, x))
    return acts


def keep_cache(queue):
    return [cla.empty(queue, 256 * 1024, np.float32) for _ in range(4)]


def train(rank):
    ctx = cl.create_some_context(interactive=False)
    queue = cl.CommandQueue(ctx)
    weights = load_weights(queue, 4 + rank)
    cache = keep_cache(queue)
    for step in range(3):
        acts = forward(queue, weights, 1 + step)
        queue.finish()
        del acts
    KEPT.extend(weights + cache)


if __name__ == "__main__":
    # Processes that end on their own (a pool's workers are killed, and
    # lose their last trace records).
    mp.set_start_method("spawn")
    workers = [mp.Process(target=train, args=(rank,)) for rank in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
