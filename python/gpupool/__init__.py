"""The gpupool pool of this process, from Python.

gpupool pools the GPU allocations of unmodified programs from a preloaded
library, ``libgpupool.so`` (``gpupool run -- python train.py``, or
``LD_PRELOAD=/path/to/libgpupool.so``). This module talks to that library,
already loaded in the process, through its C API (docs/c-api.md): it never
loads a copy of its own and needs nothing but the standard library.

In PyTorch's and RMM's words:

==================================================  =============================
PyTorch / RMM                                       gpupool
==================================================  =============================
``torch.cuda.memory_stats()``, RMM's                :func:`stats`
``statistics_resource_adaptor.allocation_counts``
``torch.cuda.reset_peak_memory_stats()``            :func:`reset_peak`
``torch.cuda.empty_cache()``                        :func:`free_held`
``torch.cuda.memory._snapshot()``                   :func:`snapshot`
``torch.cuda.memory._record_memory_history()``,     :func:`trace`
RMM's ``logging_resource_adaptor``
==================================================  =============================

In a program where the library is not loaded, importing works and every
call raises :class:`NotPreloadedError`.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Union, cast

__all__ = [
    "GpupoolError",
    "NotPreloadedError",
    "available",
    "version",
    "stats",
    "free_held",
    "stop_holding",
    "reset_peak",
    "trace",
    "start_trace",
    "stop_trace",
    "snapshot",
]


class GpupoolError(RuntimeError):
    """A gpupool call that was refused; the message says why."""


class NotPreloadedError(GpupoolError):
    """libgpupool.so is not loaded in this process."""


_NOT_LOADED = (
    "libgpupool.so is not loaded in this process, so there is no pool to ask: "
    "run the program under `gpupool run -- python ...`, or with "
    "LD_PRELOAD=/path/to/libgpupool.so"
)

_lib: Optional[ctypes.CDLL] = None


def _loaded_path() -> Optional[str]:
    """The file of the libgpupool.so mapped into this process, if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) == 6 and os.path.basename(fields[5].strip()).startswith("libgpupool.so"):
                    return fields[5].strip()
    except OSError:
        pass
    return None


def _find() -> Optional[ctypes.CDLL]:
    # Preloaded, its symbols are in the global scope.
    lib = ctypes.CDLL(None)
    if hasattr(lib, "gpupool_stats_json"):
        return lib
    # Loaded some other way (dlopen with RTLD_LOCAL): that copy, by its path,
    # and only if it is already there (RTLD_NOLOAD never loads a second one).
    path = _loaded_path()
    if path is None:
        return None
    try:
        return ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = _find()
        if lib is None:
            raise NotPreloadedError(_NOT_LOADED)
        _lib = lib
    return _lib


def _function(name: str, restype: Any, argtypes: List[Any]) -> Callable[..., Any]:
    lib = _library()
    try:
        f = getattr(lib, name)
    except AttributeError:
        raise GpupoolError(
            f"the loaded libgpupool.so (version {version()}) has no {name}: it is older "
            "than this gpupool module; use the library of the same release"
        ) from None
    f.restype = restype
    f.argtypes = argtypes
    return cast(Callable[..., Any], f)


def _active() -> None:
    if not _function("gpupool_active", ctypes.c_int, [])():
        raise GpupoolError("gpupool is loaded but disabled in this process (GPUPOOL_DISABLE=1)")


def _json(name: str) -> Dict[str, Any]:
    """A gpupool_*_json call's object, read again into a larger buffer
    when it did not fit (each call renders it anew)."""
    _active()
    f = _function(name, ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t])
    size = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(size)
        n = f(buf, size)
        if n == 0:
            raise GpupoolError(f"{name} gave nothing (gpupool disabled, or out of host memory)")
        if n < size:
            obj: Dict[str, Any] = json.loads(buf.value.decode("utf-8", "replace"))
            return obj
        size = n + 4096


def _action(name: str, what: str) -> None:
    _active()
    if _function(name, ctypes.c_int, [])() != 0:
        raise GpupoolError(f"gpupool refused {what}: the process is exiting")


def available() -> bool:
    """Whether libgpupool.so is loaded in this process (no exception)."""
    try:
        _library()
        return True
    except NotPreloadedError:
        return False


def version() -> str:
    """The loaded library's version, such as ``"0.1.0"``."""
    f = getattr(_library(), "gpupool_version")
    f.restype = ctypes.c_char_p
    f.argtypes = []
    return str(f().decode())


def stats() -> Dict[str, Any]:
    """The pool's counters now: one stats dump (docs/stats.md, schema version 2).

    ``stats()["totals"]`` has every counter summed over the arenas
    (``active_bytes``: what the program holds, as
    ``torch.cuda.memory_allocated()`` counts it; ``managed_bytes``: what the
    pool has from the driver, as ``torch.cuda.memory_reserved()``;
    ``peak_*``, ``hits``, ``misses``...), and ``stats()["arenas"]`` the same
    per arena (a CUDA context's device memory, pinned memory, an OpenCL
    context), with its ``name``, ``kind``, ``device`` and ``stats``.
    """
    return _json("gpupool_stats_json")


def free_held() -> None:
    """Give every block the pool holds for reuse back to the driver.

    PyOpenCL's ``MemoryPool.free_held()``; PyTorch's
    ``torch.cuda.empty_cache()``. Holding goes on: later frees are held again.
    """
    _action("gpupool_free_held", "free_held")


def stop_holding() -> None:
    """Give back what the pool holds, and hold nothing from now on.

    PyOpenCL's ``MemoryPool.stop_holding()``: every later free goes to the
    driver at once (the pool still serves what the program asks). There is
    no call to start holding again.
    """
    _action("gpupool_stop_holding", "stop_holding")


def reset_peak() -> None:
    """Bring every peak counter (``peak_*``) down to its current value.

    PyTorch's ``torch.cuda.reset_peak_memory_stats()``: of every arena, of
    each thread's share of it (the stats' peaks are the sum of per-thread
    peaks) and of the destroyed arenas' rows; for stream-ordered pools
    (``cuda-async`` arenas), the driver's high-water marks. Other counters
    (hits, misses, driver calls) go on.
    """
    _action("gpupool_reset_peak", "reset_peak")


def _trace_call(name: str, *args: Any) -> str:
    _active()
    argtypes: List[Any] = [ctypes.c_char_p] * len(args) + [ctypes.c_char_p, ctypes.c_size_t]
    f = _function(name, ctypes.c_int, argtypes)
    msg = ctypes.create_string_buffer(4096)
    rc = f(*args, msg, len(msg))
    text = msg.value.decode("utf-8", "replace")
    if rc != 0:
        raise GpupoolError(text)
    return text


def start_trace(path: Union[str, "os.PathLike[str]"]) -> str:
    """Start recording every allocation and free into ``path`` (docs/trace.md).

    Returns the file written: ``path``, or its sibling ``NAME.PID.EXT`` when
    another live process writes ``path``. Raises :class:`GpupoolError` when
    a trace is already running (``GPUPOOL_TRACE_FILE``, or an earlier
    start_trace not stopped) or the file cannot be written; nothing changes
    then. The trace says it started while the program ran (``# attached``):
    frees of blocks allocated before it are left out by readers.
    """
    p = os.fsencode(os.path.abspath(os.fspath(path)))
    if not p or b"\0" in p:
        raise GpupoolError(f"not a file name: {path!r}")
    return _trace_call("gpupool_trace_start", p)


def stop_trace() -> str:
    """Stop the running trace (also GPUPOOL_TRACE_FILE's); returns its file.

    Its last line is ``# end``, as at exit; ``gpupool report FILE`` reads
    it. Raises :class:`GpupoolError` when no trace is running.
    """
    return _trace_call("gpupool_trace_stop")


@contextlib.contextmanager
def trace(path: Union[str, "os.PathLike[str]"]) -> Iterator[str]:
    """Trace the allocations and frees of a block of code::

        with gpupool.trace("step.gpupool-trace") as written:
            train_step()
        # gpupool report --text step.gpupool-trace

    Yields the file written (see :func:`start_trace`); the trace stops when
    the block ends, also on an exception.
    """
    written = start_trace(path)
    try:
        yield written
    finally:
        stop_trace()


def snapshot() -> Dict[str, Any]:
    """The blocks the program holds now, as ``torch.cuda.memory._snapshot()``.

    ``snapshot()["blocks"]`` lists each live block: ``arena`` (its arena's
    name, described in ``snapshot()["arenas"]``: ``kind``, ``group``,
    ``device``), ``handle`` (the device pointer, host pointer or cl_mem, as
    an int), ``requested`` (what the program asked for), ``size`` (what the
    block is), and ``frames``: its allocation's call stack, innermost first
    (``py  FILE:LINE FUNC`` for Python frames), where GPUPOOL_SITES recorded
    it, else None.

    Needs GPUPOOL_LEAKS=1 (``gpupool run --leaks``), which keeps the record
    of live blocks (it also lists them at exit); raises
    :class:`GpupoolError` without it.
    """
    snap = _json("gpupool_snapshot_json")
    if not snap.get("tracked"):
        raise GpupoolError(
            "snapshot() needs the record of live blocks that GPUPOOL_LEAKS=1 keeps "
            "(gpupool run --leaks; add --set GPUPOOL_SITES=all for their call stacks)"
        )
    stacks = snap.pop("stacks", {})
    for block in snap["blocks"]:
        site = block.get("site")
        block["frames"] = stacks.get(str(site)) if site is not None else None
    return snap
