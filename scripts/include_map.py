#!/usr/bin/env python3
"""The include map of gpupool's rooms, from the sources' #include lines.

A room is a top-level folder (core, config, wire, observe, launcher) or a room of
interpose/ (interpose/cuda, interpose/opencl, interpose/control,
interpose/node; the files directly in interpose/ are the room "interpose",
the runtime they share). An edge A -> B: a file of A includes a header of B.

    scripts/include_map.py            the map, one line per room, and the cycles
    scripts/include_map.py --dot      the map in Graphviz's language
    scripts/include_map.py --check    exit 1 on a cycle between rooms, or on a
                                      launcher/ file that includes interpose/
                                      (docs/layout.md's walls); the check in
                                      scripts/test.sh
Quoted includes only ("room/file.hpp", as the tree writes them); a quoted
include that names no file of the tree (a system header) is ignored.
"""
import os
import re
import sys
from collections import defaultdict

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TOP = ["core", "config", "sys", "wire", "observe", "interpose", "launcher"]
SOURCES = (".cpp", ".hpp", ".h", ".c", ".def", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def room_of(path):
    """The room of a path relative to ROOT, or None outside the rooms."""
    parts = path.split("/")
    if parts[0] not in TOP:
        return None
    if parts[0] == "interpose" and len(parts) > 2:
        return "interpose/" + parts[1]
    return parts[0]


def scan():
    """{room: {room it includes: [(file, include), ...]}}"""
    edges = defaultdict(lambda: defaultdict(list))
    rooms = set()
    for top in TOP:
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if not f.endswith(SOURCES):
                    continue
                path = os.path.relpath(os.path.join(d, f), ROOT)
                src = room_of(path)
                rooms.add(src)
                with open(os.path.join(ROOT, path), errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE.findall(text):
                    # As the compiler finds it: from the tree's root (the
                    # include path), else beside the including file.
                    target = None
                    for cand in (inc, os.path.join(os.path.dirname(path), inc)):
                        cand = os.path.normpath(cand)
                        if os.path.isfile(os.path.join(ROOT, cand)):
                            target = cand
                            break
                    dst = room_of(target) if target else None
                    if dst and dst != src:
                        edges[src][dst].append((path, inc))
    return sorted(rooms), edges


def cycles(rooms, edges):
    """Every strongly connected set of more than one room (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, {})):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in rooms:
        if v not in index:
            visit(v)
    return out


def main(argv):
    rooms, edges = scan()
    found = cycles(rooms, edges)
    walls = [(f, inc) for dst, uses in edges.get("launcher", {}).items()
             if dst.startswith("interpose") for f, inc in uses]
    if "--dot" in argv:
        print("digraph rooms {")
        for src in rooms:
            for dst, uses in sorted(edges.get(src, {}).items()):
                print(f'  "{src}" -> "{dst}" [label="{len(uses)}"];')
        print("}")
        return 0
    if "--check" not in argv:
        for src in rooms:
            out = edges.get(src, {})
            print(f"{src:18} -> " + (", ".join(f"{d} ({len(u)})" for d, u in sorted(out.items()))
                                     or "(nothing)"))
    for comp in found:
        print("cycle between rooms: " + " <-> ".join(comp))
        for a in comp:
            for b in comp:
                for f, inc in edges.get(a, {}).get(b, [])[:3]:
                    print(f"  {a} -> {b}: {f} includes \"{inc}\"")
    for f, inc in walls:
        print(f"launcher includes interpose/: {f} includes \"{inc}\"")
    if "--check" in argv:
        if not found and not walls:
            print(f"include map: {len(rooms)} rooms, no cycle, launcher/ includes nothing of interpose/")
        return 1 if found or walls else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
