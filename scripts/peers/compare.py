#!/usr/bin/env python3
"""Compare the peers' test suites run without and with gpupool (issue 24).

  compare.py RESULTS... [--out DIR] [--page docs/peers.md]

RESULTS is run.sh's results folder:
  junit/SUITE--MODE.xml   pytest's --junitxml of each run (MODE: plain, gpupool)
  logs/SUITE--MODE.log    its output (pytest -v): read where an XML is missing
  meta/SUITE.info         key=value: library, version, tests, skip (jax_loop.info: the JAX loop's)
  meta/SUITE--MODE.rc     "rc seconds limit" of the run (rc 124: timed out)
  gpstats/TAG.jsonl       gpupool's stats at exit of every process of a run
  loops/jax.txt, loops/pycuda.txt   the RESULT lines of the timing loops

Prints, per suite, the counts of passed / failed / errors / skipped / xfailed
without and with gpupool and every test whose outcome differs (with the
first line of its failure message); then the loops' medians, per-round
ratios and checksums. Writes DIR/compat.md (DIR defaults to RESULTS): the
compatibility table, which --page also puts into docs/peers.md, keeping the
page's rows of suites and loops that none of the RESULTS ran (marked as
earlier runs). A run's selected tests are counted from its log ("7 workers
[514 items]"), so that tests that never finished show.
Standard library only. Exits 0 whether or not the runs differ: it reports,
people judge.
"""
import argparse
import glob
import json
import math
import os
import re
import statistics
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "peers"))
import junit_diff  # noqa: E402  (the tree's junit reader)

SUITE_ORDER = ["pycuda", "numba", "cupy", "torch", "jax", "pyopencl"]
NOT_SUITES = ("gpupool", "jax_loop", "versions", "machine")
MODES = ["plain", "gpupool"]
MODE_NAME = {"plain": "without gpupool", "gpupool": "with gpupool"}
OUTCOMES = ["passed", "failed", "error", "skipped", "xfailed"]
RANK = {"skipped": 0, "xfailed": 1, "passed": 2, "failed": 3, "error": 4}
RC_NOTE = {"0": "all passed", "1": "some failed", "2": "interrupted", "3": "internal error",
           "4": "usage error", "5": "no tests collected", "124": "TIMED OUT, partial",
           "137": "KILLED", "skip": "not started", "dry": "dry run"}


def first_line(text, limit=160):
    for line in (text or "").splitlines():
        line = line.strip()
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return ""


def put(results, tid, outcome, msg):
    tid = norm_id(tid)
    old = results.get(tid)
    if old is None or RANK[outcome] > RANK[old[0]]:
        results[tid] = (outcome, msg)


def parse_junit(path):
    """{test id: (outcome, message)} from pytest's junit XML: the one reader,
    tests/peers/junit_diff.py's, which CI's comparison on PoCL uses too."""
    return {norm_id(tid): v for tid, v in junit_diff.load(path).items()}


# test ids may hold spaces (PyOpenCL's "<context factory for <pyopencl.Device ...>>")
LOG_XDIST = re.compile(r"^\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+?)\s*$")
LOG_PLAIN = re.compile(r"^(\S+::.+?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?:\s+\[\s*\d+%\])?\s*$")
LOG_SUMMARY = re.compile(r"^(FAILED|ERROR) (.+?) - (.*)$")
# how many tests the run set out to run: "7 workers [514 items]" (xdist), or
# "collected 75 items / 5 deselected / 70 selected"
LOG_ITEMS = re.compile(r"^(?:\d+ workers? \[(\d+) items?\]|collected (\d+) items?(?: / \d+ deselected)?(?: / (\d+) selected)?)")
ADDRESS = re.compile(r"0x[0-9a-fA-F]{6,}")


def norm_id(tid):
    """A test id without the addresses some parametrize ids carry."""
    return ADDRESS.sub("0x?", tid.strip())
LOG_WORD = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
            "XFAIL": "xfailed", "XPASS": "passed"}


def parse_log(path):
    """The same from pytest -v output (runs killed before writing XML)."""
    results, msgs = {}, {}
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            m = LOG_XDIST.match(line)
            if m:
                put(results, m.group(2), LOG_WORD[m.group(1)], "")
                continue
            m = LOG_PLAIN.match(line)
            if m:
                put(results, m.group(1), LOG_WORD[m.group(2)], "")
                continue
            m = LOG_SUMMARY.match(line)
            if m:
                msgs[m.group(2)] = first_line(m.group(3))
    for tid, msg in msgs.items():
        tid = norm_id(tid)
        if tid in results:
            results[tid] = (results[tid][0], msg)
    return results


def selected_tests(path):
    """The number of tests a run selected, from its pytest log (None if not said)."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = LOG_ITEMS.match(line)
                if m:
                    return int(m.group(1) or m.group(3) or m.group(2))
    except OSError:
        pass
    return None


def read_kv(path):
    out = {}
    try:
        with open(path, errors="replace") as f:
            for line in f:
                k, sep, v = line.rstrip("\n").partition("=")
                if sep:
                    out[k.strip()] = v.strip()
    except OSError:
        pass
    return out


def legacy_jax_loop(res):
    """Whether meta/jax.info is the JAX loop's (results of run.sh before the JAX suite)."""
    return (not os.path.exists(os.path.join(res, "meta", "jax_loop.info"))
            and read_kv(os.path.join(res, "meta", "jax.info")).get("tests", "").startswith("scripts/peers/jax_loop.py"))


def read_rc(res, tag):
    try:
        with open(os.path.join(res, "meta", tag + ".rc")) as f:
            parts = f.read().split()
        return {"rc": parts[0], "seconds": parts[1] if len(parts) > 1 else "?",
                "limit": parts[2] if len(parts) > 2 else "?"}
    except (OSError, IndexError):
        return None


def gp_stats(res, tag):
    """Sums of gpupool's exit stats over the processes of one run."""
    path = os.path.join(res, "gpstats", tag + ".jsonl")
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return None
    dec = json.JSONDecoder()
    procs = used = 0
    tot = Counter()
    i = 0
    while True:
        j = text.find("{", i)
        if j < 0:
            break
        try:
            obj, i = dec.raw_decode(text, j)
        except ValueError:
            i = j + 1
            continue
        if not isinstance(obj, dict) or "totals" not in obj:
            continue
        procs += 1
        t = obj["totals"]
        if t.get("hits", 0) + t.get("misses", 0) > 0:
            used += 1
        for k in ("hits", "misses", "backend_allocs", "backend_frees", "oom_retries", "fence_waits"):
            tot[k] += int(t.get(k, 0))
    return {"processes": procs, "allocating": used, **tot}


def gp_text(st):
    if st is None:
        return "gpupool stats: none written (library not loaded, or no process reached its exit)"
    n = st["hits"] + st["misses"]
    rate = f" ({100.0 * st['hits'] / n:.1f}% from the pool)" if n else ""
    return (f"gpupool stats: {st['processes']} processes at exit, {st['allocating']} of them allocated "
            f"through gpupool: {st['hits']} hits, {st['misses']} misses{rate}, "
            f"{st['backend_allocs']} driver allocations, {st['oom_retries']} OOM retries")


def counts_text(results):
    c = Counter(o for o, _ in results.values())
    return f"{len(results)} tests: " + ", ".join(f"{c[o]} {o}" for o in OUTCOMES if c[o] or o in ("passed", "failed"))


def pass_rate(results):
    """Percent passed of the tests that ran (neither skipped nor xfailed), or None;
    rounded down to a tenth, so that 94.97 does not read as 95.0."""
    c = Counter(o for o, _ in results.values())
    ran = c["passed"] + c["failed"] + c["error"]
    return math.floor(1000.0 * c["passed"] / ran) / 10 if ran else None


def counts_cell(results):
    c = Counter(o for o, _ in results.values())
    parts = [f"{c[o]} {o}" for o in OUTCOMES if c[o]]
    rate = pass_rate(results)
    return (", ".join(parts) + (f" ({rate:.1f}% of those run passed)" if rate is not None else "")
            if parts else "no tests")


def junit_times(path):
    """{test id: seconds} from a junit XML (empty if unreadable)."""
    times = Counter()
    try:
        for case in ET.parse(path).getroot().iter("testcase"):
            tid = norm_id(f"{case.get('classname', '')}::{case.get('name', '')}")
            times[tid] += float(case.get("time") or 0)
    except (ET.ParseError, OSError, ValueError):
        pass
    return times


class Suite:
    def __init__(self, res, name):
        self.name = name
        self.info = read_kv(os.path.join(res, "meta", name + ".info"))
        self.runs = {}      # mode -> {id: (outcome, msg)}
        self.source = {}    # mode -> "junit" | "log"
        self.rc = {m: read_rc(res, f"{name}--{m}") for m in MODES}
        self.selected = {m: selected_tests(os.path.join(res, "logs", f"{name}--{m}.log")) for m in MODES}
        self.stats = gp_stats(res, f"{name}--gpupool")
        xml = {m: os.path.join(res, "junit", f"{name}--{m}.xml") for m in MODES}
        log = {m: os.path.join(res, "logs", f"{name}--{m}.log") for m in MODES}
        have_xml = {m: os.path.isfile(xml[m]) and os.path.getsize(xml[m]) > 0 for m in MODES}
        # one source for both runs, so that their test ids match
        use_xml = all(have_xml[m] for m in MODES if os.path.exists(xml[m]) or os.path.exists(log[m]))
        self.times = {m: junit_times(xml[m]) for m in MODES if use_xml and have_xml[m]}
        for m in MODES:
            try:
                if use_xml and have_xml[m]:
                    self.runs[m], self.source[m] = parse_junit(xml[m]), "junit"
                elif os.path.isfile(log[m]):
                    self.runs[m], self.source[m] = parse_log(log[m]), "log"
            except (ET.ParseError, OSError) as e:
                self.source[m] = f"unreadable ({e})"
                if os.path.isfile(log[m]):
                    self.runs[m], self.source[m] = parse_log(log[m]), "log (XML unreadable)"

    def diff(self):
        a, b = self.runs.get("plain"), self.runs.get("gpupool")
        if a is None or b is None:
            return None
        both = sorted(set(a) & set(b))
        changed = [(t, a[t], b[t]) for t in both if a[t][0] != b[t][0]]
        return {"both": len(both), "changed": changed,
                "only_plain": sorted(set(a) - set(b)), "only_gpupool": sorted(set(b) - set(a))}

    def unfinished(self, m):
        """How many of the run's selected tests never finished (0 if not known)."""
        sel = self.selected.get(m)
        return max(0, sel - len(self.runs.get(m, {}))) if sel else 0

    def rc_text(self, m):
        r = self.rc.get(m)
        if not r:
            return "no run recorded"
        return f"rc {r['rc']} ({RC_NOTE.get(r['rc'], '?')}), {r['seconds']} s of {r['limit']} s"


def report_suite(s, out):
    lib = s.info.get("library", s.name)
    ver = s.info.get("version", "?")
    out.append(f"== {s.name}: {lib} {ver}")
    if s.info.get("tests"):
        out.append(f"   tests: {s.info['tests']}")
    if s.info.get("skip") and not s.runs:
        out.append(f"   SKIP: {s.info['skip']}")
        return
    for m in MODES:
        if m in s.runs:
            out.append(f"   {MODE_NAME[m]:16s} {counts_text(s.runs[m])}  [{s.rc_text(m)}; from {s.source[m]}]")
            if s.unfinished(m):
                out.append(f"   {'':16s} {s.unfinished(m)} of its {s.selected[m]} selected tests never finished")
        else:
            out.append(f"   {MODE_NAME[m]:16s} not run")
    rate = pass_rate(s.runs["plain"]) if "plain" in s.runs else None
    if rate is not None:
        out.append(f"   without gpupool, {rate:.1f}% of the tests that ran passed"
                   + ("" if rate >= 95.0 else " (BELOW 95%: the suite's own failures dominate)"))
    t = s.times.get("plain")
    if t:
        slow = ", ".join(f"{first_line(tid.rsplit('::', 1)[-1], 60)} {sec:.0f}s" for tid, sec in t.most_common(5))
        out.append(f"   test time without gpupool: {sum(t.values()):.0f} s in all; slowest: {slow}")
    if "gpupool" in s.runs:
        out.append("   " + gp_text(s.stats))
    d = s.diff()
    if d is None:
        out.append("   no comparison (one of the runs is missing)")
        return
    if not d["changed"]:
        out.append(f"   SAME outcome for all {d['both']} tests run both ways")
    else:
        out.append(f"   DIFFERENT outcome for {len(d['changed'])} of {d['both']} tests run both ways:")
        for tid, (oa, ma), (ob, mb) in d["changed"]:
            out.append(f"     {tid}: {oa} -> {ob}")
            if ma:
                out.append(f"         without: {ma}")
            if mb:
                out.append(f"         with:    {mb}")
    for key, label in (("only_plain", "only without gpupool"), ("only_gpupool", "only with gpupool")):
        if d[key]:
            ex = ", ".join(d[key][:5]) + (" ..." if len(d[key]) > 5 else "")
            out.append(f"   {len(d[key])} tests ran {label} (a run cut short?): {ex}")


def read_loop(path):
    rows = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if not line.startswith("RESULT"):
                    continue
                kv = dict(tok.split("=", 1) for tok in line.split()[2:] if "=" in tok)
                rows.append(kv)
    except OSError:
        pass
    return rows


def ratio_text(vals):
    if not vals:
        return "n/a"
    return f"median {statistics.median(vals):.3f} (min {min(vals):.3f}, max {max(vals):.3f}, {len(vals)} rounds)"


def loop_summary(rows, metric, modes, ratios, unit):
    """medians per mode, per-round ratios, identity of results."""
    by_mode = defaultdict(list)
    by_round = defaultdict(dict)
    ident = defaultdict(set)
    loaded = defaultdict(set)
    for r in rows:
        try:
            v = float(r[metric])
        except (KeyError, ValueError):
            continue
        m = r.get("mode", "?")
        by_mode[m].append(v)
        by_round[r.get("round", "?")][m] = v
        ident[m].add(tuple(r.get(k, "") for k in ("checksum", "loss_bits", "sum")))
        loaded[m].add(r.get("gpupool_loaded", "?"))
    lines, cells = [], {}
    for m in modes:
        if by_mode[m]:
            med = statistics.median(by_mode[m])
            cells[m] = med
            lines.append(f"   {m:18s} median {med:.4g} {unit} over {len(by_mode[m])} runs "
                         f"(min {min(by_mode[m]):.4g}, max {max(by_mode[m]):.4g}); gpupool loaded: "
                         f"{','.join(sorted(loaded[m]))}")
        else:
            lines.append(f"   {m:18s} no run")
    rat = {}
    for num, den in ratios:
        vals = [rd[num] / rd[den] for rd in by_round.values() if num in rd and den in rd and rd[den] > 0]
        rat[(num, den)] = vals
        lines.append(f"   per-round {num}/{den}: {ratio_text(vals)}")
    all_ids = set().union(*ident.values()) if ident else set()
    if not all_ids:
        same = None
    else:
        same = len(all_ids) == 1
        if same:
            lines.append(f"   results IDENTICAL in every run ({'/'.join(x for x in next(iter(all_ids)) if x)})")
        else:
            lines.append("   results DIFFER between runs: "
                         + "; ".join(f"{m}: {sorted('/'.join(x for x in i if x) for i in ident[m])}"
                                     for m in modes if ident[m]))
    return lines, cells, rat, same


def earlier_rows(block, libraries, workloads):
    """The rows of a page's earlier tables that these calls did not replace:
    suite rows whose library is not among LIBRARIES, loop rows whose first
    word (PyCUDA, JAX) no loop of these calls has; marked, and a note that
    says where they came from (rows kept before keep their note's source)."""
    suites, loops, generated, kept_from, sources = [], [], "", "", []
    for line in block.splitlines():
        if line.startswith("Generated by ") and not generated:
            m = re.search(r"\((.*?)\): each suite", line)
            generated = m.group(1) if m else ""
        if line.startswith("\\* Kept from "):
            m = re.search(r"came from: (.*)\)\.$", line)
            kept_from = m.group(1) if m else ""
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or cells[0] in ("library", "workload") or set(cells[0]) <= set("-"):
            continue
        name = cells[0].rstrip(" *")
        row = "| " + " | ".join([name + " *"] + cells[1:]) + " |"
        if (len(cells) == 6 and name not in libraries) or (len(cells) == 4 and name.split()[0] not in workloads):
            (suites if len(cells) == 6 else loops).append(row)
            source = kept_from if cells[0].endswith(" *") else generated
            if source and source not in sources:
                sources.append(source)
    if not suites and not loops:
        return [], [], []
    return suites, loops, ["\\* Kept from the page's earlier tables: not run in the calls above"
                           + (f" (those tables came from: {'; '.join(sources)})" if sources else "") + "."]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+",
                    help="results folders of run.sh calls; each suite and loop is taken from the "
                         "last folder that has it (the suites do not all fit one call)")
    ap.add_argument("--out", help="where compat.md goes (default: the last RESULTS)")
    ap.add_argument("--page", help="also put the table into this file (docs/peers.md), between "
                    "the lines <!-- peers:begin --> and <!-- peers:end -->")
    a = ap.parse_args()
    for res in a.results:
        if not os.path.isdir(res):
            print(f"compare.py: {res} is not a folder", file=sys.stderr)
            return 2
    res = a.results[-1]
    outdir = a.out or res

    where = {}  # suite -> the last results folder that ran it
    for r in a.results:
        for p in glob.glob(os.path.join(r, "meta", "*.info")) + glob.glob(os.path.join(r, "junit", "*.xml")):
            base = os.path.basename(p).rsplit(".", 1)[0].split("--")[0]
            if base not in NOT_SUITES and not (base == "jax" and legacy_jax_loop(r)):
                where[base] = r
    names = set(where)
    order = [n for n in SUITE_ORDER if n in names] + sorted(names - set(SUITE_ORDER))
    suites = [Suite(where[n], n) for n in order]

    def last_with(rel):
        found = [r for r in a.results if os.path.exists(os.path.join(r, rel))
                 and os.path.getsize(os.path.join(r, rel)) > 0]
        return found[-1] if found else res

    out = []
    gp = read_kv(os.path.join(res, "meta", "gpupool.info"))
    machines = []
    for r in a.results:
        try:
            with open(os.path.join(r, "meta", "machine.txt")) as f:
                machines.append(f.read().strip())
        except OSError:
            pass
    # "GPU, driver, memory; cores; date UTC" per call: the machine once, then every call's time
    heads = list(dict.fromkeys(m.rsplit("; ", 1)[0] for m in machines))
    times = [m.rsplit("; ", 1)[-1] for m in machines if "; " in m]
    machine = "; ".join(heads) + (f"; {', '.join(times)}" if times else "")
    if machine:
        out.append(f"machine: {machine}")
    if gp:
        out.append(f"gpupool library: {gp.get('lib', '?')} ({'loaded' if gp.get('ok') == '1' else 'NOT LOADABLE: with-gpupool runs skipped'})")
    out.append("")
    for s in suites:
        report_suite(s, out)
        out.append("")

    jax_res = last_with(os.path.join("loops", "jax.txt"))
    pc_res = last_with(os.path.join("loops", "pycuda.txt"))
    jax_rows = read_loop(os.path.join(jax_res, "loops", "jax.txt"))
    pc_rows = read_loop(os.path.join(pc_res, "loops", "pycuda.txt"))
    legacy = legacy_jax_loop(jax_res)
    jax_info = read_kv(os.path.join(jax_res, "meta", "jax.info" if legacy else "jax_loop.info"))
    loops_md = []
    out.append("== PyCUDA gpuarray loop (issue 24 part 5): a = (a*b + c)*2.0 - a, 2**20 float32, 4 temporaries a step")
    if pc_rows:
        lines, cells, rat, same = loop_summary(
            pc_rows, "median_step_ms", ["nopool", "gpupool", "gpupool-immediate", "dmpool"],
            [("gpupool", "dmpool"), ("gpupool-immediate", "dmpool"), ("gpupool", "nopool"),
             ("dmpool", "nopool")], "ms/step")
        out += lines
        out.append("   " + gp_text(gp_stats(pc_res, "pycuda_loop")))
        gd = rat.get(("gpupool", "dmpool"), [])
        loops_md.append(
            f"| PyCUDA gpuarray loop, 4 temporaries a step (2^20 float32) | "
            + " / ".join(f"{cells[m]:.3f}" if m in cells else "-" for m in ("nopool", "gpupool", "dmpool"))
            + " ms a step (no pool / gpupool / DeviceMemoryPool) | gpupool / DeviceMemoryPool per round: "
            + ratio_text(gd) + f" | {'yes' if same else 'NO' if same is False else '?'} |")
    else:
        out.append("   no results (PyCUDA not built, or the loop was not run)")
    out.append("")
    out.append("== JAX jit training loop (issue 24 part 3): platform allocator without / with gpupool, and XLA's BFC")
    if jax_rows:
        lines, cells, rat, same = loop_summary(
            jax_rows, "median_step_us", ["platform", "platform-gpupool", "bfc"],
            [("platform-gpupool", "platform"), ("platform-gpupool", "bfc"), ("platform", "bfc")], "us/step")
        out += lines
        out.append("   " + gp_text(gp_stats(jax_res, "jax" if legacy else "jax_loop")))
        loops_md.append(
            f"| JAX {jax_info.get('version', '')} jit MLP training step | "
            + " / ".join(f"{cells[m]:.1f}" if m in cells else "-" for m in ("platform", "platform-gpupool", "bfc"))
            + " us a step (platform / platform + gpupool / BFC) | platform+gpupool / platform per round: "
            + ratio_text(rat.get(("platform-gpupool", "platform"), []))
            + "; platform+gpupool / BFC: " + ratio_text(rat.get(("platform-gpupool", "bfc"), []))
            + f" | {'yes' if same else 'NO' if same is False else '?'} |")
    else:
        why = jax_info.get("skip", "not run")
        out.append(f"   no results ({why})")
    text = "\n".join(out)
    print(text)

    runs = f"{len(machines)} `scripts/peers/run.sh` calls" if len(machines) > 1 else "one `scripts/peers/run.sh` call"
    md = ["Generated by `scripts/peers/compare.py` from " + runs
          + (f" ({machine})" if machine else "") + ": each suite run twice in the same call, "
          "without gpupool and under `LD_PRELOAD=libgpupool.so`.", "",
          "| library | version | tests | without gpupool | with gpupool | same outcomes |",
          "|---|---|---|---|---|---|"]
    for s in suites:
        lib = s.info.get("library", s.name)
        ver = s.info.get("version", "?").replace("|", "/")
        tests = s.info.get("tests", "").replace("|", "/")
        if s.info.get("skip") and not s.runs:
            md.append(f"| {lib} | {ver} | {tests} | SKIP: {s.info['skip'].replace('|', '/')} | | |")
            continue
        cell = {}
        for m in MODES:
            if m in s.runs:
                r = s.rc.get(m) or {}
                cut = " (timed out: partial)" if r.get("rc") in ("124", "137") else ""
                if s.unfinished(m):
                    cut = (f" ({'timed out: ' if cut else ''}{s.selected[m] - s.unfinished(m)} "
                           f"of {s.selected[m]} finished)")
                cell[m] = counts_cell(s.runs[m]) + cut
            else:
                cell[m] = "not run"
        d = s.diff()
        if d is None:
            same = "-"
        elif not d["changed"]:
            same = f"yes ({d['both']} tests)"
        else:
            same = f"**no: {len(d['changed'])} of {d['both']} differ**"
        md.append(f"| {lib} | {ver} | {tests} | {cell['plain']} | {cell['gpupool']} | {same} |")
    table_end = len(md)
    loops_head = ["", "| workload | time | ratio | identical results |", "|---|---|---|---|"]
    if loops_md:
        md += loops_head + loops_md
    loops_end = len(md)
    full = [(s, s.info["tests_full"]) for s in suites if s.info.get("tests_full")]
    if full:
        md += ["", "Test selections: " + "; ".join(f"{s.info.get('library', s.name)}: {t}" for s, t in full) + "."]
    changed = [(s, d) for s in suites for d in [s.diff()] if d and d["changed"]]
    if changed:
        md += ["", "## Tests whose outcome differs", ""]
        for s, d in changed:
            for tid, (oa, ma), (ob, mb) in d["changed"]:
                msg = mb or ma
                md.append(f"- {s.name}: `{tid}`: {oa} without, {ob} with gpupool" + (f": {msg}" if msg else ""))
    md.append("")
    try:
        os.makedirs(outdir, exist_ok=True)
        with open(os.path.join(outdir, "compat.md"), "w") as f:
            f.write("\n".join(["# The peers' own test suites, without and with gpupool", ""] + md))
    except OSError as e:
        print(f"compare.py: cannot write compat.md: {e}", file=sys.stderr)
    if a.page:
        begin, end = "<!-- peers:begin -->", "<!-- peers:end -->"
        with open(a.page) as f:
            text = f.read()
        i, j = text.find(begin), text.find(end)
        if i < 0 or j < i:
            print(f"compare.py: {a.page} has no {begin} ... {end} block", file=sys.stderr)
            return 2
        kept, kept_loops, note = earlier_rows(text[i + len(begin):j], {s.info.get("library", s.name) for s in suites},
                                              {row.strip("| ").split()[0] for row in loops_md})
        loops = md[table_end:loops_end] + kept_loops if loops_md else (loops_head + kept_loops if kept_loops else [])
        page = md[:table_end] + kept + loops + ([""] + note if note else []) + md[loops_end:]
        with open(a.page, "w") as f:
            f.write(text[: i + len(begin)] + "\n" + "\n".join(page) + text[j:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
