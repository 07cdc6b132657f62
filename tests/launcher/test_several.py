#!/usr/bin/env python3
"""`gpupool report` and `trace convert` on several processes' traces."""
import json
import os
import subprocess
import sys
import unittest

from launcher_util import (
    LAUNCHER, CL_WORKLOAD, REPORT_PROGRAM, TEST_PRELOAD, OK, FAILED, USAGE, clean_env, gp,
    read_text, Serving, InTmpDir, trace_text, head_and_tail, page_data, chromium_dom, MIB, KIB)


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
            # Untouched by the refused run: what the first had written is
            # still there, and the first alone writes on (its arena's line
            # can come after `before`: a TSan run saw it), no '# run' of
            # another.
            after = read_text(t)
            self.assertTrue(after.startswith(before), after)
            self.assertNotIn("# run", after[len(before):])
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
