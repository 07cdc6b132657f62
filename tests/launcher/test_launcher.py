#!/usr/bin/env python3
"""The gpupool launcher end to end: every command, bad argument and error exit.

Run as: test_launcher.py [unittest args], with LAUNCHER, HARNESS, CL_WORKLOAD
(optional), SCHEMA, BUILD_DIR and GPUPOOL_TEST_PRELOAD in the environment.
"""
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "control"))
import gpupool_check  # noqa: E402

LAUNCHER = os.environ["LAUNCHER"]
HARNESS = os.environ["HARNESS"]
CL_WORKLOAD = os.environ.get("CL_WORKLOAD", "")
REPORT_PROGRAM = os.environ.get("REPORT_PROGRAM", "")
# The build reads debug information (elfutils' libdw): frames name lines.
DWARF = os.environ.get("GPUPOOL_TEST_DWARF") == "1"
SCHEMA = json.load(open(os.environ["SCHEMA"]))
BUILD_DIR = os.environ["BUILD_DIR"]
TEST_PRELOAD = os.environ["GPUPOOL_TEST_PRELOAD"]
# Sanitizer runtimes that must stay first in LD_PRELOAD (sanitizer builds).
SANITIZER_PRELOAD = ":".join(p for p in TEST_PRELOAD.split(":") if "libgpupool" not in p)

OK, FAILED, USAGE, NO_PROCESS, NOT_GPUPOOL, IDLE, DENIED, TIMEOUT, LEAKED, PEAK_GREW = range(10)


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
    env.pop("LD_PRELOAD", None)
    if SANITIZER_PRELOAD:
        env["LD_PRELOAD"] = SANITIZER_PRELOAD
    env.update(extra)
    return env


def gp(*args, env=None, timeout=120, **kw):
    return subprocess.run([LAUNCHER, *args], env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout, **kw)


def read_text(path):
    with open(path) as f:
        return f.read()


def gp_with_rss(*args):
    """gp(), and the launcher's peak resident memory in bytes (its own
    getrusage, as wait4 gives it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([LAUNCHER, *args], env=clean_env(), stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()),
                usage.ru_maxrss * 1024)


class Serving:
    """A process serving the control socket until closed."""

    def __init__(self, argv, env, user=None):
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            out, err = self.p.communicate(timeout=60)
            raise AssertionError(f"did not start: {line}{out}{err}")
        self.pid = int(line.split()[1])

    def close(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            out, err = self.p.communicate(input="", timeout=120)
            return self.p.returncode, out, err
        return self.p.returncode, "", ""


class Usage(unittest.TestCase):
    def bad(self, *args, contains):
        r = gp(*args)
        self.assertEqual(r.returncode, USAGE, f"{args}: {r.stdout}{r.stderr}")
        self.assertIn(contains, r.stderr, args)
        self.assertEqual(r.stdout, "", args)

    def test_version_and_help(self):
        r = gp("--version")
        self.assertEqual(r.returncode, OK)
        self.assertRegex(r.stdout, r"^gpupool \d+\.\d+\.\d+\n$")
        self.assertEqual(gp("-V").stdout, r.stdout)
        for args in (["--help"], ["-h"], ["help"]):
            r = gp(*args)
            self.assertEqual(r.returncode, OK)
            self.assertIn("Usage: gpupool COMMAND", r.stdout)
            self.assertIn("5 gpupool loaded but idle", r.stdout)
        for cmd in ("run", "stats", "free-held", "stop-holding", "env", "report"):
            r = gp("help", cmd)
            self.assertEqual(r.returncode, OK)
            self.assertIn(f"Usage: gpupool {cmd}", r.stdout)
            self.assertEqual(gp(cmd, "--help").stdout, r.stdout)

    def test_bad_arguments(self):
        r = gp()
        self.assertEqual(r.returncode, USAGE)
        self.assertIn("Usage:", r.stderr)
        self.bad("frobnicate", contains="unknown command 'frobnicate'")
        self.bad("--frob", contains="unknown option '--frob'")
        self.bad("help", "frob", contains="unknown command 'frob'")
        self.bad("run", contains="no program given")
        self.bad("run", "--", contains="no program given")
        self.bad("run", "--max-held", contains="--max-held needs a value")
        # A bad value: the program is not run, and the message says so.
        r = gp("run", "--max-held", "2X", "--", "true")
        self.assertEqual((r.returncode, r.stdout), (USAGE, ""))
        self.assertRegex(r.stderr, r"^gpupool: run: --max-held '2X' \(GPUPOOL_MAX_HELD\) is not "
                                   r".*\(accepted: .*\); the program was not started\n$")
        self.assertNotIn("using the default", r.stderr)
        r = gp("run", "--set", "MAX_HELD=2X", "--", "true")
        self.assertEqual(r.returncode, USAGE)
        self.assertRegex(r.stderr, r"^gpupool: run: --set GPUPOOL_MAX_HELD='2X' is not "
                                   r".*\(accepted: .*\); the program was not started\n$")
        self.bad("run", "--max-held=", "true", contains="needs a non-empty value")
        self.bad("run", "--release-after", "soon", "true", contains="GPUPOOL_RELEASE_AFTER")
        self.bad("run", "--reuse", "fast", "true", contains="GPUPOOL_REUSE")
        self.bad("run", "--leading-bits", "99", "true", contains="GPUPOOL_LEADING_BITS")
        self.bad("run", "--log", "loud", "true", contains="GPUPOOL_LOG")
        self.bad("run", "--stats-interval", "-1", "true", contains="GPUPOOL_STATS_INTERVAL")
        self.bad("run", "--disable", "vulkan", "true", contains="unknown backend 'vulkan'")
        self.bad("run", "--disable", ",", "true", contains="unknown backend ''")
        self.bad("run", "--set", "FROB=1", "true", contains="GPUPOOL_FROB is not a gpupool variable")
        self.bad("run", "--set", "nonsense", "true", contains="--set needs NAME=VALUE")
        self.bad("run", "--set", "SIGNAL_STATS=KILL", "true", contains="GPUPOOL_SIGNAL_STATS")
        self.bad("run", "--stats=1", "true", contains="--stats takes no value")
        self.bad("run", "--bogus", "true", contains="unknown option '--bogus'")
        for cmd in ("stats", "free-held", "stop-holding"):
            self.bad(cmd, contains="no PID given")
            self.bad(cmd, "abc", contains="'abc' is not a process id")
            self.bad(cmd, "0", contains="'0' is not a process id")
            self.bad(cmd, "-5", contains="unknown option '-5'")
            self.bad(cmd, "1", "2", contains="more than one PID")
            self.bad(cmd, "1", "--timeout", contains="--timeout needs a value")
            self.bad(cmd, "1", "--timeout", "0", contains="is not a number of seconds")
            self.bad(cmd, "1", "--timeout=x", contains="is not a number of seconds")
        self.bad("free-held", "--json", contains="no PID given")
        self.bad("free-held", "--all", "--device", "GPU-12", contains="'GPU-12' is not a device")
        self.bad("free-held", "--all", "--device", "opencl-xyz", contains="is not a device")
        self.bad("free-held", "1", "--device", "host", contains="--device goes with --all")
        self.bad("env", "extra", contains="unexpected argument 'extra'")
        self.bad("env", "--json", "--text", contains="unexpected argument '--text'")
        self.bad("report", "--text", "--json", "t", contains="--text or --json, not both")

    def test_env(self):
        r = gp("env", env=clean_env(GPUPOOL_MAX_HELD="2G"))
        self.assertEqual(r.returncode, OK)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("VARIABLE"))
        row = next(line for line in lines if line.startswith("GPUPOOL_MAX_HELD "))
        self.assertIn(" 2G ", row)
        self.assertIn("unlimited", row)  # the default
        self.assertIn("GPUPOOL_SIGNAL_FREE_HELD", r.stdout)
        self.assertNotIn("Problems", r.stdout)
        r = gp("env", env=clean_env(GPUPOOL_MAX_HELD="lots", GPUPOOL_MAX_HLED="1"))
        self.assertEqual(r.returncode, OK)
        self.assertIn("Problems:", r.stdout)
        self.assertIn("GPUPOOL_MAX_HELD=", r.stdout.split("Problems:")[1])
        self.assertIn("did you mean GPUPOOL_MAX_HELD", r.stdout)

    def test_env_json(self):
        r = gp("env", "--json", env=clean_env(GPUPOOL_MAX_HELD="2G"))
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        doc = json.loads(r.stdout)
        by_name = {v["name"]: v for v in doc["variables"]}
        self.assertEqual(by_name["GPUPOOL_MAX_HELD"]["value"], "2G")
        self.assertEqual(by_name["GPUPOOL_MAX_HELD"]["default"], "unlimited")
        self.assertIsNone(by_name["GPUPOOL_REUSE"]["value"])
        self.assertTrue(by_name["GPUPOOL_REUSE"]["description"])
        # Every variable the text lists, in its order.
        text = gp("env", env=clean_env(GPUPOOL_MAX_HELD="2G")).stdout
        listed = [ln.split()[0] for ln in text.splitlines()[1:] if ln.startswith("GPUPOOL_")]
        self.assertEqual([v["name"] for v in doc["variables"]], listed)
        self.assertEqual(doc["problems"], [])
        r = gp("env", "--json", env=clean_env(GPUPOOL_MAX_HELD="lots", GPUPOOL_MAX_HLED="1"))
        doc = json.loads(r.stdout)
        self.assertEqual(len(doc["problems"]), 2, doc["problems"])
        self.assertTrue(any("did you mean GPUPOOL_MAX_HELD" in p for p in doc["problems"]))


class Run(unittest.TestCase):
    def test_exit_status_and_signals_pass_through(self):
        self.assertEqual(gp("run", "--", "sh", "-c", "exit 7").returncode, 7)
        self.assertEqual(gp("run", "true").returncode, 0)
        r = gp("run", "--", "sh", "-c", "kill -TERM $$")
        self.assertEqual(r.returncode, -signal.SIGTERM)

    def test_program_not_found_or_not_executable(self):
        r = gp("run", "--", "/nonexistent/program")
        self.assertEqual(r.returncode, 127)
        self.assertIn("command not found", r.stderr)
        with tempfile.NamedTemporaryFile(suffix=".sh") as f:
            os.chmod(f.name, 0o644)
            r = gp("run", f.name)
            self.assertEqual(r.returncode, 126)
            self.assertIn("Permission denied", r.stderr)

    def test_sets_variables_and_preload(self):
        libm = "/lib/x86_64-linux-gnu/libm.so.6"
        env = clean_env()
        env["LD_PRELOAD"] = ":".join(p for p in (SANITIZER_PRELOAD, libm) if p)
        with tempfile.TemporaryDirectory() as tmp:
            r = gp("run", "--max-held", "2G", "--max-pooled=64M", "--release-after", "10s",
                   "--reuse", "immediate", "--no-probe", "--no-hold", "--stats",
                   "--stats-file", "s.%p", "--json", "--trace", "t.txt", "--leaks", "--log", "info",
                   "--disable", "cuda,opencl", "--set", "LEADING_BITS=3", "--",
                   "sh", "-c", "env", env=env, cwd=tmp)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
            expect = {
                "GPUPOOL_MAX_HELD": "2G", "GPUPOOL_MAX_POOLED": "64M",
                "GPUPOOL_RELEASE_AFTER": "10s", "GPUPOOL_REUSE": "immediate",
                "GPUPOOL_PROBE": "0", "GPUPOOL_HOLD": "0", "GPUPOOL_STATS_AT_EXIT": "1",
                "GPUPOOL_STATS_FORMAT": "json", "GPUPOOL_LOG": "info", "GPUPOOL_LEAKS": "1",
                "GPUPOOL_CUDA": "0", "GPUPOOL_OPENCL": "0", "GPUPOOL_LEADING_BITS": "3",
                # Files are made absolute: the program may change directory.
                "GPUPOOL_STATS_FILE": os.path.join(os.path.realpath(tmp), "s.%p"),
                "GPUPOOL_TRACE_FILE": os.path.join(os.path.realpath(tmp), "t.txt"),
            }
            for k, v in expect.items():
                self.assertEqual(got.get(k, "").replace(tmp, os.path.realpath(tmp)), v, k)
            preload = got["LD_PRELOAD"].split(":")
            lib = os.path.realpath(os.path.join(BUILD_DIR, "libgpupool.so"))
            sanitizers = [p for p in SANITIZER_PRELOAD.split(":") if p]
            self.assertEqual(preload, sanitizers + [lib, libm])
        # The program is the launcher's process (exec): GPUPOOL_RUN_PID is
        # its pid, so it writes the files as named and its children write
        # siblings (docs/trace.md).
        r = gp("run", "--", "sh", "-c", 'echo "$$ $GPUPOOL_RUN_PID"', env=env)
        pid, run_pid = r.stdout.split()
        self.assertEqual(pid, run_pid)
        # Already preloaded: left alone, not added twice.
        env["LD_PRELOAD"] = TEST_PRELOAD
        r = gp("run", "--", "sh", "-c", "echo $LD_PRELOAD", env=env)
        self.assertEqual(r.stdout.strip(), TEST_PRELOAD)

    def test_removes_what_dead_processes_left_beside_the_prometheus_file(self):
        """run --prometheus: the files of processes that are gone (killed)
        and the temporary files of writes an exec or a kill cut short are
        removed before the program starts; a live writer's are not."""
        with tempfile.TemporaryDirectory() as tmp:
            dead = subprocess.Popen(["true"])
            dead.wait()
            live = subprocess.Popen(["sleep", "60"])
            try:
                files = {f"gpupool.{dead.pid}.prom": "# HELP gpupool_info x\n",
                         f".gpupool.prom.tmp{dead.pid}-0a1b2c": "# HELP gpu",
                         f".gpupool.prom.tmp{live.pid}-0a1b2c": "",
                         "gpupool.7.prom": "the user's own\n"}
                for name, text in files.items():
                    with open(os.path.join(tmp, name), "w") as f:
                        f.write(text)
                r = gp("run", "--prometheus", os.path.join(tmp, "gpupool.prom"), "--", "true")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("removed 2 Prometheus files of processes that are gone", r.stderr)
                self.assertEqual(sorted(os.listdir(tmp)),
                                 sorted([f".gpupool.prom.tmp{live.pid}-0a1b2c", "gpupool.7.prom"]))
            finally:
                live.kill()
                live.wait()

    @unittest.skipUnless(CL_WORKLOAD, "OpenCL hooks not built")
    def test_stats_at_exit_of_an_unmodified_opencl_program(self):
        r = gp("run", "--stats", "--", CL_WORKLOAD, "once")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("gpupool ", r.stderr)
        self.assertIn(", exit, holding on", r.stderr)
        # The program released its context: the arena's row is the retired
        # OpenCL arenas' (their counters stay in the totals).
        self.assertRegex(r.stderr, r"\nopencl: 1 destroyed arena \(retired\) +0 / 0 B")
        self.assertIn("total (", r.stderr)
        r = gp("run", "--stats", "--json", "--", CL_WORKLOAD, "once")
        doc, errors = gpupool_check.validate_dump(r.stderr.strip().splitlines()[-1], SCHEMA)
        self.assertEqual(errors, [])
        self.assertEqual(doc["reason"], "exit")
        self.assertGreaterEqual(sum(b["stats"]["hits"] for b in doc["arenas"]), 3)


class Pid(unittest.TestCase):
    def check_pid_commands(self, server):
        try:
            r = gp("stats", str(server.pid))
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn(f"pid {server.pid}", r.stdout)
            self.assertIn("request, holding on", r.stdout)
            r = gp("stats", str(server.pid), "--json")
            self.assertEqual(r.returncode, OK, r.stderr)
            doc, errors = gpupool_check.validate_dump(r.stdout, SCHEMA)
            self.assertEqual(errors, [])
            self.assertEqual(doc["pid"], server.pid)
            self.assertEqual(doc["totals"]["held_blocks"], 7)
            self.assertEqual(doc["totals"]["active_blocks"], 3)
            r = gp("free-held", str(server.pid))
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn("released 7 held blocks", r.stdout)
            doc = json.loads(gp("stats", str(server.pid), "--json").stdout)
            self.assertEqual(doc["totals"]["held_blocks"], 0)
            self.assertTrue(doc["holding"])
            r = gp("stop-holding", str(server.pid), "--timeout", "30")
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn("holding stopped", r.stdout)
            doc = json.loads(gp("stats", str(server.pid), "--json").stdout)
            self.assertFalse(doc["holding"])
            self.assertEqual(doc["totals"]["active_blocks"], 3)
        finally:
            rc, out, err = server.close()
        self.assertEqual(rc, 0, err)
        return out

    def test_json_answers(self):
        """free-held and stop-holding --json: what was released and what is
        held, exact, as one object; free-held --all --json: one per process."""
        tmp = tempfile.mkdtemp(prefix="gpupool-json-")
        env = clean_env(GPUPOOL_REGISTRY=os.path.join(tmp, "registry"))
        server = Serving([HARNESS, "serve"], env)
        try:
            before = json.loads(gp("stats", str(server.pid), "--json").stdout)["totals"]
            r = gp("free-held", str(server.pid), "--json")
            self.assertEqual((r.returncode, r.stderr), (OK, ""))
            self.assertEqual(json.loads(r.stdout), {
                "released_blocks": 7, "released_bytes": before["held_bytes"],
                "held_blocks": 0, "held_bytes": 0, "holding": True})
            r = gp("stop-holding", str(server.pid), "--json")
            self.assertEqual((r.returncode, r.stderr), (OK, ""))
            self.assertEqual(json.loads(r.stdout), {
                "released_blocks": 0, "released_bytes": 0, "held_blocks": 0, "held_bytes": 0,
                "holding": False})
            # A process that is not there: its error, nothing on stdout.
            r = gp("free-held", "999999999", "--json")
            self.assertEqual((r.returncode, r.stdout), (NO_PROCESS, ""))
        finally:
            server.close()
            shutil.rmtree(tmp, ignore_errors=True)

    def test_commands_on_a_running_program(self):
        self.check_pid_commands(Serving([HARNESS, "serve"], clean_env()))

    @unittest.skipUnless(CL_WORKLOAD, "OpenCL hooks not built")
    def test_commands_on_an_opencl_program_with_plain_ld_preload(self):
        env = clean_env(LD_PRELOAD=TEST_PRELOAD)
        out = self.check_pid_commands(Serving([CL_WORKLOAD, "serve"], env))
        # Holding stopped: the 3 buffers released at the end went back at once.
        doc = json.loads(out.split("stats: ", 1)[1])
        self.assertEqual(doc["totals"]["held_blocks"], 0)

    @unittest.skipUnless(CL_WORKLOAD, "OpenCL hooks not built")
    def test_ps_and_free_held_all_on_an_opencl_device_without_uuid(self):
        # PoCL's CPU device has no UUID: it is named by a key made from its
        # platform, vendor and name and the node, the same in `ps`, `stats`
        # and --device (before: ps listed nobody, free-held --all asked
        # nobody, while `stats PID` answered).
        tmp = tempfile.mkdtemp(prefix="gpupool-ps-")
        env = clean_env(LD_PRELOAD=TEST_PRELOAD, GPUPOOL_REGISTRY=os.path.join(tmp, "registry"))
        server = Serving([CL_WORKLOAD, "serve"], env)
        try:
            def listed():
                r = gp("ps", "--json", env=env)
                self.assertEqual(r.returncode, OK, r.stderr)
                return [p for p in json.loads(r.stdout)["processes"] if p["pid"] == server.pid]
            # Published at its first buffer, then every 100 ms: until its
            # figures after the 7 releases are there.
            for _ in range(600):
                if listed() and listed()[0]["devices"] and listed()[0]["devices"][0]["held_bytes"]:
                    break
                time.sleep(0.05)
            entry = listed()
            self.assertEqual(len(entry), 1, "the OpenCL process is not listed by ps --json")
            dev = entry[0]["devices"][0]
            self.assertRegex(dev["device"], r"^opencl-[0-9a-f]{24}$")
            doc = json.loads(gp("stats", str(server.pid), "--json", env=env).stdout)
            self.assertEqual({a["device"] for a in doc["arenas"]}, {dev["device"]})
            self.assertEqual(dev["held_bytes"], doc["totals"]["held_bytes"])
            self.assertGreater(dev["held_bytes"], 0)
            r = gp("ps", env=env)
            self.assertEqual(r.returncode, OK, r.stderr)
            row = [ln for ln in r.stdout.splitlines() if ln.split()[:1] == [str(server.pid)]]
            self.assertEqual(len(row), 1, r.stdout)
            self.assertIn(dev["device"], row[0])
            # --device another device asks nobody; the key asks it.
            r = gp("free-held", "--all", "--device", "host", env=env)
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn("no gpupool process", r.stdout)
            doc = json.loads(gp("stats", str(server.pid), "--json", env=env).stdout)
            self.assertEqual(doc["totals"]["held_blocks"], 7)
            r = gp("free-held", "--all", "--device", dev["device"], env=env)
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn(f"process {server.pid} (cl_workload): released {dev['held_bytes']}\n",
                          r.stdout)
            doc = json.loads(gp("stats", str(server.pid), "--json", env=env).stdout)
            self.assertEqual(doc["totals"]["held_blocks"], 0)
            self.assertEqual(doc["totals"]["active_blocks"], 3)
        finally:
            rc, out, err = server.close()
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(rc, 0, err)

    @unittest.skipUnless(CL_WORKLOAD, "OpenCL hooks not built")
    def test_free_held_all_asks_an_opencl_process(self):
        tmp = tempfile.mkdtemp(prefix="gpupool-ps-")
        env = clean_env(LD_PRELOAD=TEST_PRELOAD, GPUPOOL_REGISTRY=os.path.join(tmp, "registry"))
        server = Serving([CL_WORKLOAD, "serve"], env)
        try:
            for _ in range(600):
                r = gp("ps", "--json", env=env)
                if any(p["pid"] == server.pid and p["devices"] and p["devices"][0]["held_bytes"]
                       for p in json.loads(r.stdout)["processes"]):
                    break
                time.sleep(0.05)
            held = json.loads(gp("stats", str(server.pid), "--json").stdout)["totals"]["held_bytes"]
            r = gp("free-held", "--all", "--json", env=env)
            self.assertEqual((r.returncode, r.stderr), (OK, ""))
            doc = json.loads(r.stdout)
            self.assertIsNone(doc["device"])
            self.assertEqual(doc["processes"], [{
                "pid": server.pid, "command": "cl_workload", "ok": True, "released_blocks": 7,
                "released_bytes": held, "held_blocks": 0, "held_bytes": 0, "holding": True}])
            r = gp("free-held", "--all", env=env)
            self.assertEqual(r.returncode, OK, r.stderr)
            self.assertIn(f"process {server.pid} (cl_workload): released 0", r.stdout)
            doc = json.loads(gp("stats", str(server.pid), "--json", env=env).stdout)
            self.assertEqual(doc["totals"]["held_blocks"], 0)
            # A process that does not answer: its entry says why. (Asked
            # once the kernel shows it stopped.)
            os.kill(server.pid, signal.SIGSTOP)
            for _ in range(6000):
                with open(f"/proc/{server.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "T":
                        break
                time.sleep(0.01)
            r = gp("free-held", "--all", "--json", "--timeout", "0.5", env=env)
            self.assertEqual(r.returncode, FAILED, r.stdout + r.stderr)
            entry = json.loads(r.stdout)["processes"][0]
            self.assertEqual((entry["pid"], entry["ok"], entry["exit"]),
                             (server.pid, False, TIMEOUT))
            self.assertIn("no answer", entry["error"])
        finally:
            os.kill(server.pid, signal.SIGCONT)
            rc, out, err = server.close()
            shutil.rmtree(tmp, ignore_errors=True)
        self.assertEqual(rc, 0, err)

    def test_no_such_process(self):
        for cmd in ("stats", "free-held", "stop-holding"):
            r = gp(cmd, "999999999")
            self.assertEqual(r.returncode, NO_PROCESS, r.stderr)
            self.assertIn("no such process: 999999999", r.stderr)

    def test_not_running_gpupool(self):
        p = subprocess.Popen(["sleep", "60"], env=clean_env())
        try:
            r = gp("stats", str(p.pid))
            self.assertEqual(r.returncode, NOT_GPUPOOL, r.stderr)
            self.assertIn("not running gpupool", r.stderr)
        finally:
            p.kill()
            p.wait()

    def test_loaded_but_idle(self):
        # Preloaded, but no GPU call: gpupool never started there.
        p = subprocess.Popen([LAUNCHER, "run", "--", "sleep", "60"], env=clean_env())
        try:
            for _ in range(6000):  # until exec has happened and the library is mapped
                try:
                    if "libgpupool" in open(f"/proc/{p.pid}/maps").read():
                        break
                except OSError:
                    pass
                time.sleep(0.01)
            r = gp("free-held", str(p.pid))
            self.assertEqual(r.returncode, IDLE, r.stderr)
            self.assertIn("gpupool loaded but idle", r.stderr)
        finally:
            p.kill()
            p.wait()

    def test_no_answer_in_time(self):
        server = Serving([HARNESS, "serve"], clean_env())
        try:
            os.kill(server.pid, signal.SIGSTOP)
            r = gp("stats", str(server.pid), "--timeout", "0.5")
            self.assertEqual(r.returncode, TIMEOUT, r.stderr)
            self.assertIn("no answer", r.stderr)
        finally:
            os.kill(server.pid, signal.SIGCONT)
            server.close()

    def test_request_that_timed_out_is_not_carried_out_later(self):
        # A command that said "no answer" changed nothing: the stopped
        # process, continued, drops the request whose deadline has passed
        # (before, holding was off once it ran again).
        server = Serving([HARNESS, "serve"], clean_env())
        try:
            os.kill(server.pid, signal.SIGSTOP)
            for cmd in ("stop-holding", "free-held"):
                r = gp(cmd, str(server.pid), "--timeout", "0.5")
                self.assertEqual(r.returncode, TIMEOUT, r.stderr)
                self.assertIn("no answer", r.stderr)
            os.kill(server.pid, signal.SIGCONT)
            r = gp("stats", str(server.pid), "--json", "--timeout", "30")
            self.assertEqual(r.returncode, OK, r.stderr)
            doc = json.loads(r.stdout)
            self.assertTrue(doc["holding"], "holding stopped by a request that timed out")
            self.assertEqual(doc["totals"]["held_blocks"], 7,
                             "held blocks freed by a request that timed out")
        finally:
            os.kill(server.pid, signal.SIGCONT)
            server.close()

    def test_zombie(self):
        # A process that has ended but was not waited for: said as such
        # (before: "permission denied: cannot inspect process N").
        p = subprocess.Popen(["true"])
        try:
            for _ in range(6000):
                with open(f"/proc/{p.pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
                time.sleep(0.01)
            for cmd in ("stats", "free-held", "stop-holding"):
                r = gp(cmd, str(p.pid))
                self.assertEqual(r.returncode, NO_PROCESS, r.stderr)
                self.assertIn(f"process {p.pid} has ended", r.stderr)
                self.assertNotIn("permission denied", r.stderr)
        finally:
            p.wait()

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"), "needs root and setpriv")
    def test_other_users_process(self):
        server = Serving([HARNESS, "serve"], clean_env(), user=65534)
        try:
            r = gp("stats", str(server.pid))
            self.assertEqual(r.returncode, DENIED, r.stderr)
            self.assertIn("permission denied", r.stderr)
            # The process itself refuses another user too (SO_PEERCRED), even
            # when a client skips the launcher's own check: as it connects,
            # before reading anything the client sends.
            import socket
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(f"/dev/shm/gpupool-65534/control.{server.pid}")  # root may
            reply = s.makefile().read()
            self.assertTrue(reply.startswith("error denied"), reply)
            doc = None
        finally:
            rc, out, err = server.close()
        self.assertEqual(rc, 0, err)


class InTmpDir(unittest.TestCase):
    """A test with a temporary directory of its own (self.tmp), removed
    after it; write() puts a file there."""

    PREFIX = "gpupool-"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=self.PREFIX)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path


class Trace(InTmpDir):
    """gpupool trace convert: a known trace's numbers in both formats; a bad
    trace gets one error naming its line and leaves no file; the trace of a
    program killed with SIGKILL still converts."""

    KNOWN = ("# gpupool trace 1\n# pid 77 start_unix_ns 1000000000000000000\n"
             "arena 0 cuda cuda:0 cuda dev 0 ctx 0x1\n"
             "arena 1 cuda-host cuda-host pinned flags 0x3\n"
             # thread 8's records come after thread 7's, as the file has them
             "a 1000 7 0 a000 1000 1024 m\n"
             "f 3000 7 0 a000 1000 1024\n"
             "a 4000 7 0 a000 900 1024 h\n"
             "a 2000 8 1 b000 4096 4096 m\n"
             "f 5000 8 1 b000 4096 4096\n")

    PREFIX = "gpupool-trace-"

    def test_perfetto_counters(self):
        src = self.write("known.trace", self.KNOWN)
        out = os.path.join(self.tmp, "known.json")
        r = gp("trace", "convert", src, "--to", "perfetto", "-o", out)
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        doc = json.load(open(out))
        counters = [(e["ts"], e["name"], e["args"]) for e in doc["traceEvents"] if e["ph"] == "C"]
        # Time order across threads; held is what was freed and not reused.
        self.assertEqual(counters, [
            (1.0, "memory cuda:0", {"active": 1000, "in_blocks": 1024, "held": 0}),
            (2.0, "memory cuda-host", {"active": 4096, "in_blocks": 4096, "held": 0}),
            (3.0, "memory cuda:0", {"active": 0, "in_blocks": 0, "held": 1024}),
            (4.0, "memory cuda:0", {"active": 900, "in_blocks": 1024, "held": 0}),
            (5.0, "memory cuda-host", {"active": 0, "in_blocks": 0, "held": 4096}),
        ])
        self.assertTrue(all(e["pid"] == 77 for e in doc["traceEvents"]))

    def test_rmm_log(self):
        src = self.write("known.trace", self.KNOWN)
        r = gp("trace", "convert", src, "--to=rmm", "-o", "-")
        self.assertEqual(r.returncode, OK, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "Thread,Time,Action,Pointer,Size,Stream")
        # 1e18 ns after the epoch is 2001-09-09 01:46:40 UTC.
        self.assertEqual(lines[1:], [
            "7,01:46:40.000001,allocate,0xa000,1000,0x0",
            "8,01:46:40.000002,allocate,0xb000,4096,0x0",
            "7,01:46:40.000003,free,0xa000,1000,0x0",
            "7,01:46:40.000004,allocate,0xa000,900,0x0",
            "8,01:46:40.000005,free,0xb000,4096,0x0",
        ])

    def test_lost_free_is_a_free(self):
        # A handle allocated again while active: its free was lost (a killed
        # program). The earlier allocation counts as freed in every figure.
        src = self.write("lost.trace", self.KNOWN + "a 6000 7 0 c000 500 512 m\n"
                                                    "a 7000 7 0 c000 600 1024 m\n")
        out = os.path.join(self.tmp, "lost.json")
        r = gp("trace", "convert", src, "--to", "perfetto", "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("1 records do not pair", r.stderr)
        with open(out) as f:
            doc = json.load(f)
        last = [e["args"] for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "memory cuda:0"][-1]
        # 900 of KNOWN's a000 still active, and the second c000; not the first.
        self.assertEqual((last["active"], last["in_blocks"]), (900 + 600, 1024 + 1024))

    def test_bad_trace_one_error_no_output(self):
        cases = {
            "notrace": ("hello\n", 1),
            "badline": (self.KNOWN + "a 6000 7 0 c000 12\n", 10),
            "noarena": ("# gpupool trace 1\na 1 2 5 a0 1 1 m\n", 2),
        }
        for name, (text, line) in cases.items():
            src = self.write(name + ".trace", text)
            out = os.path.join(self.tmp, name + ".json")
            r = gp("trace", "convert", src, "--to", "perfetto", "-o", out)
            self.assertEqual(r.returncode, FAILED, name)
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertIn(f"{src}:{line}:", r.stderr)
            self.assertEqual([n for n in os.listdir(self.tmp) if not n.endswith(".trace")], [],
                             "output left behind")
        # Records that do not pair (a killed program's lost records): left
        # out, and said.
        src = self.write("unpaired.trace", self.KNOWN + "f 6000 7 0 dead 1 1\n")
        r = gp("trace", "convert", src, "--to", "rmm", "-o", "-")
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("1 records do not pair", r.stderr)
        self.assertEqual(len(r.stdout.splitlines()), 6)
        r = gp("trace", "convert", os.path.join(self.tmp, "missing"), "--to", "rmm", "-o", "-")
        self.assertEqual(r.returncode, FAILED)
        self.assertIn("cannot open", r.stderr)
        # A directory: its traces are read (the file that is not one left
        # out), and the first bad one is the one message.
        r = gp("trace", "convert", self.tmp, "--to", "rmm", "-o", "-")
        self.assertEqual(r.returncode, FAILED, r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn(f"{self.tmp}/badline.trace:10:", r.stderr)

    def test_output_replaces_only_a_regular_file_of_ours(self):
        """-o: a regular file is replaced whole, keeping its mode; a
        read-only file, a device, a FIFO, a symbolic link and a directory
        are refused with a message saying so, and left as they were ('-'
        is standard output)."""
        src = self.write("ok.trace", self.KNOWN)
        conv = lambda out: gp("trace", "convert", src, "--to", "rmm", "-o", out)
        plain = os.path.join(self.tmp, "out.csv")
        with open(plain, "w") as f:
            f.write("old\n" * 1000)
        os.chmod(plain, 0o640)
        self.assertEqual(conv(plain).returncode, OK)
        with open(plain) as f:
            self.assertNotIn("old", f.read())
        self.assertEqual(stat.S_IMODE(os.stat(plain).st_mode), 0o640)

        def refused(out, why):
            for r in (conv(out), gp("report", src, "-o", out), gp("report", "--text", src, "-o", out)):
                self.assertEqual(r.returncode, FAILED, r.stderr)
                self.assertIn(f"{out} {why}", r.stderr)
                self.assertEqual(r.stderr.count("\n"), 1, r.stderr)

        # Read-only: refused (root too, who could write it), untouched.
        ro = self.write("ro.html", "keep\n")
        os.chmod(ro, 0o444)
        refused(ro, "is read-only")
        self.assertEqual((read_text(ro), stat.S_IMODE(os.stat(ro).st_mode)), ("keep\n", 0o444))
        # A device: never written. A copy of /dev/null made here (root,
        # or CAP_MKNOD), and a block device's node (loop0's numbers; refused
        # before it is opened).
        null, block = os.path.join(self.tmp, "null"), os.path.join(self.tmp, "loop")
        try:
            os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.mknod(block, 0o666 | stat.S_IFBLK, os.makedev(7, 0))
        except OSError as e:
            print(f"device part skipped: {e}")
        else:
            refused(null, "is a character device, not a regular file")
            refused(block, "is a block device, not a regular file")
            self.assertTrue(stat.S_ISCHR(os.stat(null).st_mode), "device replaced")
            self.assertTrue(stat.S_ISBLK(os.stat(block).st_mode), "device replaced")
        fifo = os.path.join(self.tmp, "fifo")
        os.mkfifo(fifo)
        refused(fifo, "is a FIFO, not a regular file")
        self.assertTrue(stat.S_ISFIFO(os.stat(fifo).st_mode))
        # A symbolic link: refused, its target untouched.
        target = self.write("target.txt", "keep me\n")
        link = os.path.join(self.tmp, "link.csv")
        os.symlink(target, link)
        refused(link, "is a symbolic link")
        self.assertTrue(os.path.islink(link))
        with open(target) as f:
            self.assertEqual(f.read(), "keep me\n")
        refused(self.tmp, "is a directory")
        self.assertEqual([n for n in os.listdir(self.tmp) if ".tmp." in n], [], "temporary left")
        for bad in (["trace"], ["trace", "merge"], ["trace", "convert", "x", "--to", "csv", "-o", "-"],
                    ["trace", "convert", "x", "--to", "rmm"]):
            self.assertEqual(gp(*bad).returncode, USAGE, bad)

    def test_read_only_file_of_another_user(self):
        """As another user (nobody), in a directory it may write: its own
        read-only file is refused too."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run as nobody")
        import pwd
        nobody = pwd.getpwnam("nobody").pw_uid
        src = self.write("ok.trace", self.KNOWN)
        os.chmod(self.tmp, 0o777)
        ro = self.write("ro.csv", "keep\n")
        os.chown(ro, nobody, nobody)
        os.chmod(ro, 0o444)
        r = subprocess.run(["setpriv", f"--reuid={nobody}", f"--regid={nobody}", "--clear-groups",
                            LAUNCHER, "trace", "convert", src, "--to", "rmm", "-o", ro],
                           env=clean_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, FAILED, r.stderr)
        self.assertIn(f"{ro} is read-only", r.stderr)
        self.assertEqual((read_text(ro), stat.S_IMODE(os.stat(ro).st_mode)), ("keep\n", 0o444))

    def test_messages_say_what_happened(self):
        src = self.write("ok.trace", self.KNOWN)
        # A missing file: its name and why, not a line number.
        missing = os.path.join(self.tmp, "nonexist")
        r = gp("report", "--text", missing)
        self.assertEqual(r.returncode, FAILED)
        self.assertEqual(r.stderr, f"gpupool: report: cannot open {missing}: No such file or directory\n")
        # A missing output directory: the output's name, not a temporary's.
        out = os.path.join(self.tmp, "nodir", "r.html")
        r = gp("report", src, "-o", out)
        self.assertEqual(r.returncode, FAILED)
        self.assertEqual(r.stderr, f"gpupool: report: cannot create {out}: No such file or directory\n")
        # A reader that leaves (`| head -c 10`): nothing said, as cat says
        # nothing; the end is SIGPIPE's, as cat's.
        rfd, wfd = os.pipe()
        os.close(rfd)
        try:
            r = subprocess.run([LAUNCHER, "report", src, "-o", "-"], env=clean_env(), stdout=wfd,
                               stderr=subprocess.PIPE, text=True, timeout=60)
        finally:
            os.close(wfd)
        self.assertEqual((r.returncode, r.stderr), (-signal.SIGPIPE, ""))

    def test_killed_program(self):
        trace = os.path.join(self.tmp, "killed.trace")
        p = subprocess.Popen([HARNESS, "workload", "100000000"],
                             env=clean_env(GPUPOOL_TRACE_FILE=trace), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and (not os.path.exists(trace) or
                                          os.path.getsize(trace) < 200000):
            time.sleep(0.05)
        p.kill()
        p.wait()
        # And a line cut short, as a kill during a write leaves it.
        with open(trace, "a") as f:
            f.write("a 99999999999 1 0 ab")
        out = os.path.join(self.tmp, "killed.csv")
        r = gp("trace", "convert", trace, "--to", "rmm", "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("last line is incomplete", r.stderr)
        with open(out) as f:
            rows = f.read().splitlines()
        self.assertGreater(len(rows), 1000)
        self.assertTrue(all(row.count(",") == 5 for row in rows))


class Report(InTmpDir):
    """gpupool report: a known program's peaks, the sites holding them and
    what it never released, in the page's data and in its tables; bad input
    gets one error naming the file and line, and no file; a killed program's
    trace and a million events still report, exactly; a real browser draws
    the page without a script error."""

    KIB = 1 << 10
    MIB = 1 << 20

    PREFIX = "gpupool-report-"

    def report(self, trace, name="r.html"):
        out = os.path.join(self.tmp, name)
        r = gp("report", trace, "-o", out, timeout=300)
        return r, out

    @staticmethod
    def data(html_path):
        with open(html_path) as f:
            text = f.read()
        start = text.index('<script type="application/json" id="data">') + len(
            '<script type="application/json" id="data">')
        return json.loads(text[start:text.index("</script>", start)]), text

    def known_trace(self):
        """The trace of tests/launcher/report_program.c, run on PoCL under
        `gpupool run --trace` with every call stack recorded."""
        if not REPORT_PROGRAM:
            self.skipTest("no report_program (OpenCL not built)")
        trace = os.path.join(self.tmp, "known.trace")
        r = gp("run", "--trace", trace, "--set", "SITES=all", "--", REPORT_PROGRAM)
        self.assertEqual(r.returncode, 0, r.stderr)
        return trace

    def test_known_program(self):
        r, out = self.report(self.known_trace())
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        d, html = self.data(out)
        self.assertEqual((d["allocations"], d["frees"]), (14, 10))
        self.assertEqual(d["hits"], 5)  # the second forward() takes the held blocks
        (g,) = d["groups"]
        self.assertTrue(g["name"].startswith("opencl:"), g["name"])
        # Peak active: the weights and the first forward()'s activations.
        self.assertEqual(g["peak_active"]["bytes"], 13 * self.MIB)
        self.assertEqual(d["peak"]["bytes"], 13 * self.MIB)
        self.assertEqual(d["peak"]["t_ns"], g["peak_active"]["t_ns"])
        # Peak managed: those blocks kept, plus the scratch, at the end.
        self.assertEqual(g["peak_managed"]["bytes"], 13 * self.MIB + 64 * self.KIB)
        self.assertEqual(g["end"]["managed"], 13 * self.MIB + 64 * self.KIB)
        self.assertEqual(g["end"]["active"], 3 * self.MIB + 64 * self.KIB)
        self.assertLess(g["peak_active"]["t_ns"], g["peak_managed"]["t_ns"])

        def function(frame):  # 'forward+0x1f (prog)' or 'forward (/src/prog.c:40)'
            return re.match(r"[^ +(]*", frame).group(0)

        def rows(part):
            # By the program's function that called create(), which is
            # always inlined (a frame of its own where lines are known).
            return [(next(function(f) for f in x["frames"] if function(f) != "create"),
                     x["blocks"], x["bytes"]) for x in d[part]["sites"]]

        self.assertEqual(rows("peak"), [("forward", 5, 10 * self.MIB),
                                        ("load_weights", 3, 3 * self.MIB)])
        self.assertEqual(rows("end"), [("load_weights", 3, 3 * self.MIB),
                                       ("keep_scratch", 1, 64 * self.KIB)])
        self.assertEqual((d["end"]["blocks"], d["end"]["bytes"]), (4, 3 * self.MIB + 64 * self.KIB))
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_program.c")
        text = open(src).read().splitlines()

        def line(code):  # the first line of report_program.c holding `code`
            return next(i for i, l in enumerate(text, 1) if code in l)

        calls = {"load_weights": line("g_weights[i] = create("), "forward": line("activations[i] = create("),
                 "keep_scratch": line("g_scratch = create(")}
        for site in d["peak"]["sites"] + d["end"]["sites"]:
            caller = next(function(f) for f in site["frames"] if function(f) != "create")
            if DWARF:
                # report_program is built with -g: every frame names its
                # line, the inlined create() and its caller's call of it
                # included, and the label is the innermost of the
                # program's frames.
                inner = f"create ({src}:{line('clCreateBuffer(g_ctx')}) [inlined]"
                self.assertEqual(site["label"], inner, site)
                self.assertEqual(site["frames"][site["frames"].index(inner) + 1],
                                 f"{caller} ({src}:{calls[caller]})", site)
                self.assertIn(f"main ({src}:{line(f'  {caller}();')})", site["frames"])
            else:
                # Named from the program's own symbol table, the caller too.
                self.assertRegex(site["label"], r"^\w+\+0x[0-9a-f]+ \(report_program\)$")
                self.assertTrue(any(f.startswith("main+") for f in site["frames"]), site)
        self.assertTrue(all(x["group"] == g["name"] for x in d["end"]["sites"]))
        # Sizes by power of two, the empty ones between included.
        self.assertEqual([(x["from"], x["count"], x["bytes"]) for x in d["sizes"]],
                         [(64 * self.KIB, 1, 64 * self.KIB), (128 * self.KIB, 0, 0),
                          (256 * self.KIB, 0, 0), (512 * self.KIB, 0, 0),
                          (self.MIB, 3, 3 * self.MIB), (2 * self.MIB, 10, 20 * self.MIB)])
        self.assertEqual(sum(d["rates"]["hits"]), 5)
        self.assertEqual(sum(d["rates"]["misses"]), 9)
        self.assertEqual(max(g["active"]), 13 * self.MIB)
        # What a reader sees without the script: the tables.
        peaks_row = html[html.index(f'<td class="l">{g["name"]}</td>'):]
        peaks_row = peaks_row[:peaks_row.index("</tr>")]
        self.assertRegex(peaks_row, r"<td>13\.0 MiB</td><td>[0-9.]+ [µm]?s</td><td>13\.1 MiB</td>")
        self.assertIn("<td>14</td><td>5</td><td>3.1 MiB</td>", peaks_row)
        self.assertRegex(html, r"<td>10\.0 MiB</td><td>5</td><td class=\"l\"><details><summary>"
                               r"[^<]*</summary><pre>[^<]*\bforward[ +]")
        self.assertRegex(html, r"<td>3\.0 MiB</td><td>3</td><td class=\"l\">opencl:.*?"
                               r"<summary>[^<]*</summary><pre>[^<]*\bload_weights[ +]")
        self.assertRegex(html, r"<td>64\.0 KiB</td><td>1</td><td class=\"l\">opencl:.*?"
                               r"<summary>[^<]*</summary><pre>[^<]*\bkeep_scratch[ +]")
        self.assertIn("upper bound", html)

    def test_site_labels(self):
        # A site is labelled by its innermost Python frame, else by its first
        # frame outside the GPU runtimes; a module file is looked up only for
        # names, so these need not exist.
        lines = ["# gpupool trace 2", "# pid 4 start_unix_ns 1",
                 "module 0 1000 2000 0 - /nonexistent/libcuda.so.1",
                 "module 1 5000 6000 4000 - /nonexistent/libtrain.so",
                 "pyframe 0 42 Model.step /src/train.py",
                 "site 0 1010,5020 -", "site 1 1010,5020 0",
                 "arena 0 cuda cuda:0 dev 0",
                 "a 1 1 0 a0 100 128 m 0", "a 2 1 0 b0 300 384 m 1"]
        r, out = self.report(self.write("labels.trace", "\n".join(lines) + "\n"))
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        d, html = self.data(out)
        self.assertEqual([(x["label"], x["frames"]) for x in d["end"]["sites"]], [
            ("py Model.step (/src/train.py:42)",
             ["py Model.step (/src/train.py:42)", "libcuda.so.1+0x1010", "libtrain.so+0x1020"]),
            ("libtrain.so+0x1020", ["libcuda.so.1+0x1010", "libtrain.so+0x1020"])])
        self.assertIn("<summary>py Model.step (/src/train.py:42)</summary>", html)
        # A module file that is not the one traced (another build id) names
        # nothing, and says so.
        trace = self.known_trace()
        with open(trace) as f:
            text = f.read()
        changed = re.sub(r"^(module \d+ \S+ \S+ \S+ )[0-9a-f]+( \S*report_program)$",
                         r"\g<1>00ff\g<2>", text, flags=re.M)
        self.assertNotEqual(changed, text)
        r, out = self.report(self.write("changed.trace", changed), "changed.html")
        self.assertEqual(r.returncode, OK, r.stderr)
        d, _ = self.data(out)
        for site in d["end"]["sites"]:
            self.assertRegex(site["label"],
                             r"^report_program\+0x[0-9a-f]+ \(file changed since the trace\)$")

    def test_site_labels_outside_libraries(self):
        # A row is labelled by the program's own code: the innermost Python
        # frame outside the standard library and installed packages (all
        # of them inside: the innermost), else the innermost native frame
        # outside the GPU runtimes, the interpreter and installed packages.
        lines = ["# gpupool trace 2", "# pid 4 start_unix_ns 1",
                 "module 0 1000 2000 0 - /nonexistent/libcuda.so.1",
                 "module 1 5000 6000 4000 - /nonexistent/libtrain.so",
                 "module 2 7000 8000 6000 - /venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so",
                 "module 3 9000 a000 8000 - /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0",
                 "pyframe 0 680 Array.__init__ /usr/lib/python3/dist-packages/pyopencl/array.py",
                 "pyframe 1 2100 to_device /venv/lib/python3.11/site-packages/pyopencl/array.py",
                 "pyframe 2 12 load /src/train.py",
                 "pyframe 3 40 <module> /src/train.py",
                 "pyframe 4 88 _run_code /usr/lib/python3.11/runpy.py",
                 "pyframe 5 1 <module> <frozen runpy>",
                 "site 0 1010 0,1,2,3,4,5", "site 1 1010 0,1,4,5",
                 "site 2 1010,7020,9020,5020 -", "site 3 1010,7020,9020 -",
                 "arena 0 cuda cuda:0 dev 0",
                 "a 1 1 0 a0 400 512 m 0", "a 2 1 0 b0 300 384 m 1",
                 "a 3 1 0 c0 200 256 m 2", "a 4 1 0 d0 100 128 m 3"]
        r, out = self.report(self.write("libraries.trace", "\n".join(lines) + "\n"))
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        d, _ = self.data(out)
        self.assertEqual([x["label"] for x in d["end"]["sites"]], [
            "py load (/src/train.py:12)",
            "py Array.__init__ (/usr/lib/python3/dist-packages/pyopencl/array.py:680)",
            "libtrain.so+0x1020", "libtorch_cuda.so+0x1020"])
        # Every frame stays in the stack.
        self.assertEqual(d["end"]["sites"][0]["frames"][:6], [
            "py Array.__init__ (/usr/lib/python3/dist-packages/pyopencl/array.py:680)",
            "py to_device (/venv/lib/python3.11/site-packages/pyopencl/array.py:2100)",
            "py load (/src/train.py:12)", "py <module> (/src/train.py:40)",
            "py _run_code (/usr/lib/python3.11/runpy.py:88)", "py <module> (<frozen runpy>:1)"])

    def test_module_reloaded_at_same_addresses(self):
        # A library unloaded and another loaded at its addresses: each
        # site's pc is in the last module declared before the site.
        lines = ["# gpupool trace 2", "# pid 4 start_unix_ns 1",
                 "module 0 5000 6000 4000 - /nonexistent/libold.so",
                 "site 0 5020 -",
                 "module 1 5000 6000 4000 - /nonexistent/libnew.so",
                 "site 1 5020 -",
                 "arena 0 cuda cuda:0 dev 0",
                 "a 1 1 0 a0 100 128 m 0", "a 2 1 0 b0 300 384 m 1"]
        r, out = self.report(self.write("reload.trace", "\n".join(lines) + "\n"))
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        d, _ = self.data(out)
        self.assertEqual(sorted(x["label"] for x in d["end"]["sites"]),
                         ["libnew.so+0x1020", "libold.so+0x1020"])

    def test_without_sites_by_arena(self):
        # No call stacks: what is still held is shown per arena; beyond the
        # 20 largest rows, the rest is summed up.
        lines = ["# gpupool trace 1", "# pid 3 start_unix_ns 1"]
        for a in range(22):
            lines.append(f"arena {a} opencl opencl:dev ctx {a:#x} flags 0x1")
        for a in range(22):
            lines.append(f"a {a + 1} 1 {a} {a + 16:x} {(a + 1) * 1000} {(a + 1) * 1024} m")
        r, out = self.report(self.write("arenas.trace", "\n".join(lines) + "\n"))
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        d, html = self.data(out)
        self.assertEqual(d["end"]["rows"], 22)
        self.assertEqual(d["end"]["bytes"], sum(range(1, 23)) * 1000)
        self.assertEqual([(x["arena"], x["bytes"]) for x in d["end"]["sites"]],
                         [(f"ctx {a:#x} flags 0x1", (a + 1) * 1000) for a in range(21, 1, -1)])
        self.assertIn("No call stacks in this trace", html)
        self.assertIn("2 more rows hold 2.9 KiB in 2 blocks.", html)

    def test_browser_draws_it(self):
        dom = chromium_dom
        r, out = self.report(self.known_trace())
        self.assertEqual(r.returncode, OK, r.stderr)
        page = dom(out)
        self.assertIn('data-status="ok"', page, page[-2000:])
        # Memory for the one pool group, hits and misses, two size plots.
        self.assertEqual(page.count('class="plot"'), 4)
        # Two pool groups, and a trace with no record at all.
        r, two = self.report(self.write("two.trace", Trace.KNOWN), "two.html")
        self.assertEqual(r.returncode, OK, r.stderr)
        page = dom(two)
        self.assertIn('data-status="ok"', page, page[-2000:])
        self.assertEqual(page.count('class="plot"'), 5)
        r, empty = self.report(self.write("empty.trace", "\n".join(Trace.KNOWN.splitlines()[:4])
                                          + "\n"), "empty.html")
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn('data-status="ok"', dom(empty))
        # A page whose script fails says so, on the page too (the check can fail).
        broken = os.path.join(self.tmp, "broken.html")
        with open(out) as f:
            text = f.read()
        with open(broken, "w") as f:
            f.write(text.replace('"groups":[', '"groups":7,"x":[', 1))
        page = dom(broken)
        self.assertIn('data-status="error: ', page)
        self.assertIn("The page's script failed: ", page)

    def test_screenshot(self):
        chromium()
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts",
                              "report-screenshot.sh")
        png = os.path.join(self.tmp, "report.png")
        # No sanitizer runtime preloaded here: it would be in Chromium too.
        env = clean_env(GPUPOOL=LAUNCHER)
        env.pop("LD_PRELOAD", None)
        r = subprocess.run([script, self.write("two.trace", Trace.KNOWN), png], env=env,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_bad_trace_one_error_no_output(self):
        good = ("# gpupool trace 2\n# pid 5 start_unix_ns 1\narena 0 cuda cuda:0 dev\n"
                "a 10 1 0 a0 100 128 m\n")
        cases = {"notrace": ("hello\n", 1), "badline": (good + "a 20 1 0\n", 5),
                 "badsite": (good + "a 20 1 0 b0 1 1 m 3\n", 5)}
        for name, (text, line) in cases.items():
            src = self.write(name + ".trace", text)
            r, out = self.report(src, name + ".html")
            self.assertEqual(r.returncode, FAILED, name)
            self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
            self.assertIn(f"{src}:{line}:", r.stderr)
            self.assertEqual([n for n in os.listdir(self.tmp) if not n.endswith(".trace")], [],
                             "output left behind")
        missing = os.path.join(self.tmp, "missing")
        r, _ = self.report(missing, "missing.html")
        self.assertEqual(r.returncode, FAILED)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn(f"cannot open {missing}: No such file or directory", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "missing.html")))
        # A directory: its traces are read, and the first bad one is the
        # one message, never an abort.
        r, _ = self.report(self.tmp, "dir.html")
        self.assertEqual(r.returncode, FAILED, r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn(f"{self.tmp}/badline.trace:5:", r.stderr)
        self.assertEqual(gp("report", "x.trace").returncode, USAGE)
        self.assertEqual(gp("report", "x.trace", "-o").returncode, USAGE)
        self.assertEqual(gp("report", "x.trace", "--diff").returncode, USAGE)
        self.assertEqual(gp("report", "--diff", "x.trace", "-o", "y").returncode, USAGE)
        self.assertEqual(gp("report", "--bogus", "x.trace", "-o", "y").returncode, USAGE)

    def test_killed_program(self):
        trace = os.path.join(self.tmp, "killed.trace")
        p = subprocess.Popen([HARNESS, "workload", "100000000"],
                             env=clean_env(GPUPOOL_TRACE_FILE=trace), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and (not os.path.exists(trace) or
                                          os.path.getsize(trace) < 200000):
            time.sleep(0.05)
        p.kill()
        p.wait()
        # And a line cut short, as a kill during a write leaves it.
        with open(trace, "a") as f:
            f.write("a 99999999999 1 0 ab")
        with open(trace) as f:
            allocs = sum(1 for line in f if line.startswith("a ") and line.endswith("\n"))
        r, out = self.report(trace)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("last line is incomplete", r.stderr)
        d, _ = self.data(out)
        self.assertGreater(allocs, 1000)
        self.assertEqual(d["allocations"], allocs)

    def test_million_events(self):
        # 500,000 pairs in two groups. cuda-host: at step i it holds
        # i % 1000 + 1 blocks of 4 KiB, so its exact peak is 1000 blocks,
        # reached many times; then it frees them all and stays at 0 while
        # cuda:0, holding one block of 3 MiB, goes on with pairs of 64 B.
        trace = os.path.join(self.tmp, "big.trace")
        lines = ["# gpupool trace 2", "# pid 9 start_unix_ns 1", "arena 0 cuda cuda:0 dev 0",
                 "arena 1 cuda-host cuda-host pinned"]
        t = 0
        held = []
        for i in range(250000):
            t += 10
            lines.append(f"a {t} 1 1 {i:x} 4096 4096 {'h' if i else 'm'}")
            held.append(i)
            if len(held) > i % 1000 + 1 or len(held) >= 1000:
                while len(held) > i % 1000:
                    t += 10
                    lines.append(f"f {t} 1 1 {held.pop():x} 4096 4096")
        while held:
            t += 10
            lines.append(f"f {t} 1 1 {held.pop():x} 4096 4096")
        t += 10
        lines.append(f"a {t} 2 0 ffff0 {3 * self.MIB} {3 * self.MIB} m")
        while len(lines) - 4 < 1000000:
            t += 10
            lines.append(f"a {t} 2 0 {len(lines):x} 64 64 m")
            t += 10
            lines.append(f"f {t} 2 0 {len(lines) - 1:x} 64 64")
        self.write("big.trace", "\n".join(lines) + "\n")
        t0 = time.time()
        r, out = self.report(trace)
        took = time.time() - t0
        self.assertEqual(r.returncode, OK, r.stderr)
        # The time docs/trace.md quotes (a bound far above it only catches
        # work that is no longer linear; speed is the benchmarks' to judge).
        print(f"report of a million events: {took:.2f} s")
        self.assertLess(took, 60)
        d, _ = self.data(out)
        self.assertEqual(d["allocations"], sum(1 for x in lines if x.startswith("a ")))
        self.assertEqual(d["frees"], sum(1 for x in lines if x.startswith("f ")))
        self.assertEqual(d["allocations"] + d["frees"], len(lines) - 4)
        g = {x["name"]: x for x in d["groups"]}
        self.assertEqual(g["cuda-host"]["peak_active"]["bytes"], 1000 * 4096)
        self.assertEqual(g["cuda:0"]["peak_active"]["bytes"], 3 * self.MIB + 64)
        self.assertEqual((d["end"]["blocks"], d["end"]["bytes"]), (1, 3 * self.MIB))
        # All groups together: cuda-host's peak, before cuda:0 had any.
        self.assertEqual(d["peak"]["bytes"], 1000 * 4096)
        for x in d["groups"]:
            for series in ("t", "active", "in_blocks", "managed"):
                self.assertLessEqual(len(x[series]), 2000)
            # A peak survives the downsampling.
            self.assertEqual(max(x["active"]), x["peak_active"]["bytes"])
            self.assertEqual(max(x["managed"]), x["peak_managed"]["bytes"])
        # Once cuda-host has freed all, its plot shows 0, not its last maximum.
        self.assertEqual(g["cuda-host"]["active"][-1], 0)
        self.assertEqual(g["cuda-host"]["in_blocks"][-1], 0)
        self.assertEqual(g["cuda-host"]["end"]["active"], 0)
        print(f"report of {len(lines) - 4} events: {took:.1f} s, {os.path.getsize(out)} bytes",
              file=sys.stderr)

    def test_many_pool_groups(self):
        """A program of 20,000 OpenCL contexts (a pool group each, one buffer
        each): the report's memory and page grow with the records, not by a
        fixed cost per group. The five largest groups are shown in detail,
        the others summed up, exactly."""
        groups, big = 20000, {4000, 8000, 12000, 16000, 19999}
        lines, sizes = [], {}
        for i in range(groups):
            size = (1 + i) * self.MIB if i in big else 4096 * (1 + i % 7)
            sizes[i] = size
            lines.append(f"arena {i} opencl opencl:0x{0x5000 + i:x} opencl ctx 0x{0x5000 + i:x} dev "
                         "pthread flags 0x1")
            lines.append(f"a {10 * i + 1} 1 {i} {0x100 + i:x} {size} {size} m")
            if i not in big:
                lines.append(f"f {10 * i + 5} 1 {i} {0x100 + i:x} {size} {size}")
        trace = self.write("many.trace", trace_text(5, 1, lines))
        out = os.path.join(self.tmp, "r.html")
        r, maxrss = gp_with_rss("report", trace, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        page = os.path.getsize(out)
        print(f"report of {groups} pool groups ({os.path.getsize(trace)} B of trace): "
              f"peak RSS {maxrss >> 20} MiB, page {page} B", file=sys.stderr)
        self.assertLess(page, 20 * self.MIB)
        if not SANITIZER_PRELOAD:  # a sanitizer's shadow and quarantine are not the report's
            self.assertLess(maxrss, 200 * self.MIB)
        d, html = self.data(out)
        shown = [g for g in d["groups"] if not g.get("others")]
        (rest,) = [g for g in d["groups"] if g.get("others")]
        names = {g["name"] for g in shown}
        self.assertTrue({f"opencl:0x{0x5000 + i:x}" for i in big} <= names, names)
        self.assertEqual(rest["others"], groups - len(shown))
        self.assertLess(len(shown), 100)
        # The others together: every figure exact. Their buffers never
        # overlap in time: the peak active is the largest one; every freed
        # block stays held (managed), so their peak managed is all of them.
        others = [i for i in range(groups) if f"opencl:0x{0x5000 + i:x}" not in names]
        self.assertEqual((rest["allocations"], rest["hits"]), (len(others), 0))
        self.assertEqual(rest["peak_active"]["bytes"], max(sizes[i] for i in others))
        self.assertEqual(rest["peak_managed"]["bytes"], sum(sizes[i] for i in others))
        self.assertEqual(rest["end"], {"active": sum(sizes[i] for i in others if i in big),
                                       "managed": sum(sizes[i] for i in others)})
        self.assertEqual(max(rest["managed"]), rest["peak_managed"]["bytes"])
        self.assertIn(f"{rest['others']} other pool groups", html)
        for g in shown:
            i = int(g["name"].split("0x")[1], 16) - 0x5000
            self.assertEqual((g["allocations"], g["peak_active"]["bytes"]), (1, sizes[i]))
            # A group's plot has the points its records make, not a fixed number.
            self.assertLessEqual(len(g["t"]), 4)
        # Drawn: a plot per group shown and one for the others, then the
        # rates and the two of sizes.
        dom = chromium_dom(out)
        self.assertIn('data-status="ok"', dom, dom[-2000:])
        self.assertEqual(dom.count('class="plot"'), len(shown) + 1 + 3)
        r = gp("report", "--text", trace)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn(f"{rest['others']} other pool groups", r.stdout)
        self.assertLess(len(r.stdout.splitlines()), 200)


def trace_text(pid, start_ns, lines, cmdline=None, version=2):
    """A trace file's text: the header, then `lines`."""
    head = [f"# gpupool trace {version}", f"# pid {pid} start_unix_ns {start_ns}"]
    if cmdline is not None:
        head.append(f"# cmdline {cmdline}")
    return "\n".join(head + lines) + "\n"


def head_and_tail(path):
    """A text file's lines."""
    with open(path) as f:
        return f.read().splitlines()


def page_data(html_path):
    """The data block of a report page, and the page's text."""
    with open(html_path) as f:
        text = f.read()
    tag = '<script type="application/json" id="data">'
    start = text.index(tag) + len(tag)
    return json.loads(text[start:text.index("</script>", start)]), text


def chromium():
    """Chromium's path. Missing, the test fails (CI installs it), or is
    skipped where SKIP_BROWSER_TESTS is set (the GPU machines,
    which cannot install it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("SKIP_BROWSER_TESTS"):
        raise unittest.SkipTest("no Chromium here (SKIP_BROWSER_TESTS is set)")
    raise AssertionError("chromium is needed (scripts/install-deps.sh installs it)")


def chromium_dom(page):
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=5000", "--dump-dom", "file://" + page],
                          capture_output=True, text=True, timeout=120).stdout


def flame_paths(flame):
    """A flame graph's nodes as {(frame, ...) from the root: (bytes, blocks)}."""
    nodes, names = flame["nodes"], flame["names"]
    paths = {}
    for i, (name, parent, nbytes, blocks) in enumerate(nodes):
        path = () if i == 0 else paths[parent][0] + (names[name],)
        paths[i] = (path, nbytes, blocks)
    return {p: (b, k) for p, b, k in paths.values()}


MIB = 1 << 20
KIB = 1 << 10


class Several(InTmpDir):
    """Several processes' traces: `report` and `trace convert` take a file
    with its siblings (NAME.PID.EXT), several files or a directory, say
    which files they read, and show each process and all together on one
    clock; a bad file is one message naming it and its line."""

    S = 1_700_000_000_000_000_000

    PREFIX = "gpupool-several-"

    def run_dir(self):
        """out.trace (pid 10) and its siblings out.11.trace (started 0.5 ms
        later) and out.12.trace (0.25 ms later); beside them, files that are
        not its siblings or not traces."""
        arena = "arena 0 cuda cuda:0 dev 0"
        out = self.write("run/out.trace", trace_text(10, self.S, [
            arena, "a 1000 1 0 a0 100 128 m", "f 2000 1 0 a0 100 128"]))
        self.write("run/out.11.trace", trace_text(11, self.S + 500_000, [arena, "a 1000 2 0 b0 200 256 m"]))
        self.write("run/out.12.trace", trace_text(12, self.S + 250_000, [arena, "a 1000 3 0 c0 300 384 m"]))
        self.write("run/out.x.trace", trace_text(99, self.S, [arena, "a 1000 4 0 d0 400 512 m"]))
        self.write("run/out.13.trace", "hello\n")
        self.write("run/notes.txt", "not a trace\n")
        return out

    def perfetto(self, *inputs):
        r = gp("trace", "convert", *inputs, "--to", "perfetto", "-o", "-")
        self.assertEqual(r.returncode, OK, r.stderr)
        doc = json.loads(r.stdout)
        counters = sorted((e["pid"], e["ts"], e["args"]["active"]) for e in doc["traceEvents"]
                          if e["ph"] == "C")
        return counters, r.stderr

    def test_convert_siblings_and_directory(self):
        out = self.run_dir()
        run = os.path.dirname(out)
        # The file and its siblings, on one clock: the earliest start.
        counters, err = self.perfetto(out)
        self.assertEqual(counters, [(10, 1.0, 100), (10, 2.0, 0), (11, 501.0, 200), (12, 251.0, 300)])
        self.assertIn(f"3 traces: {out}, {run}/out.11.trace, {run}/out.12.trace\n", err)
        self.assertIn(f"{run}/out.13.trace: not a gpupool trace, left out", err)
        # A directory: every trace in it.
        counters, err = self.perfetto(run)
        self.assertEqual(sorted({c[0] for c in counters}), [10, 11, 12, 99])
        self.assertIn(f"{run}: 2 files that are not traces left out", err)
        # Several files, one of them twice: read once.
        counters, err = self.perfetto(f"{run}/out.11.trace", f"{run}/out.11.trace")
        self.assertEqual(counters, [(11, 1.0, 200)])
        self.assertIn(f"1 trace: {run}/out.11.trace\n", err)
        # One file and no siblings: as before, nothing said.
        solo = self.write("solo/solo.trace", trace_text(5, self.S, ["arena 0 cuda cuda:0 dev 0"]))
        r = gp("trace", "convert", solo, "--to", "perfetto", "-o", "-")
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        # RMM: one log per process, OUTPUT.PID.EXT; not to standard output.
        csv = os.path.join(self.tmp, "log.csv")
        r = gp("trace", "convert", out, "--to", "rmm", "-o", csv)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn(f"wrote {self.tmp}/log.10.csv, {self.tmp}/log.11.csv, {self.tmp}/log.12.csv", r.stderr)
        with open(os.path.join(self.tmp, "log.11.csv")) as f:
            self.assertEqual(f.read().splitlines()[1:], ["2,22:13:20.000501,allocate,0xb0,200,0x0"])
        self.assertFalse(os.path.exists(csv))
        r = gp("trace", "convert", out, "--to", "rmm", "-o", "-")
        self.assertEqual(r.returncode, FAILED)
        self.assertIn("an RMM log is one process's", r.stderr)
        # Only siblings (the first process made no GPU call): those.
        os.remove(out)
        counters, err = self.perfetto(out)
        self.assertEqual(sorted({c[0] for c in counters}), [11, 12])

    def test_bad_file_among_several(self):
        out = self.run_dir()
        bad = self.write("run/out.14.trace", trace_text(14, self.S, ["arena 0 cuda cuda:0 dev 0", "a 1 2"]))
        for cmd in (["trace", "convert", out, "--to", "perfetto", "-o", os.path.join(self.tmp, "x.json")],
                    ["report", out, "-o", os.path.join(self.tmp, "x.html")],
                    ["report", "--text", os.path.dirname(out)]):
            r = gp(*cmd)
            self.assertEqual(r.returncode, FAILED, cmd)
            self.assertEqual(r.stderr, f"gpupool: {cmd[0] if cmd[0] == 'report' else 'trace convert'}: "
                                       f"{bad}:4: expected 'a T TID ARENA HANDLE REQUESTED SIZE h|m|d [SITE]'\n")
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "x.json")))
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "x.html")))
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        self.write("empty/a.txt", "x\n")
        r = gp("report", "--text", empty)
        self.assertEqual(r.returncode, FAILED)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertIn(f"{empty}: no gpupool trace in this directory", r.stderr)

    def two_processes(self):
        """Two ranks of one program, the second started 0.2 ms after the
        first, each holding memory at `step` (train.py:10) for a while, and
        keeping a block from `load` (train.py:20) at the end."""
        frames = ["pyframe 0 10 step /src/train.py", "pyframe 1 30 main /src/train.py",
                  "pyframe 2 20 load /src/train.py", "site 0 - 0,1", "site 1 - 2,1",
                  "arena 0 cuda cuda:0 cuda dev 0 ctx 0x5"]
        a = self.write("ddp/out.trace", trace_text(10, self.S, frames + [
            f"a 100000 1 0 a0 {4 * MIB} {4 * MIB} m 0", f"f 600000 1 0 a0 {4 * MIB} {4 * MIB}",
            f"a 700000 1 0 b0 {MIB} {MIB} m 1"], cmdline="python3 train.py --rank 0"))
        self.write("ddp/out.11.trace", trace_text(11, self.S + 200_000, frames + [
            f"a 100000 1 0 a0 {2 * MIB} {2 * MIB} m 0", f"f 500000 1 0 a0 {2 * MIB} {2 * MIB}",
            f"a 600000 1 0 b0 {512 * KIB} {512 * KIB} m 1"], cmdline="python3 train.py --rank 1"))
        return a

    def test_report_each_process_and_all(self):
        out = os.path.join(self.tmp, "r.html")
        r = gp("report", self.two_processes(), "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("2 traces: ", r.stderr)
        d, html = page_data(out)
        p0, p1 = d["processes"]
        self.assertEqual([(p["pid"], p["cmdline"], p["offset_ns"]) for p in d["processes"]],
                         [(10, "python3 train.py --rank 0", 0), (11, "python3 train.py --rank 1", 200_000)])
        # Each process on its own clock.
        self.assertEqual((p0["peak"]["bytes"], p0["peak"]["t_ns"]), (4 * MIB, 100_000))
        self.assertEqual((p1["peak"]["bytes"], p1["peak"]["t_ns"]), (2 * MIB, 100_000))
        self.assertEqual([(x["label"], x["bytes"], x["arena"]) for x in p1["end"]["sites"]],
                         [("py load (/src/train.py:20)", 512 * KIB, "cuda dev 0 ctx 0x5")])
        # All together, on the first trace's clock: both ranks at step at
        # 0.3 ms; at the end both blocks of load.
        self.assertEqual((d["peak"]["bytes"], d["peak"]["t_ns"]), (6 * MIB, 300_000))
        self.assertEqual([(x["label"], x["blocks"], x["bytes"], x["pids"]) for x in d["peak"]["sites"]],
                         [("py step (/src/train.py:10)", 2, 6 * MIB, [10, 11])])
        self.assertEqual([(x["label"], x["blocks"], x["bytes"], x["pids"], x["group"])
                          for x in d["end"]["sites"]],
                         [("py load (/src/train.py:20)", 2, MIB + 512 * KIB, [10, 11], "cuda:0")])
        self.assertEqual((d["allocations"], d["frees"], d["duration_ns"]), (4, 2, 800_000))
        self.assertEqual([g["peak_active"]["bytes"] for g in d["groups"]], [6 * MIB])
        self.assertEqual([(s["pid"], max(s["v"])) for s in d["process_active"]],
                         [(10, 4 * MIB), (11, 2 * MIB)])
        self.assertEqual(max(d["total_active"]), 6 * MIB)
        # The tables: the processes, and the pids that held each site.
        self.assertIn("<td>11</td><td class=\"l\">python3 train.py --rank 1</td><td>+200 µs</td>", html)
        self.assertRegex(html, r"<td>6\.0 MiB</td><td>2</td><td class=\"l\">10, 11</td>"
                               r"<td class=\"l\"><details><summary>py step \(/src/train.py:10\)")
        self.assertEqual(html.count('<details class="process" open>'), 2)
        page = chromium_dom(out)
        self.assertIn('data-status="ok"', page, page[-2000:])
        # All: by process, cuda:0, rates, two sizes; each process: 4.
        self.assertEqual(page.count('class="plot"'), 5 + 2 * 4)
        self.assertEqual(page.count('class="flame"'), 3 * 2)
        # The text report: each process and all together.
        r = gp("report", "--text", self.two_processes())
        self.assertEqual(r.returncode, OK, r.stderr)
        # (A process's command line and trace on the line under its figures.)
        self.assertRegex(r.stdout, r"pid 11 +started \+200 µs +peak +2\.0 MiB, at the end +512\.0 KiB\n"
                                   r" +python3 train.py --rank 1  \(")
        self.assertIn("== All processes", r.stdout)
        self.assertRegex(r.stdout, r"6\.0 MiB +2 blocks  py step \(/src/train.py:10\)  \[pids 10,11\]")
        self.assertIn("== python3 train.py --rank 0 (pid 10)", r.stdout)

    def test_many_processes(self):
        # Twelve processes: the plot of all has the ten that held the most
        # (and the total, exact); the text leaves out each on its own.
        d = os.path.join(self.tmp, "many")
        for k in range(12):
            self.write(f"many/t.{100 + k}.trace", trace_text(100 + k, self.S + k * 1000, [
                "arena 0 cuda cuda:0 dev 0", f"a 10 1 0 a0 {(k + 1) * KIB} {(k + 1) * KIB} m"]))
        out = os.path.join(self.tmp, "many.html")
        r = gp("report", d, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        data, html = page_data(out)
        self.assertEqual(len(data["processes"]), 12)
        self.assertEqual([s["pid"] for s in data["process_active"]], list(range(102, 112)))
        self.assertEqual(max(data["total_active"]), sum(range(1, 13)) * KIB)
        self.assertEqual(data["peak"]["bytes"], sum(range(1, 13)) * KIB)
        self.assertEqual(html.count('<details class="process">'), 12)  # folded
        r = gp("report", "--text", d)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertEqual(r.stdout.count("\n  pid "), 12)
        self.assertIn("Each process on its own is left out with more than 8 processes", r.stdout)
        self.assertNotIn("\n== pid 100", r.stdout)

    def test_two_programs_traced(self):
        """Two real processes, traced by the library into a file and its
        sibling, by two runs, and read together by naming both; the trace
        header names each one's command line."""
        if not REPORT_PROGRAM:
            self.skipTest("no report_program (OpenCL not built)")
        d = os.path.join(self.tmp, "real")
        os.mkdir(d)
        trace = os.path.join(d, "out.trace")
        r = gp("run", "--trace", trace, "--set", "SITES=all", "--", REPORT_PROGRAM, "first run", "it's")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = gp("run", "--trace", os.path.join(d, "out.%p.trace"), "--set", "SITES=all", "--",
               REPORT_PROGRAM, "second")
        self.assertEqual(r.returncode, 0, r.stderr)
        (sibling,) = [n for n in os.listdir(d) if n != "out.trace"]
        self.assertRegex(sibling, r"^out\.\d+\.trace$")
        with open(trace) as f:
            head = f.read(4096).splitlines()
        self.assertIn(f"# cmdline {REPORT_PROGRAM} 'first run' 'it'\\''s'", head[:4])
        out = os.path.join(self.tmp, "real.html")
        r = gp("report", trace, os.path.join(d, sibling), "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertEqual(f"gpupool: report: 2 traces: {trace}, {d}/{sibling}\n", r.stderr)
        data, _ = page_data(out)
        self.assertEqual([p["cmdline"] for p in data["processes"]],
                         [f"{REPORT_PROGRAM} 'first run' 'it'\\''s'", f"{REPORT_PROGRAM} second"])
        for p in data["processes"]:
            self.assertEqual(p["peak"]["bytes"], 13 * MIB)
            self.assertEqual((p["end"]["blocks"], p["end"]["bytes"]), (4, 3 * MIB + 64 * KIB))
        # One after the other. Each trace ends with its process's exit:
        # all together, what the first held at its exit stops counting
        # there, and its pool group holds nothing at the end; what each
        # never freed is still held at its own end.
        self.assertRegex(head_and_tail(trace)[-1], r"^# end \d+$")
        self.assertEqual(data["peak"]["bytes"], 13 * MIB)
        self.assertEqual((data["end"]["blocks"], data["end"]["bytes"]), (8, 2 * (3 * MIB + 64 * KIB)))
        self.assertEqual([g["end"] for g in data["groups"]], [{"active": 0, "managed": 0}])

    def test_run_replaces_an_earlier_runs_traces(self):
        """`gpupool run --trace F` removes what an earlier run left under
        F's names (F and its siblings) before the program starts, so that
        a report reads this run's processes only; the user's own files, %p
        names and runs within a run are left. While a live process writes
        one of the names (another run under way), it refuses, changing
        nothing."""
        d = os.path.join(self.tmp, "again")
        arena = "arena 0 cuda cuda:0 dev 0"
        for name in ("out.trace", "out.77.trace", "out.79.trace", "out.80.trace"):
            self.write(f"again/{name}", trace_text(7, self.S, [arena]))
        self.write("again/out.78.trace", "my own notes\n")
        self.write("again/other.81.trace", trace_text(81, self.S, [arena]))
        # A live process holds out.79.trace, as a traced process holds its file.
        holder = subprocess.Popen(
            [sys.executable, "-c", "import fcntl,sys; f=open(sys.argv[1]); "
             "fcntl.flock(f, fcntl.LOCK_EX); print(flush=True); sys.stdin.read()",
             os.path.join(d, "out.79.trace")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            holder.stdout.readline()
            # Within another run: left alone.
            env = clean_env()
            env["GPUPOOL_RUN_PID"] = "1"
            r = gp("run", "--trace", os.path.join(d, "out.trace"), "--", "true", env=env)
            self.assertEqual((r.returncode, r.stderr), (0, ""))
            self.assertEqual(len(os.listdir(d)), 6)
            r = gp("run", "--trace", os.path.join(d, "out.%p.trace"), "--", "true")
            self.assertEqual((r.returncode, r.stderr), (0, ""))
            self.assertEqual(len(os.listdir(d)), 6)
            marker = os.path.join(self.tmp, "ran")
            r = gp("run", "--trace", os.path.join(d, "out.trace"), "--", "touch", marker)
            self.assertEqual((r.returncode, r.stdout), (USAGE, ""))
            real = os.path.realpath(d)
            self.assertEqual(r.stderr, f"gpupool: run: --trace {real}/out.trace: {real}/out.79.trace "
                             "is being written by process 7: another run is using this name; "
                             "give this run another (or a directory of its own), or wait until it "
                             "ends; the program was not started\n")
            self.assertEqual(len(os.listdir(d)), 6)
            self.assertFalse(os.path.exists(marker))
        finally:
            holder.stdin.close()
            holder.stdout.close()
            holder.wait()
        r = gp("run", "--trace", os.path.join(d, "out.trace"), "--", "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(os.listdir(d)), ["other.81.trace", "out.78.trace"])
        prefix = f"gpupool: run: removed 4 traces an earlier run left beside {real}/out.trace: "
        self.assertTrue(r.stderr.startswith(prefix) and r.stderr.endswith("\n"), r.stderr)
        self.assertEqual(sorted(r.stderr[len(prefix):-1].split(", ")),
                         ["out.77.trace", "out.79.trace", "out.80.trace", "out.trace"])

    @unittest.skipUnless(CL_WORKLOAD and REPORT_PROGRAM, "OpenCL not built")
    def test_two_runs_at_once_kept_apart(self):
        """Two unrelated `gpupool run --trace t` at once: the second is
        refused while the first writes t. Two started at the same moment
        (the second's program finds t taken and writes its sibling) are
        told apart by their traces' '# run' lines: `report t` reads the
        first run only, saying so, and `report t.PID` the second (before:
        "2 processes" of one program)."""
        t = os.path.join(self.tmp, "t")
        first = Serving([LAUNCHER, "run", "--trace", t, "--", CL_WORKLOAD, "serve"], clean_env())
        try:
            before = read_text(t)
            r = gp("run", "--trace", t, "--", REPORT_PROGRAM)
            self.assertEqual((r.returncode, r.stdout), (USAGE, ""))
            self.assertIn(f"{t} is being written by process {first.pid}", r.stderr)
            self.assertEqual(sorted(os.listdir(self.tmp)), ["t"])
            self.assertEqual(read_text(t), before)
            # The second run's program as `gpupool run` starts it (its own
            # pid as GPUPOOL_RUN_PID), begun before the first took t.
            env = clean_env(LD_PRELOAD=TEST_PRELOAD, GPUPOOL_TRACE_FILE=t)
            second = subprocess.run(["sh", "-c", 'GPUPOOL_RUN_PID=$$ exec "$0"', REPORT_PROGRAM],
                                    env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(second.returncode, 0, second.stderr)
        finally:
            first.close()
        siblings = [n for n in os.listdir(self.tmp) if n != "t"]
        self.assertEqual(len(siblings), 1, siblings)
        other = os.path.join(self.tmp, siblings[0])
        r = gp("report", "--json", t)
        self.assertEqual(r.returncode, OK, r.stderr)
        doc = json.loads(r.stdout)
        self.assertNotIn("processes", doc)  # one process: the first run's
        self.assertEqual((doc["pid"], doc["files"]), (first.pid, [t]))
        self.assertIn(f"1 trace beside {t} of another run left out: {other}", r.stderr)
        r = gp("report", "--json", other)
        self.assertEqual(r.returncode, OK, r.stderr)
        doc = json.loads(r.stdout)
        self.assertNotIn("processes", doc)
        self.assertEqual(doc["files"], [other])
        self.assertEqual((doc["end"]["blocks"], doc["end"]["bytes"]), (4, 3 * MIB + 64 * KIB))

    def test_exited_process_stops_counting(self):
        """Rank 0 exits (its '# end') at 0.75 ms holding a block of load;
        rank 1 has no '# end' (killed): its block counts to the end."""
        a = self.two_processes()
        with open(a, "a") as f:
            f.write("# end 750000\n")
        out = os.path.join(self.tmp, "r.html")
        r = gp("report", a, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        d, _ = page_data(out)
        # On its own, rank 0 still held its block at its exit.
        p0 = d["processes"][0]
        self.assertEqual((p0["end"]["bytes"], p0["duration_ns"]), (MIB, 750_000))
        # Together: what each never freed, rank 0's at its exit among it.
        self.assertEqual((d["peak"]["bytes"], d["peak"]["t_ns"]), (6 * MIB, 300_000))
        self.assertEqual([(x["label"], x["bytes"], x["pids"]) for x in d["end"]["sites"]],
                         [("py load (/src/train.py:20)", MIB + 512 * KIB, [10, 11])])
        self.assertEqual(d["end"]["bytes"], MIB + 512 * KIB)
        # But its memory, the block and the 4 MiB it held for reuse, went
        # with it: its pool group holds rank 1's alone at the end.
        (g,) = d["groups"]
        self.assertEqual(g["end"], {"active": 512 * KIB, "managed": 2 * MIB + 512 * KIB})
        r = gp("report", "--text", a)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("Still held at each process's end (1.5 MiB in 2 blocks)", r.stdout)
        self.assertRegex(r.stdout, r"1\.5 MiB +2 blocks  py load \(/src/train.py:20\)  \[cuda:0, pids 10,11\]")


class Flame(InTmpDir):
    """The report's flame graphs (icicles) of bytes by call stack, at the
    peak and at the end: each frame's bytes are its callees', a named
    frame's return addresses merge, tiny frames are left out but counted,
    and a browser draws them."""

    PREFIX = "gpupool-flame-"

    def report(self, text):
        trace = os.path.join(self.tmp, "t.trace")
        with open(trace, "w") as f:
            f.write(text)
        out = os.path.join(self.tmp, "r.html")
        r = gp("report", trace, "-o", out)
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        return out

    KNOWN = trace_text(4, 1, [
        "module 0 1000 2000 0 - /nonexistent/libcuda.so.1",
        "module 1 5000 9000 4000 - /nonexistent/libapp.so",
        "pyframe 0 10 step /src/train.py", "pyframe 1 30 main /src/train.py",
        # innermost first: the runtime, then the program's frames
        "site 0 1010,5020,5100,5200 -", "site 1 1010,5030,5100,5200 -",
        "site 2 1010,5020,5100,5300 -", "site 3 1010 0,1",
        "arena 0 cuda cuda:0 dev 0",
        "a 10 1 0 a0 1000 1024 m 0", "a 20 1 0 b0 2000 2048 m 1", "a 30 1 0 c0 4000 4096 m 2",
        "a 40 1 0 d0 8000 8192 m 3", "f 50 1 0 c0 4000 4096"])

    def test_known_stacks(self):
        out = self.report(self.KNOWN)
        d, html = page_data(out)
        app = lambda off: f"libapp.so+{off}"
        cuda = "libcuda.so.1+0x1010"
        # At the peak (15000 bytes): from the outermost frame in; a Python
        # site by its Python stack.
        self.assertEqual(flame_paths(d["peak"]["flame"]), {
            (): (15000, 4),
            (app("0x1200"),): (3000, 2),
            (app("0x1200"), app("0x1100")): (3000, 2),
            (app("0x1200"), app("0x1100"), app("0x1020")): (1000, 1),
            (app("0x1200"), app("0x1100"), app("0x1020"), cuda): (1000, 1),
            (app("0x1200"), app("0x1100"), app("0x1030")): (2000, 1),
            (app("0x1200"), app("0x1100"), app("0x1030"), cuda): (2000, 1),
            (app("0x1300"),): (4000, 1),
            (app("0x1300"), app("0x1100")): (4000, 1),
            (app("0x1300"), app("0x1100"), app("0x1020")): (4000, 1),
            (app("0x1300"), app("0x1100"), app("0x1020"), cuda): (4000, 1),
            ("py main (/src/train.py)",): (8000, 1),
            ("py main (/src/train.py)", "py step (/src/train.py)"): (8000, 1)})
        # At the end, without the block freed.
        end = flame_paths(d["end"]["flame"])
        self.assertEqual(end[()], (11000, 3))
        self.assertNotIn((app("0x1300"),), end)
        page = chromium_dom(out)
        self.assertIn('data-status="ok"', page, page[-2000:])
        self.assertEqual(page.count('class="flame"'), 2)
        # Every frame drawn (all are wider than a pixel), with its name.
        self.assertEqual(page.count("<g data-node="), len(d["peak"]["flame"]["nodes"]) +
                         len(d["end"]["flame"]["nodes"]))
        self.assertIn(">py step (/src/train.py)<", page)

    def test_tiny_frames_left_out(self):
        # 3000 sites of one byte and one of 100 MB: the small ones, narrower
        # than a pixel, are not sent, but the root counts them.
        lines = [f"site {k} {0x100000 + k:x} -" for k in range(3001)] + ["arena 0 cuda cuda:0 dev 0"]
        lines += [f"a {k + 1} 1 0 {k + 1:x} 1 1 m {k}" for k in range(3000)]
        lines.append(f"a 5000 1 0 ffff {100 * MIB} {100 * MIB} m 3000")
        d, _ = page_data(self.report(trace_text(4, 1, lines)))
        flame = d["peak"]["flame"]
        self.assertEqual(flame_paths(flame), {(): (100 * MIB + 3000, 3001), ("0x100bb8",): (100 * MIB, 1)})

    def test_program_frames_by_function(self):
        """A real program's stacks: a function's call sites (return
        addresses) are one frame."""
        if not REPORT_PROGRAM:
            self.skipTest("no report_program (OpenCL not built)")
        trace = os.path.join(self.tmp, "p.trace")
        r = gp("run", "--trace", trace, "--set", "SITES=all", "--", REPORT_PROGRAM)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = os.path.join(self.tmp, "p.html")
        r = gp("report", trace, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        d, _ = page_data(out)
        paths = flame_paths(d["peak"]["flame"])
        self.assertEqual(paths[()], (13 * MIB, 8))
        # forward() and load_weights() are called from two places (return
        # addresses, lines) in main: one frame, holding everything.
        mains = [(p, b) for p, b in paths.items() if p and re.match(r"main\b", p[-1])]
        self.assertEqual(len(mains), 1, mains)
        self.assertEqual(mains[0][1], (13 * MIB, 8))
        self.assertFalse([p for p in paths if p and re.match(r"\w+(\+0x[0-9a-f]+ \(|.*:\d+\))", p[-1])],
                         paths)


class Text(InTmpDir):
    """`report --text` (terminals and CI logs: the summary, the peaks, the
    leak list with stacks) and `report --diff BASE` (what changed between
    two runs, sites matched across builds)."""

    PREFIX = "gpupool-text-"

    def test_control_characters_escaped(self):
        """A trace's strings (the command line, Python frames, a pool
        group, the file's own name) reach the terminal with their control
        characters written out as \\xNN: an ESC or BEL in them would drive
        the terminal. The page escapes them too."""
        evil = "\x1b]0;owned\x07\x1b[2J\x9b1m\x7f"
        lines = [f"pyframe 0 10 step{evil} /src/t{evil}.py", "site 0 - 0",
                 f"arena 0 cuda cuda:0{evil} dev 0", "a 10 1 0 a0 100 128 m 0"]
        trace = self.write(f"e{evil}.trace", trace_text(4, 1, lines, cmdline=f"python3 x{evil}"))
        shown = r"\x1b]0;owned\x07\x1b[2J\xc2\x9b1m\x7f"
        r = gp("report", "--text", trace)
        self.assertEqual(r.returncode, OK, r.stderr)
        for c in "\x1b\x07\x9b\x7f":
            self.assertNotIn(c, r.stdout + r.stderr)
        # (Lines the escapes made longer than 100 columns are wrapped.)
        flat = re.sub(r"\n +", " ", r.stdout)
        self.assertIn(f"gpupool report: python3 x{shown} (pid 4)", flat)
        self.assertIn(f"py step{shown} (/src/t{shown}.py:10)", flat)
        self.assertIn(f"cuda:0{shown}", flat)
        # An error names the file, escaped too.
        self.write(f"bad{evil}.trace", "# gpupool trace 2\nnonsense\n")
        r = gp("report", "--text", os.path.join(self.tmp, f"bad{evil}.trace"))
        self.assertEqual(r.returncode, FAILED)
        self.assertIn(f"bad{shown}.trace:2:", r.stderr)
        self.assertNotIn("\x1b", r.stderr)
        out = os.path.join(self.tmp, "e.html")
        r = gp("report", trace, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        d, html = page_data(out)
        for c in "\x1b\x07\x9b\x7f":
            self.assertNotIn(c, html)
        self.assertEqual(d["cmdline"], f"python3 x{evil}")  # the data keeps the string
        self.assertIn(f"python3 x{shown}", html)

    def test_known_trace(self):
        trace = self.write("t.trace", Flame.KNOWN)
        r = gp("report", "--text", trace)
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        # The trace has no end record: the title says so.
        self.assertEqual(r.stdout, f"""gpupool report: pid 4, ended without closing its trace: os._exit or a kill
{trace}: 4 allocations, 1 frees over 50 ns; 0% served from held blocks.

Peaks:
  pool group  peak active     at  peak managed     at  allocations  hits  active at end
  cuda:0         14.6 KiB  40 ns      15.0 KiB  40 ns            4     0       10.7 KiB

At the peak of active memory (14.6 KiB at 40 ns), by allocation site:
     7.8 KiB      1 block  py step (/src/train.py:10)
     3.9 KiB      1 block  libapp.so+0x1020
     2.0 KiB      1 block  libapp.so+0x1030
      1000 B      1 block  libapp.so+0x1020

Still held at the end (10.7 KiB in 3 blocks), by allocation site, largest first:
     7.8 KiB      1 block  py step (/src/train.py:10)  [cuda:0 dev 0]
                             py step (/src/train.py:10)
                             py main (/src/train.py:30)
                             libcuda.so.1+0x1010
     2.0 KiB      1 block  libapp.so+0x1030  [cuda:0 dev 0]
                             libcuda.so.1+0x1010
                             libapp.so+0x1030
                             libapp.so+0x1100
                             libapp.so+0x1200
      1000 B      1 block  libapp.so+0x1020  [cuda:0 dev 0]
                             libcuda.so.1+0x1010
                             libapp.so+0x1020
                             libapp.so+0x1100
                             libapp.so+0x1200

Frameworks keep memory until exit on purpose: a cache or a model's weights still held at the end
is not a leak.
""")
        # -o: a file, with the same promise as the page's.
        out = os.path.join(self.tmp, "t.txt")
        r2 = gp("report", "--text", trace, "-o", out)
        self.assertEqual(r2.returncode, OK, r2.stderr)
        with open(out) as f:
            self.assertEqual(f.read(), r.stdout)
        link = os.path.join(self.tmp, "link.txt")
        os.symlink(out, link)
        r2 = gp("report", "--text", trace, "-o", link)
        self.assertEqual(r2.returncode, FAILED)
        self.assertIn("symbolic link", r2.stderr)

    def test_leak_list_of_a_program(self):
        if not REPORT_PROGRAM:
            self.skipTest("no report_program (OpenCL not built)")
        trace = os.path.join(self.tmp, "p.trace")
        r = gp("run", "--trace", trace, "--set", "SITES=all", "--", REPORT_PROGRAM)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = gp("report", "--text", trace)
        self.assertEqual(r.returncode, OK, r.stderr)
        leaks = r.stdout[r.stdout.index("Still held at the end (3.1 MiB in 4 blocks)"):]
        # (The pool group and arena beside the label, or under it when long.)
        rows = re.findall(r"^ +([0-9.]+ \w+) +(\d+) blocks? +(\S.*?)\s+\[opencl:", leaks, re.M)
        self.assertEqual([(b, n) for b, n, _ in rows], [("3.0 MiB", "3"), ("64.0 KiB", "1")], leaks)
        # Each with its stack (the lines under it), the program's main in it.
        stacks = re.split(r"^ +[0-9.]+ \w+ +\d+ blocks? +.*$", leaks, flags=re.M)[1:]
        self.assertEqual(len(stacks), 2, leaks)
        self.assertIn("load_weights", stacks[0])
        self.assertIn("keep_scratch", stacks[1])
        for stack in stacks:
            self.assertRegex(stack, r"\n +main\b")

    def test_fail_on_leak(self):
        """CI gates on `report --text --fail-on-leak`: a program that keeps
        buffers fails it (after the report is written, with one line saying
        how much); one that frees everything passes."""
        if not REPORT_PROGRAM:
            self.skipTest("no report_program (OpenCL not built)")
        leaks = os.path.join(self.tmp, "leaks.trace")
        r = gp("run", "--trace", leaks, "--", REPORT_PROGRAM)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = gp("report", "--text", leaks, "--fail-on-leak")
        self.assertEqual((r.returncode, r.stderr), (LEAKED, "gpupool: report: 3.1 MiB in 4 blocks "
                         "still held at the end, never freed (--fail-on-leak)\n"))
        self.assertIn("Still held at the end (3.1 MiB in 4 blocks)", r.stdout)
        # The page too, written before the gate fails.
        out = os.path.join(self.tmp, "r.html")
        r = gp("report", leaks, "-o", out, "--fail-on-leak")
        self.assertEqual(r.returncode, LEAKED, r.stderr)
        self.assertTrue(os.path.getsize(out) > 0)
        # Without the option, the same report passes.
        self.assertEqual(gp("report", "--text", leaks).returncode, OK)
        freed = os.path.join(self.tmp, "freed.trace")
        r = gp("run", "--trace", freed, "--", REPORT_PROGRAM, "free-all")
        self.assertEqual(r.returncode, 0, r.stderr)
        r = gp("report", "--text", freed, "--fail-on-leak")
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        self.assertIn("Still held at the end (0 B in 0 blocks)", r.stdout)

    def test_fail_on_leak_several_processes(self):
        """With several processes, what each one never freed counts, also
        where that process ended long before the others (a forked child):
        all together, its blocks are not held after its end, but they are
        among what was still held at the end, as in its own view."""
        keeps = ["arena 0 cuda cuda:0 dev 0", "a 10 1 0 a0 1000 1024 m", "a 20 1 0 b0 2000 2048 m",
                 "f 30 1 0 a0 1000 1024"]
        frees = ["arena 0 cuda cuda:0 dev 0", "a 10 1 0 a0 500 512 m", "f 20 1 0 a0 500 512"]
        d = os.path.join(self.tmp, "run")
        os.mkdir(d)
        for pid, lines in ((11, keeps), (12, frees)):
            with open(os.path.join(d, f"t.{pid}.trace"), "w") as f:
                f.write(trace_text(pid, 1, lines + ["# end 40"]))
        # (Standard error's first line names the traces read.)
        r = gp("report", "--text", d, "--fail-on-leak")
        self.assertEqual((r.returncode, r.stderr.splitlines()[1:]), (LEAKED, [
            "gpupool: report: 2.0 KiB in 1 block still held at the end, never freed "
            "(--fail-on-leak)"]))
        together = r.stdout.split("== All processes")[1].split("\n== ")[0]
        self.assertIn("Still held at each process's end (2.0 KiB in 1 block)", together)
        self.assertRegex(together, r"2\.0 KiB +1 block .*pid 11\]")
        data = json.loads(gp("report", "--json", d).stdout)
        self.assertEqual((data["end"]["bytes"], [x["pids"] for x in data["end"]["sites"]]),
                         (2000, [[11]]))
        os.remove(os.path.join(d, "t.11.trace"))
        r = gp("report", "--text", d, "--fail-on-leak")
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertNotIn("--fail-on-leak", r.stderr)

    def test_fail_if_peak_grows(self):
        """`--diff BASE --fail-if-peak-grows PERCENT` fails when the peak
        grew by more than PERCENT (here 4.0 MiB -> 6.0 MiB, +50%)."""
        base, new = self.diff_traces()
        for percent, status in (("10", PEAK_GREW), ("49.9", PEAK_GREW), ("50", OK), ("200", OK)):
            r = gp("report", "--diff", base, new, "--text", "--fail-if-peak-grows", percent)
            self.assertEqual(r.returncode, status, (percent, r.stderr))
            self.assertIn("  peak active             4.0 MiB       6.0 MiB  +2.0 MiB (+50%)\n",
                          r.stdout)
        r = gp("report", "--diff", base, new, "--text", "--fail-if-peak-grows=0")
        self.assertEqual((r.returncode, r.stderr), (PEAK_GREW, "gpupool: report: the peak of active "
                         "memory grew from 4.0 MiB to 6.0 MiB (+50.0%), more than 0% "
                         "(--fail-if-peak-grows)\n"))
        # Shrinking passes any limit; both gates failing: the leak's status.
        r = gp("report", "--diff", new, base, "--text", "--fail-if-peak-grows", "0")
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        r = gp("report", "--diff", base, new, "--text", "--fail-if-peak-grows", "0", "--fail-on-leak")
        self.assertEqual(r.returncode, LEAKED, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 2, r.stderr)
        # From nothing: past any limit.
        empty = self.write("empty.trace", trace_text(7, 1, ["# end 5"]))
        r = gp("report", "--diff", empty, new, "--text", "--fail-if-peak-grows", "1000")
        self.assertEqual((r.returncode, r.stderr), (PEAK_GREW, "gpupool: report: the peak of active "
                         "memory grew from 0 B to 6.0 MiB (--fail-if-peak-grows)\n"))

    def test_gate_usage_errors(self):
        """A PERCENT that is not a number of 0 or more, or the gate without
        --diff: a usage error naming the option and value, nothing written."""
        base, new = self.diff_traces()
        for value in ("-5", "ten", "", "5%", "nan", "inf"):
            r = gp("report", "--diff", base, new, "--text", "--fail-if-peak-grows", value)
            self.assertEqual((r.returncode, r.stdout), (USAGE, ""), value)
            self.assertIn(f"report: --fail-if-peak-grows: '{value}' is not a percentage", r.stderr)
        r = gp("report", "--diff", base, new, "--text", "--fail-if-peak-grows")
        self.assertEqual((r.returncode, r.stdout), (USAGE, ""))
        self.assertIn("--fail-if-peak-grows needs a PERCENT", r.stderr)
        r = gp("report", "--text", new, "--fail-if-peak-grows", "5")
        self.assertEqual((r.returncode, r.stdout), (USAGE, ""))
        self.assertIn("--fail-if-peak-grows compares with --diff BASE", r.stderr)

    def test_every_line_within_100_columns(self):
        """Text output fits a 100-column terminal or CI log: report --text
        (one process and several, with stacks and long arena names),
        --diff, env (with problems), ps, stats, free-held --all (and its
        error for a stopped process), every command's help, each on a real
        program's data (before: report lines of up to 227 columns, stats
        225, env 150, free-held --all's error 125)."""
        if not REPORT_PROGRAM or not CL_WORKLOAD:
            self.skipTest("no report_program (OpenCL not built)")
        one = os.path.join(self.tmp, "one.trace")
        several = os.path.join(self.tmp, "several")
        os.mkdir(several)
        for trace in (one, os.path.join(several, "t.%p.trace"), os.path.join(several, "t.%p.trace")):
            r = gp("run", "--trace", trace, "--set", "SITES=all", "--", REPORT_PROGRAM)
            self.assertEqual(r.returncode, 0, r.stderr)
        outputs = {}
        for args in (("report", "--text", one), ("report", "--text", several),
                     ("report", "--diff", one, several, "--text"), ("--help",),
                     *(("help", c) for c in ("run", "stats", "free-held", "stop-holding", "ps",
                                             "trace", "report", "env", "help"))):
            r = gp(*args)
            self.assertEqual(r.returncode, OK, (args, r.stderr))
            outputs[args] = r.stdout
        r = gp("env", env=clean_env(GPUPOOL_MAX_HELD="x" * 150, GPUPOOL_MAX_HLED="1",
                                   GPUPOOL_LOG_FILE="/" + "long/" * 40 + "log"))
        self.assertIn("Problems:", r.stdout)
        outputs[("env",)] = r.stdout
        env = clean_env(LD_PRELOAD=TEST_PRELOAD, GPUPOOL_REGISTRY=os.path.join(self.tmp, "registry"))
        server = Serving([CL_WORKLOAD, "serve"], env)
        try:
            for _ in range(600):
                r = gp("ps", env=env)
                if str(server.pid) in r.stdout:
                    break
                time.sleep(0.05)
            outputs[("ps",)] = r.stdout
            outputs[("stats",)] = gp("stats", str(server.pid)).stdout
            outputs[("free-held", "--all")] = gp("free-held", "--all", env=env).stdout
            # A process that does not answer: the error, on stderr (before:
            # 125 columns after the stdout line's "process PID (COMMAND): ").
            # (Asked once the kernel shows it stopped.)
            os.kill(server.pid, signal.SIGSTOP)
            try:
                for _ in range(6000):
                    with open(f"/proc/{server.pid}/stat") as f:
                        if f.read().rsplit(")", 1)[1].split()[0] == "T":
                            break
                    time.sleep(0.01)
                r = gp("free-held", "--all", "--timeout", "0.5", env=env)
            finally:
                os.kill(server.pid, signal.SIGCONT)
            self.assertEqual((r.returncode, r.stdout), (FAILED, ""), r.stderr)
            outputs[("free-held", "--all", "stopped")] = r.stderr
        finally:
            server.close()
        self.assertIn(str(server.pid), outputs[("ps",)])
        self.assertIn(f"process {server.pid} (cl_workload): released ",
                      outputs[("free-held", "--all")])
        self.assertIn(f"no answer from process {server.pid}",
                      outputs[("free-held", "--all", "stopped")])
        self.assertIn("bins holding most", outputs[("stats",)])
        self.assertIn("still held at the end", outputs[("report", "--text", one)].lower())
        for args, out in outputs.items():
            self.assertTrue(out, args)
            wide = [ln for ln in out.splitlines() if len(ln) > 100]
            self.assertEqual(wide, [], args)

    def test_report_json(self):
        """report --json: the page's figures as one document; --diff --json
        adds the sites by change."""
        trace = self.write("t.trace", Flame.KNOWN)
        r = gp("report", "--json", trace)
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        doc = json.loads(r.stdout)
        self.assertEqual(doc["version"], 1)
        self.assertEqual((doc["pid"], doc["allocations"], doc["frees"]), (4, 4, 1))
        self.assertEqual(doc["files"], [trace])
        self.assertEqual(doc["peak"]["bytes"], 15000)
        self.assertEqual((doc["end"]["blocks"], doc["end"]["bytes"]), (3, 11000))
        self.assertEqual(doc["end"]["sites"][0]["label"], "py step (/src/train.py:10)")
        self.assertEqual([g["name"] for g in doc["groups"]], ["cuda:0"])
        # The same data as the page's.
        out = os.path.join(self.tmp, "r.html")
        self.assertEqual(gp("report", trace, "-o", out).returncode, OK)
        d, _ = page_data(out)
        self.assertEqual(d, doc)
        # -o and the gates as with --text.
        r = gp("report", "--json", trace, "-o", os.path.join(self.tmp, "r.json"), "--fail-on-leak")
        self.assertEqual(r.returncode, LEAKED)
        self.assertEqual(json.loads(read_text(os.path.join(self.tmp, "r.json"))), doc)
        base, new = self.diff_traces()
        r = gp("report", "--diff", base, new, "--json")
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        doc = json.loads(r.stdout)
        self.assertEqual((doc["base"]["peak"]["bytes"], doc["now"]["peak"]["bytes"]),
                         (4 * MIB, 6 * MIB))
        self.assertEqual([(c["label"], c["change"], c["before"]["bytes"], c["after"]["bytes"])
                          for c in doc["peak"]],
                         [("py step (/src/train.py:12)", 2 * MIB, 4 * MIB, 6 * MIB)])
        self.assertEqual([(c["label"], c["change"]) for c in doc["end"]],
                         [("py helper (/src/train.py:20)", -2 * MIB),
                          ("py load (/src/train.py:40)", 512 * KIB)])

    def diff_traces(self):
        def trace(name, step_line, peak_mib, held):
            lines = [f"pyframe 0 {step_line} step /src/train.py", "pyframe 1 30 main /src/train.py",
                     "pyframe 2 20 helper /src/train.py", "pyframe 3 40 load /src/train.py",
                     "site 0 - 0,1", "site 1 - 2,1", "site 2 - 3,1", "arena 0 cuda cuda:0 dev 0",
                     f"a 10 1 0 a0 {peak_mib * MIB} {peak_mib * MIB} m 0",
                     f"f 20 1 0 a0 {peak_mib * MIB} {peak_mib * MIB}",
                     f"a 30 1 0 b0 {MIB} {MIB} m 0"]
            for k, (site, nbytes) in enumerate(held):
                lines.append(f"a {40 + k} 1 0 {k + 1:x}00 {nbytes} {nbytes} m {site}")
            return self.write(name, trace_text(7, 1, lines))
        # The program changed: step() moved (line 10 -> 12), asks for more;
        # helper() is gone, load() is new.
        base = trace("base.trace", 10, 4, [(1, 2 * MIB)])
        new = trace("new.trace", 12, 6, [(2, 512 * KIB)])
        return base, new

    def test_diff(self):
        base, new = self.diff_traces()
        r = gp("report", "--diff", base, new, "--text")
        self.assertEqual((r.returncode, r.stderr), (OK, ""))
        self.assertIn("  peak active             4.0 MiB       6.0 MiB  +2.0 MiB (+50%)\n", r.stdout)
        self.assertIn("  held at the end         3.0 MiB       1.5 MiB  -1.5 MiB (-50%)\n", r.stdout)
        # (All misses: managed is the blocks asked for.)
        self.assertIn("  cuda:0: active 4.0 MiB -> 6.0 MiB, managed 7.0 MiB -> 7.5 MiB\n", r.stdout)
        peak = r.stdout[r.stdout.index("At the peak"):r.stdout.index("Still held")]
        self.assertEqual(peak.splitlines()[1:], [
            "     +2.0 MiB     4.0 MiB -> 6.0 MiB     py step (/src/train.py:12)", ""])
        end = r.stdout[r.stdout.index("Still held"):]
        # step's 1 MiB at the end did not change: not listed.
        self.assertEqual(end.splitlines()[1:3], [
            "     -2.0 MiB     2.0 MiB -> 0 B         py helper (/src/train.py:20)  (gone)",
            "   +512.0 KiB         0 B -> 512.0 KiB   py load (/src/train.py:40)  (new)"])
        # The same run twice: no change.
        r = gp("report", "--diff", new, new, "--text")
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertEqual(r.stdout.count("  no change\n"), 2)
        # The page: the tables, and what grew as flame graphs.
        out = os.path.join(self.tmp, "diff.html")
        r = gp("report", "--diff", base, new, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        d, html = page_data(out)
        self.assertEqual(flame_paths(d["peak"]), {
            (): (2 * MIB, 0), ("py main (/src/train.py)",): (2 * MIB, 0),
            ("py main (/src/train.py)", "py step (/src/train.py)"): (2 * MIB, 0)})
        self.assertEqual(flame_paths(d["end"])[()], (512 * KIB, 1))
        self.assertRegex(html, r'<td class="up">\+2\.0 MiB</td><td>4\.0 MiB</td><td>6\.0 MiB</td>'
                               r'<td class="l"><details><summary>py step \(/src/train.py:12\)')
        self.assertRegex(html, r'<td class="down">-2\.0 MiB</td><td>2\.0 MiB</td><td>0 B</td>')
        page = chromium_dom(out)
        self.assertIn('data-status="ok"', page, page[-2000:])
        self.assertEqual(page.count('class="flame"'), 2)
        # A BASE that is not there: one error naming it.
        missing = os.path.join(self.tmp, "missing.trace")
        r = gp("report", "--diff", missing, new, "--text")
        self.assertEqual(r.returncode, FAILED)
        self.assertEqual(r.stderr, f"gpupool: report: cannot open {missing}: No such file or directory\n")


class Install(unittest.TestCase):
    def test_install_prefix(self):
        with tempfile.TemporaryDirectory() as prefix:
            r = subprocess.run(["cmake", "--install", BUILD_DIR, "--prefix", prefix],
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            launcher = os.path.join(prefix, "bin", "gpupool")
            self.assertTrue(os.access(launcher, os.X_OK))
            r = subprocess.run([launcher, "run", "--", "sh", "-c", "echo $LD_PRELOAD"],
                               env=clean_env(), capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            lib = r.stdout.strip().split(":")[-1]
            self.assertTrue(lib.startswith(os.path.realpath(prefix)), lib)
            self.assertTrue(lib.endswith("/libgpupool.so"), lib)


if __name__ == "__main__":
    unittest.main(verbosity=2)
