#!/usr/bin/env python3
"""`gpupool report --text`, its gates, `--json` and `--diff`."""
import json
import os
import re
import signal
import time
import unittest

from launcher_util import (
    CL_WORKLOAD, REPORT_PROGRAM, TEST_PRELOAD, OK, FAILED, USAGE, LEAKED, PEAK_GREW, clean_env, gp,
    read_text, Serving, InTmpDir, trace_text, page_data, chromium_dom, flame_paths, MIB, KIB,
    KNOWN_STACKS)


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
        trace = self.write("t.trace", KNOWN_STACKS)
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
        trace = self.write("t.trace", KNOWN_STACKS)
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
