#!/usr/bin/env python3
"""The commands on running processes (`gpupool stats`, `free-held`,
`stop-holding`, `ps`), and each way a process can fail to answer."""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

from launcher_util import (
    gpupool_check, LAUNCHER, HARNESS, CL_WORKLOAD, SCHEMA, TEST_PRELOAD, OK, FAILED, NO_PROCESS,
    NOT_GPUPOOL, IDLE, DENIED, TIMEOUT, clean_env, gp, Serving)


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


if __name__ == "__main__":
    unittest.main(verbosity=2)
