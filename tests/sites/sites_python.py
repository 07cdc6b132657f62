"""A Python program whose allocation sites are known, calling OpenCL (PoCL)
through ctypes: hold_buffers() keeps its buffers (the leak). With `gil`,
through ctypes.PyDLL, which keeps the GIL during the call (as C extensions
such as PyTorch's and CuPy's do); with `nogil`, through ctypes.CDLL, which
releases it (no Python frames can be taken then). `subinterp` is `nogil`
after a subinterpreter was created, which turns PyGILState_Check's own check
off for the rest of the process (it then says yes on every thread).

usage: sites_python.py gil|nogil|subinterp N"""
import ctypes
import sys

mode, n = sys.argv[1], int(sys.argv[2])
if mode == "subinterp":
    try:
        import _xxsubinterpreters as interpreters
    except ImportError:
        import _interpreters as interpreters
    interpreters.destroy(interpreters.create())
lib = (ctypes.PyDLL if mode == "gil" else ctypes.CDLL)("libOpenCL.so.1")
vp = ctypes.c_void_p
lib.clCreateContext.restype = vp
lib.clCreateBuffer.restype = vp
lib.clCreateBuffer.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, vp, ctypes.POINTER(ctypes.c_int)]

platform, device = vp(), vp()
assert lib.clGetPlatformIDs(1, ctypes.byref(platform), None) == 0
assert lib.clGetDeviceIDs(platform, ctypes.c_uint64(0xFFFFFFFF), 1, ctypes.byref(device), None) == 0
err = ctypes.c_int()
ctx = lib.clCreateContext(None, 1, ctypes.byref(device), None, None, ctypes.byref(err))
assert err.value == 0 and ctx


def hold_buffers(count):
    kept = []
    for _ in range(count):
        kept.append(lib.clCreateBuffer(vp(ctx), 1, 1 << 20, None, ctypes.byref(err)))  # ALLOC LINE
        assert err.value == 0
    return kept


held = hold_buffers(n)
print("done", flush=True)
