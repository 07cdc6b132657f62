#!/usr/bin/env python3
"""A jit-compiled JAX training loop: issue 24, part 3 (JAX).

A small MLP (fixed seed, synthetic regression data) trained with plain SGD.
The step is not donated, so every step allocates new parameter buffers and
XLA's temporaries and drops the old ones: under
XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform
each of them is a driver allocation and free (what gpupool pools); with no
such variables XLA's own BFC allocator serves them. The allocator is chosen
by the environment only: run.sh runs this script once per mode and round.

Prints one line
  RESULT jax_loop round=R mode=M median_step_us=... checksum=... loss_bits=...
with the median over timed blocks of the time per step (each block ends in
block_until_ready), the final loss's float32 bits and a SHA-256 of every
parameter's bytes: the same seed must give the same bits in every mode.
A missing JAX prints a SKIP line and exits 0.
"""
import argparse
import hashlib
import os
import statistics
import struct
import sys
import time


def gpupool_loaded():
    try:
        with open("/proc/self/maps") as f:
            return int("libgpupool" in f.read())
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="?", help="label printed in the RESULT line")
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=20, help="untimed steps first (the compile)")
    ap.add_argument("--blocks", type=int, default=10)
    ap.add_argument("--block-steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4, help="hidden layers")
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--allow-cpu", action="store_true", help="run on a CPU too (to try the script)")
    a = ap.parse_args()

    try:
        import jax
        import jax.numpy as jnp
        import numpy as np
    except Exception as e:  # noqa: BLE001 - any import failure is a skip
        print(f"SKIP jax_loop: cannot import jax ({type(e).__name__}: {e})")
        return 0

    dev = jax.devices()[0]
    if dev.platform != "gpu" and not a.allow_cpu:
        print(f"SKIP jax_loop: JAX's first device is {dev.platform}, not a GPU")
        return 0

    n_in, n_out = 64, 8
    key = jax.random.PRNGKey(a.seed)
    k_x, k_w, k_p = jax.random.split(key, 3)
    x_all = jax.random.normal(k_x, (a.samples, n_in), jnp.float32)
    w_true = jax.random.normal(k_w, (n_in, n_out), jnp.float32) / 8.0
    y_all = jnp.sin(x_all @ w_true)

    sizes = [n_in] + [a.width] * a.depth + [n_out]
    params = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        kw = jax.random.fold_in(k_p, i)
        params.append((jax.random.normal(kw, (m, n), jnp.float32) * (2.0 / m) ** 0.5,
                       jnp.zeros((n,), jnp.float32)))

    def forward(ps, x):
        for w, b in ps[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = ps[-1]
        return x @ w + b

    def loss_fn(ps, x, y):
        return jnp.mean((forward(ps, x) - y) ** 2)

    n_batches = a.samples // a.batch

    @jax.jit
    def train_step(ps, i):
        start = (i % n_batches) * a.batch
        xb = jax.lax.dynamic_slice_in_dim(x_all, start, a.batch)
        yb = jax.lax.dynamic_slice_in_dim(y_all, start, a.batch)
        loss, grads = jax.value_and_grad(loss_fn)(ps, xb, yb)
        ps = jax.tree_util.tree_map(lambda p, g: p - a.lr * g, ps, grads)
        return ps, loss

    step = 0
    loss = None
    for _ in range(a.warmup):
        params, loss = train_step(params, step)
        step += 1
    jax.block_until_ready((params, loss))

    per_step = []
    for _ in range(a.blocks):
        t0 = time.perf_counter()
        for _ in range(a.block_steps):
            params, loss = train_step(params, step)
            step += 1
        jax.block_until_ready((params, loss))
        per_step.append((time.perf_counter() - t0) / a.block_steps)

    h = hashlib.sha256()
    for w, b in params:
        h.update(np.asarray(w).tobytes())
        h.update(np.asarray(b).tobytes())
    loss_f = float(np.asarray(loss, dtype=np.float32))
    loss_bits = struct.unpack("<I", struct.pack("<f", loss_f))[0]
    allocator = os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default(bfc)")
    print(f"RESULT jax_loop round={a.round} mode={a.mode} "
          f"median_step_us={statistics.median(per_step) * 1e6:.2f} "
          f"min_step_us={min(per_step) * 1e6:.2f} steps={step} "
          f"loss={loss_f:.9g} loss_bits=0x{loss_bits:08x} checksum={h.hexdigest()[:16]} "
          f"allocator={allocator} preallocate={os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', 'default')} "
          f"gpupool_loaded={gpupool_loaded()} jax={jax.__version__} device={dev.device_kind.replace(' ', '_')}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
