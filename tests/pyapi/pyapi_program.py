"""A Python program that uses `import gpupool` while it allocates OpenCL
buffers (PoCL, through ctypes, keeping the GIL so that its Python frames are
recorded as sites), and checks what the module says against what it did.
Prints one line per check that failed ("FAILED: ...") and "pyapi: N checks"
at the end; exits 1 if any failed, 77 without an OpenCL device.

usage: pyapi_program.py full|plain|envtrace|threads|disabled|nopreload TRACE_DIR
  full       GPUPOOL_LEAKS=1 GPUPOOL_SITES=all: every call, snapshot with sites
  plain      no option: stats, free_held, reset_peak, trace; snapshot refused
  envtrace   GPUPOOL_TRACE_FILE set: trace() refused until stop_trace()
  threads    calls from several threads while others allocate
  disabled   GPUPOOL_DISABLE=1: every call raises GpupoolError saying so
  nopreload  without the library: every call raises NotPreloadedError"""
import ctypes
import os
import sys
import threading

import gpupool

MODE, TRACE_DIR = sys.argv[1], sys.argv[2]
failed = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failed.append(what)
        print("FAILED:", what, flush=True)
    return cond


def raises(call, kind, *words):
    try:
        call()
    except kind as e:
        text = str(e)
        check(all(w in text for w in words), f"{call.__name__}: {kind.__name__} {text!r} lacks {words}")
        return text
    except Exception as e:  # noqa: BLE001: the wrong kind is the failure
        check(False, f"{call.__name__}: raised {type(e).__name__} {e!r}, not {kind.__name__}")
        return None
    check(False, f"{call.__name__}: did not raise {kind.__name__}")
    return None


def finish():
    print(f"pyapi: {checks} checks, {len(failed)} failed", flush=True)
    sys.exit(1 if failed else 0)


if MODE == "nopreload":
    check(not gpupool.available(), "available() without the library")
    for f in (gpupool.stats, gpupool.free_held, gpupool.stop_holding, gpupool.reset_peak,
              gpupool.snapshot, gpupool.stop_trace, gpupool.version,
              lambda: gpupool.start_trace(os.path.join(TRACE_DIR, "t")),
              lambda: gpupool.trace(os.path.join(TRACE_DIR, "t")).__enter__()):
        raises(f, gpupool.NotPreloadedError, "gpupool run", "LD_PRELOAD")
    check(issubclass(gpupool.NotPreloadedError, RuntimeError), "a RuntimeError")
    check(not os.listdir(TRACE_DIR), "no trace file written")
    finish()

if MODE == "disabled":
    check(gpupool.available(), "available() with the library loaded")
    for f in (gpupool.stats, gpupool.free_held, gpupool.reset_peak, gpupool.snapshot,
              lambda: gpupool.start_trace(os.path.join(TRACE_DIR, "t"))):
        text = raises(f, gpupool.GpupoolError, "GPUPOOL_DISABLE=1")
        check(text is None or "gpupool run" not in text, f"disabled is not 'not loaded': {text}")
    check(not os.listdir(TRACE_DIR), "no trace file written")
    finish()

# PyDLL keeps the GIL during the calls: the allocations' sites have Python frames.
cl = ctypes.PyDLL("libOpenCL.so.1")
vp = ctypes.c_void_p
cl.clCreateContext.restype = vp
cl.clCreateBuffer.restype = vp
cl.clCreateBuffer.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, vp, ctypes.POINTER(ctypes.c_int)]
cl.clReleaseMemObject.argtypes = [vp]
platform, device = vp(), vp()
if cl.clGetPlatformIDs(1, ctypes.byref(platform), None) != 0 or \
        cl.clGetDeviceIDs(platform, ctypes.c_uint64(0xFFFFFFFF), 1, ctypes.byref(device), None) != 0:
    print("no OpenCL device")
    sys.exit(77)
err = ctypes.c_int()
ctx = cl.clCreateContext(None, 1, ctypes.byref(device), None, None, ctypes.byref(err))
assert err.value == 0 and ctx


def create(size):
    mem = cl.clCreateBuffer(vp(ctx), 1, size, None, ctypes.byref(err))  # ALLOC LINE
    assert err.value == 0 and mem, err.value
    return mem


def release(mem):
    assert cl.clReleaseMemObject(vp(mem)) == 0


def totals():
    return gpupool.stats()["totals"]


if MODE == "threads":
    # Other threads allocate and free while this one calls every entry.
    stop = threading.Event()
    made = [0] * 4

    def churn(i):
        while not stop.is_set():
            release(create(1000 + 4096 * i))
            made[i] += 1

    workers = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
    for w in workers:
        w.start()
    path = os.path.join(TRACE_DIR, "threads.trace")
    for k in range(20):
        with gpupool.trace(path):
            gpupool.reset_peak()
            gpupool.stats()
        gpupool.free_held()
    stop.set()
    for w in workers:
        w.join()
    t = totals()
    check(t["hits"] + t["misses"] == sum(made), f"allocations counted: {t['hits']}+{t['misses']} of {sum(made)}")
    check(t["active_blocks"] == 0, f"nothing active: {t['active_blocks']}")
    with open(path) as f:
        lines = f.read().splitlines()
    check(lines[-1].startswith("# end "), f"the last trace ends: {lines[-1]!r}")
    finish()

# stats(): what the program holds, per arena and in total.
sizes = [1000, 70000, 1 << 20, 3 << 20, 12345]
before = totals()
bufs = [create(s) for s in sizes]
s = gpupool.stats()
t = s["totals"]
check(s["version"] == 2 and s["reason"] == "api", f"schema {s['version']}, reason {s['reason']}")
check(t["active_blocks"] == 5, f"active_blocks {t['active_blocks']}")
check(t["active_bytes"] == sum(sizes), f"active_bytes {t['active_bytes']} != {sum(sizes)}")
check(t["hits"] + t["misses"] - before["hits"] - before["misses"] == 5, "5 allocations counted")
check(t["managed_bytes"] >= t["active_bytes"], "managed covers active")
opencl = [a for a in s["arenas"] if a["kind"] == "opencl"]
check(len(opencl) == 1 and opencl[0]["stats"]["active_bytes"] == sum(sizes),
      f"one OpenCL arena holding them: {[(a['name'], a['stats']['active_bytes']) for a in opencl]}")
summed = {k: sum(a["stats"][k] for a in s["arenas"]) for k in t}
check(summed == t, "totals are the arenas' sum")
check(gpupool.version() == s["gpupool"], f"version {gpupool.version()} against {s['gpupool']}")

# free_held(): the three freed are held, then given back.
for mem in bufs[2:]:
    release(mem)
t = totals()
check(t["held_blocks"] == 3 and t["held_bytes"] >= sum(sizes[2:]), f"held {t['held_blocks']} / {t['held_bytes']}")
frees_before = t["backend_frees"]
gpupool.free_held()
t = totals()
check(t["held_blocks"] == 0 and t["held_bytes"] == 0, f"after free_held: held {t['held_blocks']} / {t['held_bytes']}")
check(t["backend_frees"] == frees_before + 3, f"backend_frees {frees_before} -> {t['backend_frees']}")
check(t["active_bytes"] == sum(sizes[:2]), "the live blocks stay")
bufs = bufs[:2]

# reset_peak(): every peak down to its current value.
check(t["peak_active_bytes"] >= sum(sizes), f"peak_active_bytes {t['peak_active_bytes']} before the reset")
gpupool.reset_peak()
t = totals()
for k in ("active_blocks", "active_bytes", "held_blocks", "held_bytes", "managed_bytes"):
    check(t["peak_" + k] == t[k], f"after reset_peak: peak_{k} {t['peak_' + k]} != {k} {t[k]}")
big = create(5 << 20)
release(big)
t = totals()
check(t["peak_active_bytes"] == sum(sizes[:2]) + (5 << 20), f"peak after one more: {t['peak_active_bytes']}")
check(t["peak_active_blocks"] == 3, f"peak_active_blocks {t['peak_active_blocks']}")
gpupool.free_held()

# trace(): started and stopped at run time.
path = os.path.join(TRACE_DIR, "pyapi.gpupool-trace")
if MODE == "envtrace":
    raises(lambda: gpupool.start_trace(path), gpupool.GpupoolError, "already running", "GPUPOOL_TRACE_FILE")
    check(not os.path.exists(path), "the refused trace wrote nothing")
    stopped = gpupool.stop_trace()
    check(stopped == os.environ["GPUPOOL_TRACE_FILE"], f"stop_trace gave {stopped}")
    with open(stopped) as f:
        check(f.read().splitlines()[-1].startswith("# end "), "GPUPOOL_TRACE_FILE's trace ended")
raises(gpupool.stop_trace, gpupool.GpupoolError, "no trace is running")
raises(lambda: gpupool.start_trace(os.path.join(TRACE_DIR, "no-such-dir", "t")), gpupool.GpupoolError, "no-such-dir")
raises(lambda: gpupool.start_trace(""), gpupool.GpupoolError)
with gpupool.trace(path) as written:
    check(written == path, f"trace() writes {written}")
    raises(lambda: gpupool.start_trace(path + "2"), gpupool.GpupoolError, "already running", path)
    traced = [create(s) for s in (4096, 100000, 300000)]
    release(traced.pop())
    release(bufs.pop())  # allocated before the trace began
after_trace = create(2000)  # not in it
release(after_trace)
with open(path) as f:
    lines = f.read().splitlines()
allocs = [l for l in lines if l.startswith("a ")]
frees = [l for l in lines if l.startswith("f ")]
check("# attached" in lines, "the trace says it was attached")
check(lines[-1].startswith("# end "), f"the trace ends: {lines[-1]!r}")
check([int(l.split()[5]) for l in allocs] == [4096, 100000, 300000], f"allocations traced: {allocs}")
check(len(frees) == 2, f"frees traced: {frees}")
raises(gpupool.stop_trace, gpupool.GpupoolError, "no trace is running")

# snapshot(): the live blocks, their sites.
live = {int(m): n for m, n in zip(bufs + traced, [sizes[0], 4096, 100000])}
if MODE == "full":
    # Enough blocks that the answer outgrows the module's first buffer.
    many = [create(64) for _ in range(1000)]
    live.update((int(m), 64) for m in many)
    snap = gpupool.snapshot()
    blocks = {b["handle"]: b for b in snap["blocks"]}
    check(set(blocks) == set(live), f"snapshot handles {sorted(blocks)} != {sorted(live)}")
    for handle, size in live.items():
        b = blocks.get(handle)
        if not check(b is not None, f"block {handle:#x} in the snapshot"):
            continue
        check(b["requested"] == size and b["size"] >= size, f"block {handle:#x}: {b}")
        arena = snap["arenas"].get(b["arena"], {})
        check(arena.get("kind") == "opencl", f"block {handle:#x}'s arena: {b['arena']} {arena}")
        frames = b["frames"] or []
        here = [f for f in frames if f.startswith("py ") and "pyapi_program.py:" in f]
        check(here and " create" in here[0], f"block {handle:#x}: the Python frame of create(): {frames[:4]}")
else:
    raises(gpupool.snapshot, gpupool.GpupoolError, "GPUPOOL_LEAKS=1")

# stop_holding(): a free goes to the driver at once.
gpupool.stop_holding()
frees_before = totals()["backend_frees"]
release(traced.pop(0))
t = totals()
check(t["held_blocks"] == 0 and t["backend_frees"] == frees_before + 1, f"after stop_holding: {t['held_blocks']} held")
check(gpupool.stats()["holding"] is False, "holding is false")
finish()
