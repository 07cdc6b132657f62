"""pytest plugin for CuPy's own tests with CuPy's pools off (-p peers_cupy_nopool).

CuPy has no environment variable that turns its memory pools off; this
plugin, loaded in every process of the run (pytest-xdist passes -p on to its
workers), does what CuPy's documentation gives for that before any test
runs: cupy.cuda.set_allocator(None) (device memory straight from
cudaMalloc / cudaFree) and cupy.cuda.set_pinned_memory_allocator(None)
(pinned host memory straight from cudaHostAlloc). Tests of the pools
themselves (cuda_tests/test_memory.py) make their own MemoryPool objects
and still test them.
"""
import cupy

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)


def pytest_report_header(config):
    return "peers: CuPy pools off (set_allocator(None), set_pinned_memory_allocator(None))"
