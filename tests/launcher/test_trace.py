#!/usr/bin/env python3
"""`gpupool trace convert`: known numbers in both formats, errors, and
what it writes."""
import json
import os
import signal
import stat
import subprocess
import unittest

from launcher_util import (
    LAUNCHER, OK, FAILED, USAGE, LEAKED, clean_env, gp, killed_trace, read_text, InTmpDir,
    KNOWN_TRACE, trace_text)


class Trace(InTmpDir):
    """gpupool trace convert: a known trace's numbers in both formats; a bad
    trace gets one error naming its line and leaves no file; the trace of a
    program killed with SIGKILL still converts."""

    PREFIX = "gpupool-trace-"

    def test_perfetto_counters(self):
        src = self.write("known.trace", KNOWN_TRACE)
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
        src = self.write("known.trace", KNOWN_TRACE)
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
        src = self.write("lost.trace", KNOWN_TRACE + "a 6000 7 0 c000 500 512 m\n"
                                                    "a 7000 7 0 c000 600 1024 m\n")
        out = os.path.join(self.tmp, "lost.json")
        r = gp("trace", "convert", src, "--to", "perfetto", "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("1 records do not pair", r.stderr)
        with open(out) as f:
            doc = json.load(f)
        last = [e["args"] for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "memory cuda:0"][-1]
        # 900 of KNOWN_TRACE's a000 still active, and the second c000; not the first.
        self.assertEqual((last["active"], last["in_blocks"]), (900 + 600, 1024 + 1024))

    def test_bad_trace_one_error_no_output(self):
        cases = {
            "notrace": ("hello\n", 1),
            "badline": (KNOWN_TRACE + "a 6000 7 0 c000 12\n", 10),
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
        src = self.write("unpaired.trace", KNOWN_TRACE + "f 6000 7 0 dead 1 1\n")
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
        character device (/dev/null) is written as a stream, so a gate that
        throws the page away keeps its exit status; a read-only file, a
        block device, a FIFO, a symbolic link and a directory are refused
        with a message saying so, and left as they were ('-' is standard
        output)."""
        src = self.write("ok.trace", KNOWN_TRACE)
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
        # A copy of /dev/null made here (root, or CAP_MKNOD): written, the
        # exit status kept; a block device's node (loop0's numbers): refused
        # before it is opened.
        null, block = os.path.join(self.tmp, "null"), os.path.join(self.tmp, "loop")
        try:
            os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
            os.mknod(block, 0o666 | stat.S_IFBLK, os.makedev(7, 0))
        except OSError as e:
            print(f"device part skipped: {e}")
        else:
            for r in (conv(null), gp("report", src, "-o", null),
                      gp("report", "--text", src, "-o", null)):
                self.assertEqual((r.returncode, r.stderr), (OK, ""))
            leaks = self.write("leaks.trace", trace_text(4, 1, [
                "arena 0 opencl opencl:ctx1 opencl ctx 1 dev pthread flags 0x1",
                "a 10 1 0 100 4096 4096 m"]))
            r = gp("report", leaks, "-o", null, "--fail-on-leak")
            self.assertEqual(r.returncode, LEAKED, r.stderr)
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
        src = self.write("ok.trace", KNOWN_TRACE)
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
        src = self.write("ok.trace", KNOWN_TRACE)
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
        trace = killed_trace(self.tmp)
        out = os.path.join(self.tmp, "killed.csv")
        r = gp("trace", "convert", trace, "--to", "rmm", "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        self.assertIn("last line is incomplete", r.stderr)
        with open(out) as f:
            rows = f.read().splitlines()
        self.assertGreater(len(rows), 1000)
        self.assertTrue(all(row.count(",") == 5 for row in rows))


if __name__ == "__main__":
    unittest.main(verbosity=2)
