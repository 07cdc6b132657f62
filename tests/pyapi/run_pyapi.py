#!/usr/bin/env python3
"""`import gpupool` in real Python programs on PoCL: pyapi_program.py in each
of its modes, under the preloaded library (and once without it), with the
module from the source tree (PYTHONPATH); then the trace it started read by
`gpupool report --text`.

usage: run_pyapi.py MODE PYTHON LAUNCHER   (GPUPOOL_TEST_PRELOAD: the library)"""
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from harness import bare_env, check, finish  # noqa: E402

MODE, PYTHON, LAUNCHER = sys.argv[1:4]
HERE = os.path.dirname(os.path.abspath(__file__))
MODULE_DIR = os.path.join(HERE, "..", "..", "python")
PROGRAM = os.path.join(HERE, "pyapi_program.py")


with tempfile.TemporaryDirectory() as tmp:
    env = bare_env("LD_PRELOAD")
    env["PYTHONPATH"] = os.path.abspath(MODULE_DIR)
    if MODE != "nopreload":
        env["LD_PRELOAD"] = os.environ["GPUPOOL_TEST_PRELOAD"]
    if MODE == "full":
        env.update(GPUPOOL_LEAKS="1", GPUPOOL_SITES="all")
    if MODE == "disabled":
        env["GPUPOOL_DISABLE"] = "1"
    if MODE == "envtrace":
        env["GPUPOOL_TRACE_FILE"] = os.path.join(tmp, "from-env.gpupool-trace")
    r = subprocess.run([PYTHON, PROGRAM, MODE, tmp], env=env, capture_output=True, text=True,
                       timeout=300)
    print(r.stdout, end="")
    if r.returncode == 77:
        print("SKIP: no OpenCL device")
        sys.exit(77)
    check(r.returncode == 0 and "0 failed" in r.stdout,
          f"{MODE}: exit {r.returncode}\n{r.stderr[-3000:]}")
    trace = os.path.join(tmp, "pyapi.gpupool-trace")
    if MODE in ("full", "plain", "envtrace"):
        # Read as any trace: the frees of blocks from before it began are
        # left out without a word, the three allocations are there, and
        # what the program still held at the trace's end is listed.
        rep = subprocess.run([LAUNCHER, "report", "--text", trace], capture_output=True, text=True,
                             timeout=120)
        print(rep.stdout[-1500:], end="")
        check(rep.returncode == 0, f"report --text: exit {rep.returncode}: {rep.stderr}")
        check("do not pair" not in rep.stderr, f"report --text complains: {rep.stderr}")
        # (A line longer than 100 columns goes on, indented, on the next.)
        check("3 allocations" in re.sub(r"\n {4,}", " ", rep.stdout),
              f"report --text: not 3 allocations:\n{rep.stdout}")
        leak = subprocess.run([LAUNCHER, "report", "--text", "--fail-on-leak", trace],
                              capture_output=True, text=True, timeout=120)
        check(leak.returncode == 8, f"--fail-on-leak: exit {leak.returncode} (2 blocks still held)")
    if MODE == "full":
        check(" leaks: pid " in r.stderr, "GPUPOOL_LEAKS's exit report")

finish()
print(f"pyapi.{MODE}: ok")
