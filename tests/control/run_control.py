#!/usr/bin/env python3
"""Drives control_harness scenarios and checks what they leave behind.

usage: run_control.py HARNESS SCHEMA SCENARIO [ARGS...]
"""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import gpupool_check  # noqa: E402
from harness import bare_env, fail, finish  # noqa: E402

harness, schema_path, scenario, *args = sys.argv[1:]
with open(schema_path) as f:
    SCHEMA = json.load(f)


def run(argv, env_extra, timeout=600):
    env = bare_env()
    env.update(env_extra)
    p = subprocess.run([harness] + argv, env=env, capture_output=True, text=True, timeout=timeout)
    sys.stdout.write(p.stdout)
    sys.stderr.write(p.stderr)
    return p


def check_dumps(path, expect_min=1):
    docs = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            doc, errors = gpupool_check.validate_dump(line, SCHEMA)
            for e in errors:
                fail(f"{path}:{n}: {e}")
            docs.append(doc)
    if len(docs) < expect_min:
        fail(f"{path}: {len(docs)} dumps, expected at least {expect_min}")
    return docs


with tempfile.TemporaryDirectory() as tmp:
    stats = os.path.join(tmp, "stats.%p.json")
    json_env = {"GPUPOOL_STATS_FILE": stats, "GPUPOOL_STATS_FORMAT": "json"}

    if scenario == "storm":
        threads, seconds = args
        p = run(["storm", threads, seconds], json_env)
        if p.returncode != 0:
            fail(f"storm exited {p.returncode}")
        files = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith("stats.")]
        if len(files) != 1:
            fail(f"expected one stats file, found {files}")
        else:
            docs = check_dumps(files[0], 2)
            last = docs[-1]
            if last["totals"]["held_bytes"] != 0 or last["totals"]["active_blocks"] != 0:
                fail(f"last dump after free_held should show nothing held/active: {last['totals']}")
            if not all(d["reason"] == "signal" for d in docs):
                fail("every storm dump should be signal-driven")
            print(f"storm: {len(docs)} dumps validated against the schema")

    elif scenario == "exit-race":
        p = run(["exit-race", args[0]], dict(json_env, GPUPOOL_STATS_AT_EXIT="1"))
        if p.returncode != 0:
            fail(f"exit-race exited {p.returncode}")

    elif scenario == "chain":
        p = run(["chain"], json_env)
        if p.returncode != 0:
            fail(f"chain exited {p.returncode}")
        if "replaced gpupool's SIGUSR1 handler" not in p.stderr:
            fail("the replaced handler was not logged")

    elif scenario == "handler-swaps":
        p = run(["handler-swaps", args[0]], json_env)
        if p.returncode != 0:
            fail(f"handler-swaps exited {p.returncode}")

    elif scenario == "symlink":
        target = os.path.join(tmp, "victim")
        with open(target, "w") as f:
            f.write("precious\n")
        link = os.path.join(tmp, "stats.txt")
        os.symlink(target, link)
        p = run(["symlink"], {"GPUPOOL_STATS_FILE": link})
        if p.returncode != 0:
            fail(f"symlink exited {p.returncode}")
        with open(target) as f:
            if f.read() != "precious\n":
                fail("the symlink's target was written to")
        if "symbolic link" not in p.stderr:
            fail("no clear log message about the refused symlink")

    elif scenario == "trace":
        ops = args[0]
        trace = os.path.join(tmp, "trace.%p.txt")
        env = dict(json_env, GPUPOOL_TRACE_FILE=trace, GPUPOOL_STATS_AT_EXIT="1")
        p = run(["workload", ops], env)
        if p.returncode != 0:
            fail(f"workload exited {p.returncode}")
        traces = [n for n in os.listdir(tmp) if n.startswith("trace.")]
        dumps = [n for n in os.listdir(tmp) if n.startswith("stats.")]
        if len(traces) != 1 or len(dumps) != 1:
            fail(f"expected one trace and one stats file: {os.listdir(tmp)}")
        else:
            counts, problems = gpupool_check.replay_trace(os.path.join(tmp, traces[0]))
            for pr in problems[:20]:
                fail(pr)
            docs = check_dumps(os.path.join(tmp, dumps[0]), 1)
            t = docs[-1]["totals"]
            if docs[-1]["reason"] != "exit":
                fail("the last dump is not the exit dump")
            if (counts["hits"], counts["misses"]) != (t["hits"], t["misses"]):
                fail(f"trace hits/misses {counts['hits']}/{counts['misses']} != stats {t['hits']}/{t['misses']}")
            if counts["active"] != t["active_blocks"] or counts["active"] != 1:
                fail(f"trace leaves {counts['active']} active, stats say {t['active_blocks']} (expected 1)")
            print(f"trace: {counts}")
    elif scenario == "periodic":
        prom = os.path.join(tmp, "gpupool.prom")
        env = dict(json_env, GPUPOOL_STATS_INTERVAL="100ms", GPUPOOL_RELEASE_AFTER="200ms",
                   GPUPOOL_PROMETHEUS_FILE=prom)
        p = run(["periodic"], env)
        if p.returncode != 0:
            fail(f"periodic exited {p.returncode}")
        files = [os.path.join(tmp, n) for n in os.listdir(tmp) if n.startswith("stats.")]
        docs = check_dumps(files[0], 2) if len(files) == 1 else fail(f"stats files: {files}")
        if docs and not any(d["reason"] == "interval" for d in docs):
            fail("no interval dump")
        # The Prometheus file while it ran: whole (atomic replace), and
        # showing the trims; at exit it went with the process.
        text = p.stdout.split("prometheus file:\n", 1)[-1]
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        trims = [v for k, v in samples.items()
                 if k.startswith("gpupool_trims_total{") and 'kind="checking"' in k]
        if trims != [5]:
            fail(f"Prometheus gpupool_trims_total of the checking arena: {trims}: {text[-800:]}")
        leftovers = [n for n in os.listdir(tmp) if n.startswith(("gpupool.", ".gpupool."))]
        if leftovers:
            fail(f"files left after exit: {leftovers}")
    elif scenario == "exec-prometheus":
        # A program that execs itself 300 times while its Prometheus file
        # is written every millisecond: no temporary file of a write that
        # an exec cut short is left (each image sweeps those of its pid),
        # and the file goes with the last image's exit.
        prom = os.path.join(tmp, "gpupool.prom")
        env = dict(json_env, GPUPOOL_STATS_INTERVAL="1ms", GPUPOOL_PROMETHEUS_FILE=prom)
        p = run(["exec-chain", "300"], env)
        if p.returncode != 0:
            fail(f"exec-chain exited {p.returncode}")
        leftovers = [n for n in os.listdir(tmp) if "gpupool.prom" in n]
        if leftovers:
            fail(f"files left after 300 execs amid writes: {leftovers}")
    else:
        fail(f"unknown scenario {scenario}")

finish()
