"""PyOpenCL, unmodified, under gpupool: array expressions with temporaries.

Python loads PyOpenCL's extension (and with it the OpenCL loader) RTLD_LOCAL,
which a plain preload cannot reach safely; gpupool gets in as an ICD layer.
Prints "R ..." result lines (compared with a run without gpupool by
compare.sh); exit 0 pass, 1 fail, 77 skip.
"""
import ctypes
import hashlib
import os
import sys

try:
    import numpy as np
    import pyopencl as cl
    import pyopencl.array as cla
except ImportError as e:  # pragma: no cover
    print(f"SKIP: {e}", file=sys.stderr)
    sys.exit(77)


def layer_count(what):
    path = os.environ.get("COUNT_LAYER")
    if not path:
        return -1
    lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    lib.count_layer_get.restype = ctypes.c_long
    return lib.count_layer_get(what.encode())


def pooling():
    try:
        active = ctypes.CDLL(None).gpupool_active
    except AttributeError:
        return False
    return bool(active()) and os.environ.get("GPUPOOL_OPENCL", "1") not in ("0", "false", "no", "off")


def main():
    platforms = cl.get_platforms()
    want = os.environ.get("CLTEST_PLATFORM", "")
    devs = [d for p in platforms if want in p.name for d in p.get_devices()]
    if not devs:
        print("SKIP: no OpenCL device", file=sys.stderr)
        return 77
    ctx = cl.Context([devs[0]])
    q = cl.CommandQueue(ctx)
    rng = np.random.default_rng(7)
    n = 50000
    a_h = rng.random(n, dtype=np.float32) + 1
    b_h = rng.random(n, dtype=np.float32)
    a = cla.to_device(q, a_h)
    b = cla.to_device(q, b_h)
    c0 = layer_count("create")
    acc = cla.zeros_like(a)
    acc_h = np.zeros_like(a_h)
    iters = 60
    for i in range(iters):
        acc = acc + (a * 2 + b) * a - b / 3
        acc_h = acc_h + (a_h * 2 + b_h) * a_h - b_h / 3
        if i % 10 == 9:
            acc = acc * np.float32(0.5)
            acc_h = acc_h * np.float32(0.5)
    res = acc.get()
    made = layer_count("create") - c0 if c0 >= 0 else -1
    ok = np.allclose(res, acc_h, rtol=1e-4)
    print(f"R pyopencl close-to-numpy {ok}")
    print(f"R pyopencl sha1 {hashlib.sha1(res.tobytes()).hexdigest()}")
    # Buffers the program asked for: one per temporary.
    asked = iters * 6 + iters // 10 + 1
    print(f"pyopencl: about {asked} buffers asked for, {made} reached the driver", file=sys.stderr)
    failures = 0
    if not ok:
        print("FAIL: results differ from numpy", file=sys.stderr)
        failures += 1
    if made >= 0:
        if pooling() and made > asked // 4:
            print(f"FAIL: {made} driver creates under gpupool (asked {asked})", file=sys.stderr)
            failures += 1
        if not pooling() and made < asked:
            print(f"FAIL: only {made} driver creates without gpupool (asked {asked})", file=sys.stderr)
            failures += 1
    # A COPY_HOST_PTR buffer through PyOpenCL's Buffer API, and its info.
    host = np.arange(1000, dtype=np.int32)
    for _ in range(3):
        buf = cl.Buffer(ctx, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        back = np.empty_like(host)
        cl.enqueue_copy(q, back, buf)
        print(f"R pyopencl copy_host_ptr equal {np.array_equal(back, host)} size {buf.size} "
              f"flags {int(buf.flags)}")
        if not np.array_equal(back, host):
            failures += 1
        buf.release()
        q.finish()
    print(("FAIL" if failures else "PASS") + f" pyopencl (gpupool {'pooling' if pooling() else 'not pooling'})",
          file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
