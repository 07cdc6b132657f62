#!/usr/bin/env python3
"""Allocation sites and the leak report (GPUPOOL_SITES, GPUPOOL_LEAKS), on
real programs under the preloaded library on PoCL: what the program's user
reads at exit, and what the trace records.

usage: run_sites.py native "SITES_PROGRAM;SITES_PROGRAM_NODEBUG" | python SITES_PYTHON
       | reload "SITES_RELOAD;LIB_A;LIB_B"
       | pyopencl "SITES_PYOPENCL;PYTHON;LAUNCHER"

GPUPOOL_TEST_DWARF=1: the build reads debug information (elfutils' libdw),
so frames of code built with -g name their source file and line."""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import bare_env, check, finish, sanitizer_runtime  # noqa: E402

CHECK, TARGET = sys.argv[1:3]
PRELOAD = os.environ["GPUPOOL_TEST_PRELOAD"]
DWARF = os.environ.get("GPUPOOL_TEST_DWARF") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, **extra):
    env = bare_env()
    env["LD_PRELOAD"] = PRELOAD
    env.update(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    check(r.returncode == 0 and "done" in r.stdout, f"{cmd} {extra}: exit {r.returncode}: {r.stderr[-2000:]}")
    return r


def leak_groups(stderr):
    """[(bytes text, blocks, group, [frame lines])] from the leak report."""
    groups, cur = [], None
    lines = stderr.splitlines()
    start = next((i for i, l in enumerate(lines) if " leaks: pid " in l), None)
    if start is None:
        return None
    for line in lines[start + 1:]:
        m = re.match(r"^  (\S+ \S+) in (\d+) blocks?, (\S+):$", line)
        if m:
            cur = (m.group(1), int(m.group(2)), m.group(3), [])
            groups.append(cur)
        elif line.startswith("      ") and cur:
            cur[3].append(line.strip())
        elif not line.startswith("  "):
            break
    return groups


def trace_sites(path):
    """(allocations with a site, allocations without, {site: [pcs]}, modules)."""
    with_site = without = 0
    sites, modules = {}, []
    for line in open(path):
        f = line.rstrip("\n").split(" ")
        if f[0] == "module":
            modules.append((int(f[2], 16), int(f[3], 16), " ".join(f[6:])))
        elif f[0] == "site":
            sites[int(f[1])] = [int(x, 16) for x in f[2].split(",")] if f[2] != "-" else []
        elif f[0] == "a":
            if len(f) == 9:
                check(int(f[8]) in sites, f"{path}: site {f[8]} named before it was declared")
                with_site += 1
            else:
                without += 1
    return with_site, without, sites, modules


def source_line(source, text):
    """The number of the one line of `source` that contains `text`."""
    (n,) = [i for i, l in enumerate(open(source), 1) if text in l]
    return n


def loaded_path(soname):
    """The file `soname` (libNAME.so.N) loads from here, or None."""
    try:
        ctypes.CDLL(soname)
    except OSError:
        return None
    name = soname.split(".so")[0]
    with open("/proc/self/maps") as maps:
        paths = [line.split(None, 5)[5].strip() for line in maps if len(line.split(None, 5)) == 6]
    # libdw.so.1 is a link to libdw-0.188.so.
    return next((p for p in paths if re.match(rf"{re.escape(name)}[.-]", os.path.basename(p))), None)


def function_of(frame):
    """keep_weights, from 'keep_weights+0x43 (prog)' or 'keep_weights (/src/prog.c:28)'."""
    return re.match(r"[^ +(]*", frame).group(0)


def native(targets):
    program, nodebug = targets.split(";")
    weights, scratch = 8, 200
    source = os.path.join(HERE, "sites_program.c")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t")
        r = run([program, str(weights), str(scratch)], GPUPOOL_SITES="all", GPUPOOL_LEAKS="1",
                GPUPOOL_TRACE_FILE=trace)
        groups = leak_groups(r.stderr)
        if check(groups, f"no leak report at exit: {r.stderr[-2000:]}"):
            # The kept buffers are the one group; released ones are not listed.
            check(len(groups) == 1 and groups[0][:2] == ("8.0 MiB", weights),
                  f"leak groups {[(g[0], g[1]) for g in groups]}, expected one of 8.0 MiB in {weights} blocks")
            frames = groups[0][3]
            if DWARF:
                # Built with -g: the source file and line of the allocating
                # call and of its caller's call.
                want = [f"keep_weights ({source}:{source_line(source, 'g_weights[i] = clCreateBuffer')})",
                        f"main ({source}:{source_line(source, '  keep_weights(weights);')})"]
                got = [f for f in frames if function_of(f) in ("keep_weights", "main")]
                check(got == want, f"the leaking site's frames {frames}: expected {want} among them")
            else:
                check(any(f.startswith("keep_weights+") for f in frames[:3]),
                      f"the leaking site's innermost frames {frames[:3]} do not name keep_weights")
            check(not any("scratch_loop" in f for g in groups for f in g[3]),
                  "scratch_loop's released buffers are listed as held")
        with_site, without, sites, modules = trace_sites(trace)
        allocs = weights + 2 * scratch
        check(with_site == allocs and without == 0,
              f"GPUPOOL_SITES=all: {with_site} allocations with a site, {without} without, of {allocs}")
        # Two sites in scratch_loop (a thread's stack differs from main's) and
        # one in keep_weights; every frame inside a declared module or not.
        check(3 <= len(sites) <= 6, f"{len(sites)} distinct sites for 3 call paths")
        prog = [m for m in modules if os.path.realpath(m[2]) == os.path.realpath(program)]
        check(prog, f"no module line for {program}: {modules}")
        covered = sum(1 for pcs in sites.values() for pc in pcs if any(a <= pc < b for a, b, _ in modules))
        total = sum(len(p) for p in sites.values())
        check(covered == total, f"{total - covered} of {total} frames outside every declared module")

        # Sampling: one allocation in 4, counted per thread.
        r = run([program, str(weights), str(scratch)], GPUPOOL_SITES="4", GPUPOOL_TRACE_FILE=trace)
        with_site, without, _, _ = trace_sites(trace)
        expected = scratch // 4 + (scratch + weights) // 4
        check(with_site == expected and with_site + without == allocs,
              f"GPUPOOL_SITES=4: {with_site} of {with_site + without} sampled, expected {expected} of {allocs}")
        # By bytes: one per 1 MiB asked for, at random points: about the
        # 20.5 MiB asked for / 1 MiB.
        r = run([program, str(weights), str(scratch)], GPUPOOL_SITES="1MiB", GPUPOOL_TRACE_FILE=trace)
        with_site, without, _, _ = trace_sites(trace)
        check(8 <= with_site <= 40, f"GPUPOOL_SITES=1MiB: {with_site} sampled of ~20 MiB asked for")

        # Leaks without sites: by pool group, and how to get sites.
        r = run([program, str(weights), str(scratch)], GPUPOOL_LEAKS="1")
        groups = leak_groups(r.stderr)
        check(groups and groups[0][:2] == ("8.0 MiB", weights) and "GPUPOOL_SITES=all" in r.stderr,
              f"GPUPOOL_LEAKS alone: {r.stderr[-1500:]}")
        # Without debug information: functions from the symbol table, and
        # their offsets.
        r = run([nodebug, str(weights), str(scratch)], GPUPOOL_SITES="all", GPUPOOL_LEAKS="1")
        groups = leak_groups(r.stderr)
        if check(groups, f"no leak report at exit (no debug information): {r.stderr[-2000:]}"):
            frames = groups[0][3]
            base = os.path.basename(nodebug)
            check(any(re.fullmatch(rf"keep_weights\+0x[0-9a-f]+ \({re.escape(base)}\)", f) for f in frames[:3])
                  and any(re.fullmatch(rf"main\+0x[0-9a-f]+ \({re.escape(base)}\)", f) for f in frames),
                  f"without debug information, frames {frames}: expected keep_weights+0x... and main+0x...")

        # Without libdw: the same. It is hidden behind an empty file in a
        # mount namespace of the test's own (the real file untouched), where
        # this machine lets a user make one.
        libdw = loaded_path("libdw.so.1")
        if DWARF and libdw and subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0:
            empty = os.path.join(tmp, "empty")
            open(empty, "w").close()
            r = run(["unshare", "-rm", "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                     empty, libdw, program, str(weights), str(scratch)], GPUPOOL_SITES="all", GPUPOOL_LEAKS="1")
            groups = leak_groups(r.stderr)
            base = os.path.basename(program)
            check(groups and any(re.fullmatch(rf"keep_weights\+0x[0-9a-f]+ \({re.escape(base)}\)", f)
                                 for f in groups[0][3][:3]),
                  f"without libdw, the leak report: {r.stderr[-1500:]}")
        else:
            print("note: libdw not hidden (no user namespaces here, or no libdw): that case not checked")

        # Nothing asked for, nothing printed.
        r = run([program, str(weights), str(scratch)])
        check(" leaks: " not in r.stderr, f"a leak report nobody asked for: {r.stderr[-500:]}")
        # A bad value: one message naming the variable, the value and what is accepted.
        r = run([program, "1", "1"], GPUPOOL_SITES="sometimes", GPUPOOL_LEAKS="1")
        msgs = [l for l in r.stderr.splitlines() if "GPUPOOL_SITES" in l and "sometimes" in l]
        check(len(msgs) == 1 and "64MiB" in msgs[0], f"bad GPUPOOL_SITES: {r.stderr[-1000:]}")


def python(script):
    n = 5
    line = next(i for i, l in enumerate(open(script), 1) if "# ALLOC LINE" in l)
    for mode in ("gil", "nogil", "subinterp"):
        r = run([sys.executable, script, mode, str(n)], GPUPOOL_SITES="all", GPUPOOL_LEAKS="1")
        groups = leak_groups(r.stderr)
        if not check(groups, f"{mode}: no leak report: {r.stderr[-2000:]}"):
            continue
        top = groups[0]
        check(top[:2] == ("5.0 MiB", n), f"{mode}: top group {top[:3]}, expected 5.0 MiB in {n} blocks")
        py = [f for f in top[3] if f.startswith("py ")]
        if mode == "gil":
            want = f"py  hold_buffers ({script}:{line})"
            check(py and py[0] == want, f"gil: Python frames {py[:3]}, expected {want!r} first")
            check(any(f.startswith("py  <module> (") for f in py), f"gil: no module frame in {py}")
        else:
            # The GIL was released: no Python frames may be taken, native ones are.
            check(not py and top[3], f"{mode}: frames {top[3][:4]}")


def reload(targets):
    """A library unloaded and another loaded at its addresses: the leak
    report and the trace name each allocation's own library."""
    program, lib_a, lib_b = targets.split(";")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "t")
        r = run([program, lib_a, lib_b], GPUPOOL_SITES="all", GPUPOOL_LEAKS="1",
                GPUPOOL_TRACE_FILE=trace)
        if not check("same addresses" in r.stdout,
                     f"the second library was not loaded where the first was: {r.stdout}"):
            return
        groups = leak_groups(r.stderr) or []
        inner = sorted((g[0], function_of(g[3][0]) if g[3] else "") for g in groups)
        check(inner == [("1.0 MiB", "alloc_in_a"), ("2.0 MiB", "alloc_in_b")],
              f"leak groups' innermost frames {inner}, expected alloc_in_a for 1 MiB and "
              f"alloc_in_b for 2 MiB: {r.stderr[-1500:]}")
        # The trace: each site's innermost pc in the last module declared
        # before it (docs/trace.md) is its own library.
        modules, owner = [], {}
        for line in open(trace):
            f = line.rstrip("\n").split(" ")
            if f[0] == "module":
                modules.append((int(f[2], 16), int(f[3], 16), os.path.basename(" ".join(f[6:]))))
            elif f[0] == "site" and f[2] != "-":
                pc = int(f[2].split(",")[0], 16)
                owner[int(f[1])] = next((m[2] for m in reversed(modules) if m[0] <= pc < m[1]), None)
            elif f[0] == "a" and len(f) == 9:
                owner.setdefault(("size", int(f[5])), owner.get(int(f[8])))
        got = (owner.get(("size", 1 << 20)), owner.get(("size", 2 << 20)))
        want = (os.path.basename(lib_a), os.path.basename(lib_b))
        check(got == want, f"trace: the allocations' innermost modules {got}, expected {want}")


def pyopencl(targets):
    """PyOpenCL's allocations, traced by `gpupool run --trace` and drawn by
    `gpupool report`: each row is labelled by the script's own line, not by
    PyOpenCL's code that made the call, whose frames stay in the stack."""
    script, python_exe, launcher = targets.split(";")
    lines = {what: source_line(script, f"# {what}:") for what in ("WEIGHTS", "SCRATCH", "RAW")}
    sanitizers = sanitizer_runtime(PRELOAD)
    env = bare_env("LD_PRELOAD")
    if sanitizers:
        env["LD_PRELOAD"] = sanitizers
    with tempfile.TemporaryDirectory() as tmp:
        trace, page = os.path.join(tmp, "t"), os.path.join(tmp, "r.html")
        r = subprocess.run([launcher, "run", "--trace", trace, "--set", "SITES=all", "--",
                            python_exe, script], capture_output=True, text=True, timeout=300, env=env)
        if not check(r.returncode == 0 and "done" in r.stdout, f"pyopencl: exit {r.returncode}: {r.stderr[-2000:]}"):
            return
        r = subprocess.run([launcher, "report", trace, "-o", page], capture_output=True, text=True,
                           timeout=300, env=env)
        if not check(r.returncode == 0, f"gpupool report: exit {r.returncode}: {r.stderr[-2000:]}"):
            return
        text = open(page).read()
        start = text.index('<script type="application/json" id="data">')
        data = json.loads(text[text.index(">", start) + 1:text.index("</script>", start)])
        # At the peak all three are held (Python releases them at exit).
        rows = {x["bytes"]: x for x in data["peak"]["sites"]}
        mib = 1 << 20
        for what, func, size in (("WEIGHTS", "load_weights", mib), ("SCRATCH", "make_scratch", 2 * mib),
                                 ("RAW", "raw_buffer", 3 * mib)):
            row = rows.get(size)
            if not check(row, f"pyopencl: no row of {size} bytes held at the end: {list(rows)}"):
                continue
            want = f"py {func} ({script}:{lines[what]})"
            check(row["label"] == want, f"pyopencl: the {what} row is labelled {row['label']!r}, expected {want!r}")
            check(want in row["frames"], f"pyopencl: {want!r} not among the {what} row's frames {row['frames']}")
        # The library's own frames are kept: to_device goes through
        # pyopencl/array.py.
        weights = rows.get(mib, {}).get("frames", [])
        check(any("/pyopencl/" in f for f in weights if f.startswith("py ")),
              f"pyopencl: PyOpenCL's frames left out of the stack: {weights}")


{"native": native, "python": python, "reload": reload, "pyopencl": pyopencl}[CHECK](TARGET)
finish()
print("ok")
