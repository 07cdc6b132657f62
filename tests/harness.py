"""What the Python test drivers (tests/*/run_*.py, tests/launcher/) share:
the failures they collect, and the environment they start programs from.

A driver finds this folder from its own place:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from harness import check, fail, finish  # noqa: E402
"""
import os
import sys

# Every failure seen so far; a driver goes on after one, to report them all.
failures = []


def fail(msg):
    failures.append(msg)
    print("FAILED:", msg, file=sys.stderr)


def check(cond, msg):
    """fail(msg) unless cond; cond, for the caller to go on or not."""
    if not cond:
        fail(msg)
    return cond


def finish():
    """Exits with status 1, saying how many, if anything failed."""
    if failures:
        sys.exit(f"{len(failures)} failure(s)")


def bare_env(*drop):
    """The test's environment without gpupool's settings (GPUPOOL_*) and
    the variables in `drop` (names, or prefixes such as "STANDIN_"): what a
    program is started from before the driver sets what it tests."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_",) + drop)}


def quoted(output, last=1500):
    """What a failure message quotes of a program's output: a sanitizer's
    report whole (ThreadSanitizer's first stack is what tells a flake's
    cause, and the last characters alone cut it off), else the last ones."""
    starts = [output.find(s) for s in ("WARNING: ThreadSanitizer", "ERROR: AddressSanitizer",
                                       "runtime error:")]
    at = min((i for i in starts if i >= 0), default=-1)
    return output[at:at + 12000] if at >= 0 else output[-last:]


def sanitizer_runtime(preload):
    """The sanitizer runtimes in a preload list (GPUPOOL_TEST_PRELOAD: in
    sanitizer builds they come before libgpupool): what a program run
    without gpupool still needs preloaded (the stand-in driver and the test
    programs are built with them)."""
    return ":".join(p for p in preload.split(":") if "libgpupool" not in os.path.basename(p))
