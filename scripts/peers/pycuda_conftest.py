"""conftest.py that run.sh puts beside PyCUDA's test files (its sdist's test/).

PyCUDA caches nvcc's output in one directory per user and writes each entry
with a plain open()/write(): two processes of one run (pytest-xdist
workers) could read an entry that another is still writing. Each worker
therefore gets its own cache, under PEERS_PYCUDA_CACHE, which run.sh gives
each run (without / with gpupool) separately: the two runs compile the same
kernels and share nothing. Nothing else of PyCUDA's harness is changed.
"""
import os

_base = os.environ.get("PEERS_PYCUDA_CACHE")
if _base:
    _dir = os.path.join(_base, os.environ.get("PYTEST_XDIST_WORKER", "main"))
    os.makedirs(_dir, exist_ok=True)
    os.environ["PYCUDA_CACHE_DIR"] = _dir


def pytest_report_header(config):
    return f"peers: PYCUDA_CACHE_DIR={os.environ.get('PYCUDA_CACHE_DIR', '(PyCUDA default)')}"
