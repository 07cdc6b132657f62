#!/usr/bin/env python3
"""The documentation says what is there.

usage: check_docs.py SOURCE_DIR CHECK [LAUNCHER]

  links       every relative markdown link in the tree's .md files names a
              file that exists, and its #anchor a heading of that file
  references  every docs/*.md, README.md or README (the top one) named in
              sources, scripts and pages exists, and a section named with
              it ('docs/trace.md, "Report"', 'README, "Use"')
              is a heading there
  run_help    docs/configuration.md's copy of `gpupool help run` is the
              launcher's own

Each failure names the file, the line and what is missing; exit 1 if any.
"""
import os
import re
import subprocess
import sys

SOURCE, CHECK = sys.argv[1], sys.argv[2]
LAUNCHER = sys.argv[3] if len(sys.argv) > 3 else None
# Not the project's own text: build outputs, fetched suites, environments.
SKIP_DIRS = {".git", ".peers", "node_modules", "__pycache__"}
TEXT_EXT = {".md", ".cpp", ".hpp", ".c", ".h", ".cu", ".py", ".sh", ".txt", ".cmake", ".def",
            ".toml", ".S", ".map", ".json", ".in"}
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, file=sys.stderr)


def tree_files():
    """The tree's files: in a git checkout those git tracks or would (not
    ignored), else every file outside hidden and build folders."""
    try:
        r = subprocess.run(["git", "-C", SOURCE, "ls-files", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0 and r.stdout.strip():
            return sorted({os.path.normpath(f) for f in r.stdout.splitlines()
                           if os.path.isfile(os.path.join(SOURCE, f))})
    except (OSError, subprocess.TimeoutExpired):
        pass
    out = []
    for root, dirs, files in os.walk(SOURCE):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith((".", "build")))
        out += [os.path.normpath(os.path.relpath(os.path.join(root, f), SOURCE)) for f in sorted(files)]
    return out


def read(rel):
    with open(os.path.join(SOURCE, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def anchor(heading):
    """GitHub's anchor for a heading: lower case, code marks and
    punctuation dropped, spaces to hyphens."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(rel):
    """The headings of a markdown file (outside code blocks)."""
    out, fenced = [], False
    for line in read(rel).splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            out.append(line.lstrip("#").strip())
    return out


def check_links():
    link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
    for rel in tree_files():
        if not rel.endswith(".md"):
            continue
        fenced = False
        for n, line in enumerate(read(rel).splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for target in link.findall(line):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                path, _, frag = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
                if not os.path.exists(os.path.join(SOURCE, dest)):
                    fail(f"{rel}:{n}: link to {target}: no {dest}")
                    continue
                if frag and dest.endswith(".md") and frag not in {anchor(h) for h in headings(dest)}:
                    fail(f"{rel}:{n}: link to {target}: {dest} has no heading '#{frag}'")


def check_references():
    # A path under docs/, optionally followed by a quoted section name.
    page = re.compile(r"(?<![\w/.-])(docs/[\w./-]*\w)(?:,? \(?\"([^\"]+)\")?")
    # The top README with a quoted section name: README, "Use" (another
    # folder's README is named with its folder, which the look-behind skips).
    readme = re.compile(r"(?<![\w/.-])README(?:\.md)?(?:,|:| \() ?\"([^\"]+)\"")
    top_headings = set(headings("README.md"))
    for rel in tree_files():
        if os.path.splitext(rel)[1] not in TEXT_EXT or rel.startswith("tests/bench/traces"):
            continue
        for n, line in enumerate(read(rel).splitlines(), 1):
            for path, section in page.findall(line):
                path = path.rstrip(".")
                if not os.path.exists(os.path.join(SOURCE, path)):
                    fail(f"{rel}:{n}: names {path}, which does not exist")
                elif section and path.endswith(".md") and section not in headings(path):
                    fail(f"{rel}:{n}: names \"{section}\" in {path}, which has no such heading")
            for section in readme.findall(line):
                if section not in top_headings:
                    fail(f"{rel}:{n}: names README's \"{section}\", which README.md has no longer")


def check_run_help():
    if not LAUNCHER:
        fail("run_help needs the launcher")
        return
    want = subprocess.run([LAUNCHER, "help", "run"], capture_output=True, text=True, timeout=60)
    if want.returncode != 0:
        fail(f"gpupool help run: exit {want.returncode}: {want.stderr}")
        return
    text = read("docs/configuration.md")
    m = re.search(r"<!-- run-help:begin -->\n```\n(.*?)```\n<!-- run-help:end -->", text, re.S)
    if not m:
        fail("docs/configuration.md has no <!-- run-help:begin --> ``` ... ``` <!-- run-help:end --> block")
        return
    if m.group(1) != want.stdout:
        fail("docs/configuration.md's copy of `gpupool help run` differs from the launcher's; "
             "paste the output of `gpupool help run` between its markers.\n"
             f"--- the page\n{m.group(1)}--- the launcher\n{want.stdout}")


CHECKS = {"links": check_links, "references": check_references, "run_help": check_run_help}
if CHECK not in CHECKS:
    print(f"unknown check {CHECK} (known: {', '.join(CHECKS)})", file=sys.stderr)
    sys.exit(2)
CHECKS[CHECK]()
sys.exit(1 if failures else 0)
