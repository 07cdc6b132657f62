#!/usr/bin/env python3
"""The report's flame graphs."""
import os
import re
import unittest

from launcher_util import (
    REPORT_PROGRAM, OK, gp, InTmpDir, trace_text, page_data, chromium_dom, flame_paths, MIB,
    KNOWN_STACKS)


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

    def test_known_stacks(self):
        out = self.report(KNOWN_STACKS)
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


if __name__ == "__main__":
    unittest.main(verbosity=2)
