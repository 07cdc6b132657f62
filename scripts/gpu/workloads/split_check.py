#!/usr/bin/env python3
"""GPUPOOL_SPLIT on the real driver, through the driver API (ctypes).

Phase one allocates four 8 MiB blocks and frees them; phase two asks for
eight blocks of 3 MiB + 100 bytes, a size phase one never used. Checked: the
bytes each block holds, cuMemGetAddressRange and RANGE_START_ADDR answering
for the block as for an allocation of its own, a freed block unallocated, a
second free the driver's INVALID_VALUE, cuIpcGetMemHandle refused with
NOT_SUPPORTED on a piece that shares its driver allocation (GPUPOOL_SPLIT)
and exact on one that has its own. Under gpupool it also reports the pool's
driver allocations (gpupool_stats_json). Prints PASS or FAIL lines and
exits 1 on a failure.

  [LD_PRELOAD=libgpupool.so [GPUPOOL_SPLIT=on]] python3 scripts/gpu/workloads/split_check.py
"""
import ctypes
import json
import os
import sys

cu = ctypes.CDLL("libcuda.so.1")
U64 = ctypes.c_uint64
failures = []


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def ok(r, what):
    if r != 0:
        print(f"FAIL {what}: CUresult {r}", flush=True)
        sys.exit(1)


def pool_stats():
    lib = ctypes.CDLL(None)
    try:
        fn = lib.gpupool_stats_json
    except AttributeError:
        return None
    fn.restype = ctypes.c_size_t
    buf = ctypes.create_string_buffer(1 << 20)
    n = fn(buf, len(buf))
    return json.loads(buf.value[:n].decode()) if n else None


def main():
    split_env = os.environ.get("GPUPOOL_SPLIT", "off")
    pooled = "libgpupool" in os.environ.get("LD_PRELOAD", "")
    # GPUPOOL_SEGMENTS=expandable splits from 1 MiB whatever GPUPOOL_SPLIT
    # says (config::split_min).
    expandable = os.environ.get("GPUPOOL_SEGMENTS", "") == "expandable"
    split = pooled and (expandable or split_env not in ("off", "0", "no", "false", ""))
    ok(cu.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ctx = ctypes.c_void_p()
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "set current")

    def alloc(n):
        p = U64()
        ok(cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)), f"cuMemAlloc {n}")
        return p.value

    def put(p, n, v):
        b = (ctypes.c_ubyte * n).from_buffer_copy(bytes([v]) * n)
        ok(cu.cuMemcpyHtoD_v2(U64(p), b, ctypes.c_size_t(n)), "HtoD")

    def holds(p, n, v):
        b = (ctypes.c_ubyte * n)()
        ok(cu.cuMemcpyDtoH_v2(b, U64(p), ctypes.c_size_t(n)), "DtoH")
        return bytes(b) == bytes([v]) * n

    def driver_allocs():
        s = pool_stats()
        return s["totals"]["backend_allocs"] if s else None

    big, piece = 8 << 20, (3 << 20) + 100
    a = [alloc(big) for _ in range(4)]
    for p in a:
        ok(cu.cuMemFree_v2(U64(p)), "free")
    ok(cu.cuCtxSynchronize(), "sync")
    before = driver_allocs()
    b = []
    for i in range(8):
        p = alloc(piece)
        put(p, piece, 0x40 + i)
        b.append(p)
    after = driver_allocs()
    if pooled:
        print(f"INFO driver allocations for phase two: {after - before}", flush=True)
        check((after - before == 0) == split, "phase two from phase one's memory iff split")
    spans = sorted((p, p + piece) for p in b)
    check(all(spans[k][1] <= spans[k + 1][0] for k in range(7)), "blocks disjoint")
    check(all(holds(p, piece, 0x40 + i) for i, p in enumerate(b)), "every block holds its bytes")
    base, size = U64(), ctypes.c_size_t()
    good = True
    for p in b:
        ok(cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), U64(p + 17)), "range")
        good &= base.value == p and size.value == piece
        start = U64()
        ok(cu.cuPointerGetAttribute(ctypes.byref(start), 11, U64(p + piece - 1)), "RANGE_START")
        good &= start.value == p
    check(good, "address range and RANGE_START_ADDR name each block")
    ok(cu.cuMemFree_v2(U64(b[1])), "free b1")
    ok(cu.cuMemFree_v2(U64(b[2])), "free b2")
    check(holds(b[0], piece, 0x40) and holds(b[3], piece, 0x43), "neighbours keep their bytes")
    r = cu.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), U64(b[1] + 5))
    check(r == 500, f"a freed block is unallocated (CUresult {r})")
    r = cu.cuMemFree_v2(U64(b[1]))
    check(r == 1, f"a second free is the driver's INVALID_VALUE (CUresult {r})")
    handle = (ctypes.c_char * 64)()
    r = cu.cuIpcGetMemHandle(handle, U64(b[3]))
    check(r == (801 if split else 0), f"IPC on a shared piece (CUresult {r})")
    whole = alloc(16 << 20)
    r = cu.cuIpcGetMemHandle(handle, U64(whole))
    check(r == 0, f"IPC on a block with its own allocation (CUresult {r})")
    ok(cu.cuMemFree_v2(U64(whole)), "free whole")
    for i in (0, 3, 4, 5, 6, 7):
        ok(cu.cuMemFree_v2(U64(b[i])), "free")
    ok(cu.cuCtxSynchronize(), "sync")
    print("RESULT " + json.dumps({"split": split, "pooled": pooled, "failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
