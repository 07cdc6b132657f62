#!/usr/bin/env python3
"""Signals against a real OpenCL program (cl_workload on PoCL) running with
the preloaded library (GPUPOOL_TEST_PRELOAD).

usage: run_shim.py CL_WORKLOAD SCHEMA storm THREADS SECONDS | signals | api THREADS ROUNDS
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupool_check  # noqa: E402
from harness import bare_env, fail, finish  # noqa: E402

workload, schema_path, scenario, *args = sys.argv[1:]
with open(schema_path) as f:
    SCHEMA = json.load(f)


def start(argv, env_extra):
    env = bare_env()
    env["LD_PRELOAD"] = os.environ["GPUPOOL_TEST_PRELOAD"]
    env.update(env_extra)
    p = subprocess.Popen([workload] + argv, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        out, err = p.communicate(timeout=120)
        sys.exit(f"FAILED: workload did not start: {line}{out}{err}")
    return p


def dumps(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line for line in f if line.strip()]


def wait_dump(path, count, seconds=60, must_come=True):
    """Waits (generously by default: only a hang fails) for the count-th dump."""
    for _ in range(int(seconds * 100)):
        lines = dumps(path)
        if len(lines) >= count:
            doc, errors = gpupool_check.validate_dump(lines[count - 1], SCHEMA)
            for e in errors:
                fail(e)
            return doc
        time.sleep(0.01)
    if must_come:
        fail(f"dump {count} never came")
    return None


def opencl(doc):
    t = {"held_blocks": 0, "held_bytes": 0, "active_blocks": 0, "hits": 0, "misses": 0}
    for b in doc["arenas"]:
        if b["kind"] == "opencl":
            for k in t:
                t[k] += b["stats"][k]
    return t


def final_stats(out):
    for line in out.splitlines():
        if line.startswith("stats: {"):
            doc, errors = gpupool_check.validate_dump(line[len("stats: "):], SCHEMA)
            for e in errors:
                fail(e)
            return doc
    fail("the program printed no gpupool stats (is gpupool loaded?)")
    return None


with tempfile.TemporaryDirectory() as tmp:
    stats = os.path.join(tmp, "stats.json")
    env = {"GPUPOOL_STATS_FILE": stats, "GPUPOOL_STATS_FORMAT": "json"}

    if scenario == "storm":
        threads, seconds = args
        p = start(["storm", threads, seconds], env)
        sent = 0
        while p.poll() is None:
            try:
                os.kill(p.pid, signal.SIGUSR2 if sent % 2 else signal.SIGUSR1)
            except ProcessLookupError:
                break
            sent += 1
            time.sleep(0.001)
        out, err = p.communicate(timeout=300)
        sys.stderr.write(err)
        if p.returncode != 0:
            fail(f"workload exited {p.returncode} after {sent} signals")
        doc = final_stats(out)
        if doc:
            t = opencl(doc)
            print(f"storm: {sent} signals, {out.splitlines()[-2]}, OpenCL: {t}")
            if t["active_blocks"] != 0:
                fail(f"active blocks left: {t}")
            if t["hits"] + t["misses"] == 0:
                fail("no OpenCL allocation went through the pool")
        n = len(dumps(stats))
        for i in range(n):
            wait_dump(stats, i + 1)
        if n < 2:
            fail(f"only {n} dumps after {sent} signals")
        print(f"storm: {n} dumps validated")

    elif scenario == "api":
        # gpupool's C API from the main thread while the others allocate:
        # traces started and stopped, peaks reset, stats and snapshots read
        # (with the record of live blocks and sampled sites on).
        threads, rounds = args
        trace = os.path.join(tmp, "api.trace")
        p = start(["api", threads, rounds, trace], dict(env, GPUPOOL_LEAKS="1", GPUPOOL_SITES="16"))
        out, err = p.communicate(timeout=300)
        sys.stderr.write(err[-3000:])
        if p.returncode != 0:
            fail(f"workload exited {p.returncode}")
        doc = final_stats(out)
        made = next((int(l.split()[1]) for l in out.splitlines() if l.startswith("allocations: ")), None)
        if doc and made is not None:
            t = opencl(doc)
            print(f"api: {rounds} rounds, {made} allocations, OpenCL: {t}")
            if t["active_blocks"] != 0:
                fail(f"active blocks left: {t}")
            if t["hits"] + t["misses"] != made + 1:  # and the warm-up buffer
                fail(f"{t['hits']} + {t['misses']} pooled, {made} + 1 made")
        with open(trace) as f:
            lines = f.read().splitlines()
        if "# attached" not in lines or not lines[-1].startswith("# end "):
            fail(f"the last trace: {lines[:3]} ... {lines[-1:]}")

    elif scenario == "signals":
        env["GPUPOOL_SIGNAL_STOP_HOLDING"] = "SIGRTMIN+3"
        p = start(["serve"], env)
        # ThreadSanitizer's runtime defers handlers and can drop a signal
        # (seen with a 30-line program and no gpupool): there, ask again until
        # the dump shows the request done. Elsewhere ask once, so a lost
        # signal fails the test.
        tsan = "libtsan" in os.environ["GPUPOOL_TEST_PRELOAD"]
        seen = 0

        def ask(action, done, what):
            """Sends `action` (or nothing), then SIGUSR1; returns the newest
            dump once it shows the request done."""
            global seen
            d = None
            for _ in range(30 if tsan else 1):
                if action:
                    os.kill(p.pid, action)
                os.kill(p.pid, signal.SIGUSR1)
                if not wait_dump(stats, seen + 1, seconds=1 if tsan else 60, must_come=not tsan):
                    continue  # TSan lost the signal
                seen = len(dumps(stats))  # a late signal may have added another
                d = wait_dump(stats, seen)
                if done(d):
                    return d
            fail(f"{what}: last dump {opencl(d) if d else None}, holding {d and d['holding']}")
            return None

        ask(None, lambda d: opencl(d)["held_blocks"] == 7, "expected 7 held buffers before free_held")
        ask(signal.SIGUSR2, lambda d: opencl(d)["held_blocks"] == 0 and d["holding"], "after SIGUSR2")
        ask(signal.SIGRTMIN + 3, lambda d: not d["holding"], "after the stop_holding signal")
        out, err = p.communicate(input="", timeout=120)
        sys.stderr.write(err)
        if p.returncode != 0:
            fail(f"workload exited {p.returncode}")
        d = final_stats(out)
        if d:
            t = opencl(d)
            # Holding stopped: the 3 buffers released at the end were not kept.
            if t["held_blocks"] != 0 or t["active_blocks"] != 0:
                fail(f"at the end: {t}")
    else:
        fail(f"unknown scenario {scenario}")

finish()
