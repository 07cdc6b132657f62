#!/usr/bin/env python3
"""`gpupool report`: the page of a known program and trace, its site
labels, the browser drawing it, errors, and large traces."""
import json
import os
import re
import subprocess
import sys
import time
import unittest

from launcher_util import (
    LAUNCHER, REPORT_PROGRAM, DWARF, SANITIZER_PRELOAD, OK, FAILED, USAGE, clean_env, gp,
    gp_with_rss, InTmpDir, killed_trace, trace_text, chromium, chromium_dom, MIB, KIB, KNOWN_TRACE)


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
        r, two = self.report(self.write("two.trace", KNOWN_TRACE), "two.html")
        self.assertEqual(r.returncode, OK, r.stderr)
        page = dom(two)
        self.assertIn('data-status="ok"', page, page[-2000:])
        self.assertEqual(page.count('class="plot"'), 5)
        r, empty = self.report(self.write("empty.trace", "\n".join(KNOWN_TRACE.splitlines()[:4])
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
        r = subprocess.run([script, self.write("two.trace", KNOWN_TRACE), png], env=env,
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
        trace = killed_trace(self.tmp)
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

    def test_groups_shown_first_keep_their_names(self):
        """Past the groups shown in detail, the rest are summed up; the shown
        ones keep their name and plot wherever they stand (before: a group
        already in its place was moved onto itself and came out with no
        name and no points, found by the issue 35 rerun)."""
        lines = []
        for i in range(15):
            size = (15 - i) * self.MIB  # the first ones are the largest
            lines.append(f"arena {i} opencl opencl:ctx{i} opencl ctx {i} dev pthread flags 0x1")
            lines.append(f"a {10 * i + 1} 1 {i} {0x100 + i:x} {size} {size} m")
            lines.append(f"f {10 * i + 5} 1 {i} {0x100 + i:x} {size} {size}")
        trace = self.write("fifteen.trace", trace_text(5, 1, lines))
        out = os.path.join(self.tmp, "r.html")
        r = gp("report", trace, "-o", out)
        self.assertEqual(r.returncode, OK, r.stderr)
        d, _ = self.data(out)
        shown = [g for g in d["groups"] if not g.get("others")]
        self.assertTrue(shown)
        for g in shown:
            self.assertRegex(g["name"], r"^opencl:ctx\d+$")
            self.assertTrue(g["t"], g["name"])
        self.assertEqual({g["name"] for g in shown},
                         {f"opencl:ctx{i}" for i in range(len(shown))})

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
