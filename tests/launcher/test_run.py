#!/usr/bin/env python3
"""`gpupool` with bad arguments, help and `env`; `gpupool run` (exit
status, variables, the preloaded library, stats at exit); the installed
launcher."""
import json
import os
import signal
import subprocess
import tempfile
import unittest

from launcher_util import (
    gpupool_check, CL_WORKLOAD, SCHEMA, BUILD_DIR, TEST_PRELOAD, SANITIZER_PRELOAD, OK, USAGE,
    clean_env, gp)


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
