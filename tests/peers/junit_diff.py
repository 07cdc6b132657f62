#!/usr/bin/env python3
"""Compare two pytest --junitxml files test by test.

  junit_diff.py A.xml B.xml [--names "without gpupool" "with gpupool"]

Prints each file's counts (passed, failed, error, skipped, xfailed), then
every test whose outcome differs, with the first line of its message, and
every test that ran in only one of them. Exit status: 0 same outcome for
every test, 1 any difference, 2 a file missing or unreadable.

The outcome of a test id seen more than once (a failed call and an error in
teardown are two <testcase> elements) is its worst one; a <testcase> without
a name (pytest-xdist's test in flight when a run was interrupted) is none. Addresses in ids
(0x7f...: reprs of objects among the parameters) are masked, so that ids of
two processes match. Standard library only; tests/peers/pyopencl_suite.py
imports it.
"""
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")
WORST = {"skipped": 0, "xfailed": 1, "passed": 2, "failed": 3, "error": 4}
_ADDR = re.compile(r"0x[0-9a-fA-F]{6,}")


def _first_line(text, width=200):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= width else line[:width - 3] + "..."
    return ""


def load(path):
    """{test id: (outcome, message)} of one junit XML file (raises OSError, ET.ParseError)."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # a test in flight when the run was interrupted: it never finished
        tid = _ADDR.sub("0x?", f"{case.get('classname', '')}::{case.get('name', '')}")
        outcome, msg = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                outcome, msg = name, _first_line(el.get("message") or el.text)
                if name == "skipped" and "xfail" in (el.get("type") or ""):
                    outcome = "xfailed"
                break
        old = results.get(tid)
        if old is None or WORST[outcome] > WORST[old[0]]:
            results[tid] = (outcome, msg)
    return results


def counts(results):
    c = Counter(o for o, _ in results.values())
    return f"{len(results)} tests: " + ", ".join(f"{c[o]} {o}" for o in OUTCOMES)


def differences(a, b, names=("A", "B")):
    """Lines naming every test whose outcome differs or that ran in one file only."""
    lines = []
    both = sorted(set(a) & set(b))
    changed = [t for t in both if a[t][0] != b[t][0]]
    if changed:
        lines.append(f"DIFFERENT outcome for {len(changed)} of {len(both)} tests run both ways:")
        for t in changed:
            lines.append(f"  {t}: {a[t][0]} {names[0]}, {b[t][0]} {names[1]}")
            for name, (_, msg) in ((names[0], a[t]), (names[1], b[t])):
                if msg:
                    lines.append(f"      {name}: {msg}")
    for only, other, name in ((a, b, names[0]), (b, a, names[1])):
        missing = sorted(set(only) - set(other))
        if missing:
            lines.append(f"{len(missing)} tests ran only {name}:")
            lines += [f"  {t}: {only[t][0]}" for t in missing]
    return lines


def main(argv):
    args = list(argv)
    names = ("in A", "in B")
    if "--names" in args:
        i = args.index("--names")
        names = tuple(args[i + 1:i + 3])
        del args[i:i + 3]
    if len(args) != 2 or len(names) != 2:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    runs = []
    for path in args:
        try:
            runs.append(load(path))
        except (OSError, ET.ParseError) as e:
            print(f"junit_diff.py: {path}: {e}", file=sys.stderr)
            return 2
    for name, r in zip(names, runs):
        print(f"{name}: {counts(r)}")
    lines = differences(runs[0], runs[1], names)
    print("\n".join(lines) if lines else f"SAME outcome for all {len(runs[0])} tests")
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
