"""Legacy CUDA IPC as programs use it, on a real GPU: run it without gpupool,
then with LD_PRELOAD=libgpupool.so (and GPUPOOL_SEGMENTS=expandable, whose
pieces gpupool exports with its own handle). Every check prints one line,
"ok NAME" or "FAIL NAME: why"; the exit status is the number of failures.

  python3 tests/gpu/ipc_check.py [torch] [cupy]

torch: PyTorch multiprocessing (spawn) with CUDA tensors of 3 MiB and
64 MiB: the consumer sees the producer's values and its writes reach the
producer. cupy: cudaIpcGetMemHandle on cudaMalloc'd memory (and on an
interior pointer: its allocation, opened at its start), opened by a spawned
process with cudaIpcOpenMemHandle; opened twice gives one pointer;
written both ways; an open after the exporter freed it fails.
"""
import multiprocessing as mp
import os
import sys
import traceback

FAILS = 0


def say(name, ok, why=""):
    global FAILS
    print(("ok " if ok else "FAIL ") + name + ("" if ok else ": " + why), flush=True)
    FAILS += 0 if ok else 1


# ---- PyTorch -------------------------------------------------------------

def torch_consumer(q, r):
    import torch
    try:
        t = q.get(timeout=60)
        ok = bool((t == 7).all().item())
        t[: 256 * 1024].fill_(3)
        torch.cuda.synchronize()
        r.put((ok, ""))
        del t
    except Exception:
        r.put((False, traceback.format_exc()[-400:]))


def torch_checks():
    import torch
    ctx = mp.get_context("spawn")
    for name, n in (("torch.3MiB", 3 * 2**20 // 4 + 25), ("torch.64MiB", 64 * 2**20 // 4)):
        t = torch.full((n,), 7.0, device="cuda")
        q, r = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=torch_consumer, args=(q, r))
        p.start()
        q.put(t)
        try:
            ok, why = r.get(timeout=120)
        except Exception as e:
            ok, why = False, "no answer: %r" % e
        p.join(60)
        torch.cuda.synchronize()
        back = bool((t[: 256 * 1024] == 3).all().item()) and bool((t[256 * 1024:] == 7).all().item())
        say(name, ok and back and p.exitcode == 0,
            "consumer saw values %s, producer saw writes %s, exit %s %s" % (ok, back, p.exitcode, why))
        del t


# ---- CuPy ----------------------------------------------------------------

def cupy_child(handle, offset, n, r, twice):
    import cupy as cp
    try:
        base = cp.cuda.runtime.ipcOpenMemHandle(handle)
        if twice:
            again = cp.cuda.runtime.ipcOpenMemHandle(handle)
            if again != base:
                r.put((False, "opened twice: %x and %x" % (base, again)))
                return
        mem = cp.cuda.UnownedMemory(base, offset + n, None)
        a = cp.ndarray((n // 4,), cp.float32, cp.cuda.MemoryPointer(mem, offset))
        ok = bool((a == 5).all())
        a[:1000] = 9
        cp.cuda.runtime.deviceSynchronize()
        del a, mem
        cp.cuda.runtime.ipcCloseMemHandle(base)
        r.put((ok, "" if ok else "values differ"))
    except Exception as e:
        r.put((False, repr(e)[:300]))


def cupy_open_fails(handle, r):
    import cupy as cp
    try:
        cp.cuda.runtime.ipcOpenMemHandle(handle)
        r.put((False, "opened"))
    except Exception as e:
        r.put((True, repr(e)[:200]))


def cupy_checks():
    import cupy as cp
    ctx = mp.get_context("spawn")
    for name, n, inner in (("cupy.3MiB", 3 * 2**20 + 512, 0), ("cupy.256MiB.interior", 256 * 2**20, 4096)):
        p0 = cp.cuda.runtime.malloc(n)
        a = cp.ndarray((n // 4,), cp.float32, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(p0, n, None), 0))
        a[:] = 5
        cp.cuda.runtime.deviceSynchronize()
        h = cp.cuda.runtime.ipcGetMemHandle(p0 + inner)
        r = ctx.Queue()
        p = ctx.Process(target=cupy_child, args=(h, inner, n - inner, r, True))
        p.start()
        try:
            ok, why = r.get(timeout=120)
        except Exception as e:
            ok, why = False, "no answer: %r" % e
        p.join(60)
        back = bool((a[inner // 4: inner // 4 + 1000] == 9).all()) and bool((a[inner // 4 + 1000:] == 5).all())
        say(name, ok and back and p.exitcode == 0, "child %s (%s), writes seen %s" % (ok, why, back))
        pre = os.environ.pop("LD_PRELOAD", None)
        if pre:  # an importer without gpupool: the driver's own error for the handle
            p = ctx.Process(target=cupy_open_fails, args=(h, r))
            p.start()
            os.environ["LD_PRELOAD"] = pre
            failed, why = r.get(timeout=120)
            p.join(60)
            # gpupool's own handle (a range piece) means nothing to the
            # driver; a binned block's is the driver's.
            expect = os.environ.get("GPUPOOL_SEGMENTS") == "expandable"
            say(name + ".importer_without_gpupool", failed == expect, why)
            print("   (without gpupool: %s)" % why)
        del a
        cp.cuda.runtime.free(p0)
        cp.cuda.runtime.deviceSynchronize()
        p = ctx.Process(target=cupy_open_fails, args=(h, r))
        p.start()
        ok, why = r.get(timeout=120)
        p.join(60)
        say(name + ".after_free", ok, why)
        if ok:
            print("   (the driver's answer: %s)" % why)


if __name__ == "__main__":
    which = sys.argv[1:] or ["torch", "cupy"]
    print("LD_PRELOAD=%s GPUPOOL_SEGMENTS=%s" % (os.environ.get("LD_PRELOAD", ""),
                                                os.environ.get("GPUPOOL_SEGMENTS", "")), flush=True)
    for w in which:
        try:
            {"torch": torch_checks, "cupy": cupy_checks}[w]()
        except Exception:
            say(w, False, traceback.format_exc()[-600:])
    sys.exit(FAILS)
