#!/usr/bin/env python3
"""docs/globals.md names every process global of gpupool's product sources,
and names nothing else.

    check_globals.py ROOT             compare the sources with the list
    check_globals.py ROOT --self-test the scanner on a sample whose globals are known

A process global here is what a hook can reach without the runtime:
  - a NoDestructor anywhere (core/no_destructor.hpp);
  - a variable at namespace scope, or a static data member, that is not
    const or constexpr;
  - a function-local static that is not const or constexpr;
  - whatever of those is made with `new`, or is thread_local, const or not.
Each is named in the list as `name` (namespace scope), `Class::name` (a
static member) or `function::name` (a function-local static), with its file.

The scanner reads C++ without compiling it: comments, strings and
preprocessor lines are dropped, braces tell namespace, class, function and
initialiser apart, and a declaration is split at its first `=`, `(`, `[` or
`{`. It does not see a variable initialised with parentheses at namespace
scope (`T x(1);`, which reads as a function); write braces.
"""
import os
import re
import sys

ROOMS = ("interpose", "sys", "core", "config", "observe", "wire")
LIST = "docs/globals.md"
HELPER = "core/no_destructor.hpp"
STORAGE = {"static", "thread_local", "GPUPOOL_HOT_TLS", "constinit", "inline"}
NOT_DECL = re.compile(
    r"^(using|typedef|template|namespace|static_assert|friend|extern|return|enum|struct|class|"
    r"union|concept|case|default|goto|break|continue|delete|throw|co_return|public|private|"
    r"protected)\b")


def strip(src):
    """Comments, string and character literals blanked (newlines kept),
    then preprocessor lines with their continuations."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == 'R' and src.startswith('R"', i) and (i == 0 or not src[i - 1].isalnum()):
            m = re.match(r'R"([^(]*)\(', src[i:])
            end = src.find(")" + m.group(1) + '"', i) + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", src[i + 2:end - 1]))
            i = end
        elif c in "\"'" and not (c == "'" and i > 0 and src[i - 1].isalnum()):
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            out.append(c + re.sub(r"[^\n]", " ", src[i + 1:j]) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    lines, cont = [], False
    for line in "".join(out).split("\n"):
        pre = cont or line.lstrip().startswith("#")
        cont = pre and line.rstrip().endswith("\\")
        lines.append(" " * len(line) if pre else line)
    return "\n".join(lines)


def depth0(text, stops):
    """Index of the first character of `stops` outside (), [], {} and <>; -1 if none."""
    d = 0
    for i, c in enumerate(text):
        if c in "([{<":
            if d == 0 and c in stops:
                return i
            d += 1
        elif c in ")]}>":
            d -= 1
        elif d == 0 and c in stops:
            return i
    return -1


def drop_attributes(h):
    """[[...]], alignas(...) and __attribute__((...)) removed."""
    h = re.sub(r"\[\[.*?\]\]", " ", h)
    while True:
        m = re.search(r"\b(__attribute__|alignas)\s*\(", h)
        if not m:
            return h
        d, end = 0, len(h)
        for i in range(m.end() - 1, len(h)):
            d += {"(": 1, ")": -1}.get(h[i], 0)
            if d == 0:
                end = i + 1
                break
        h = h[:m.start()] + " " + h[end:]


def split_declarators(decl):
    """'T a{1}, *b = x' -> ['T a{1}', '*b = x']: commas outside brackets."""
    parts, d, last = [], 0, 0
    for i, c in enumerate(decl):
        if c in "([{<":
            d += 1
        elif c in ")]}>":
            d -= 1
        elif c == "," and d == 0:
            parts.append(decl[last:i])
            last = i + 1
    return parts + [decl[last:]]


def declared(head, block=False):
    """[(name, is_global)] for a declaration's text (one or more declarators);
    [] for what declares no variable. In a block, `(` starts an initialiser
    (a static is no function)."""
    h = re.sub(r"\boperator\s*(\(\)|\[\]|[^\s(]+)", "operator_", head.strip())
    h = drop_attributes(h).strip()
    if not h or NOT_DECL.match(h):
        return []
    first, *more = split_declarators(h)
    made_new = re.search(r"\bnew\b", h) is not None
    eq = depth0(first, "=")
    decl = first if eq < 0 else first[:eq]
    paren = depth0(decl, "(")
    if block and paren >= 0:
        decl, paren = decl[:paren], -1
    if paren >= 0:
        fptr = re.match(r"[^(]*\(\s*\*\s*(\w+)\s*\)", decl)
        if not fptr or fptr.end() - 1 < paren:
            return []  # a function
        name, before = fptr.group(1), decl[:decl.index("(")]
    else:
        cut = depth0(decl, "[{")
        decl = decl if cut < 0 else decl[:cut]
        m = re.search(r"([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)\s*$", decl)
        if not m or m.start() == 0:
            return []  # a lone word: a label or an expression
        name, before = m.group(1).split("::")[-1], decl[:m.start()]
    words = set(re.findall(r"\w+", before))
    if not words - STORAGE - {"const", "constexpr", "volatile", "mutable"}:
        return []  # no type: an expression statement
    thread = bool(words & {"thread_local", "GPUPOOL_HOT_TLS"})
    helper = "NoDestructor" in words
    top = re.sub(r"^\s*((static|inline|constinit|thread_local|GPUPOOL_HOT_TLS|mutable)\s+)*", "",
                 before)
    const = ("constexpr" in words or re.search(r"\bconst\s*$", before) is not None or
             (top.startswith("const") and not re.search(r"[*&]", top)) or
             re.search(r"&\s*$", before) is not None)
    glob = helper or made_new or thread or not const
    names = [name]
    for part in more:  # the others share the type (less their own * and &)
        m = re.match(r"\s*[*&\s]*(?:const\s+)?([A-Za-z_]\w*)", part)
        if m:
            names.append(m.group(1))
    return [(n, glob) for n in names]


def function_name(head):
    h = re.sub(r"\boperator\s*(\(\)|\[\]|[^\s(]+)", "operator_", head)
    h = re.sub(r"^\s*template\s*<.*?>", "", h.strip(), flags=re.S)
    for m in re.finditer(r"(~?[A-Za-z_]\w*(?:::~?[A-Za-z_]\w*)*)\s*\(", h):
        if m.group(1) not in ("__attribute__", "alignas", "decltype", "noexcept"):
            return m.group(1)
    return "lambda"


def scan(text):
    """The globals of one file's text: a list of (key, line, is_global)."""
    src = strip(text)
    found = []
    # Scopes: ("ns", name), ("class", name), ("fn", name), ("init", None).
    stack = [("ns", "")]
    start = 0

    def line_of(i):
        return src.count("\n", 0, i) + 1

    def record(head, at, kind):
        owner = [s[1] for s in stack if s[0] in ("class", "fn")]
        for name, glob in declared(head, block=kind == "fn"):
            if kind == "fn":
                key = owner[-1] + "::" + name
            elif kind == "class":
                key = "::".join(owner + [name])
            else:
                key = name
            found.append((key, line_of(at), glob))

    def consider(head, at):
        kind = stack[-1][0]
        words = re.findall(r"\w+", head)
        if kind == "fn":
            if (words and words[0] in STORAGE) or "NoDestructor" in words:
                record(head, at, kind)
        elif kind == "class":
            if "static" in words[:2]:
                record(head, at, kind)
        elif kind == "ns":
            record(head, at, kind)

    i = 0
    while i < len(src):
        c = src[i]
        if c == "{":
            head = src[start:i]
            kind = stack[-1][0]
            h = head.strip()
            if kind == "fn":
                consider(head, start)
                stack.append(("fn", stack[-1][1]))
            elif kind == "init":
                tail = h.rstrip()
                lam = tail.endswith(")") or tail.endswith("]") or tail.endswith("mutable")
                stack.append(("fn", "lambda") if lam else ("init", None))
            elif re.match(r'^(inline\s+)?namespace\b|^extern\s*"\s*"\s*$', h):
                stack.append(("ns", ""))
            elif re.match(r"^(template\s*<.*>\s*)?(class|struct|union|enum)\b", h, re.S) and \
                    depth0(h, "=") < 0:
                m = re.findall(r"\b(?:class|struct|union)\s+(?:\w+\s*\(.*?\)\s*)?(\w+)", h)
                stack.append(("class", m[-1] if m else ""))
            elif depth0(re.sub(r"\boperator\s*(\(\)|\[\]|[^\s(]+)", "operator_", h), "=") >= 0 or \
                    depth0(h, "(") < 0:
                stack.append(("init", None))
                i += 1
                continue  # the declaration goes on to its ';'
            else:
                owner = [s[1] for s in stack if s[0] == "class"]
                stack.append(("fn", "::".join(owner + [function_name(h)])))
            start = i + 1
        elif c == "}":
            kind = stack.pop()[0]
            if kind != "init":
                start = i + 1
        elif c == ";" and stack[-1][0] != "init":
            consider(src[start:i], start + len(src[start:i]) - len(src[start:i].lstrip()))
            start = i + 1
        i += 1
    return found


def product_sources(root):
    for room in ROOMS:
        for dirpath, _, files in os.walk(os.path.join(root, room)):
            for f in sorted(files):
                if f.endswith((".cpp", ".hpp", ".h", ".c")):
                    path = os.path.relpath(os.path.join(dirpath, f), root)
                    if path != HELPER:
                        yield path


def listed(root):
    """{(path, key)} named in the list's tables: | `key`, `key` | `path` | why |"""
    names = set()
    with open(os.path.join(root, LIST), encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and cells[1].startswith("`"):
                for key in re.findall(r"`([^`]+)`", cells[0]):
                    names.add((cells[1].strip("`"), key))
    return names


SAMPLE = r'''
namespace a {
std::atomic<bool> g_flag{false};                 // yes
constexpr int kConst = 3;                        // no: constexpr
const Table kTable = {1, [](int x) { return x; }};   // no: const
const char* g_text = "s{;}";                     // yes: the pointer changes
static char* const kFixed = nullptr;             // no
Files* g_files = new Files;                      // yes
thread_local int t_depth = 0;                    // yes
GPUPOOL_HOT_TLS Cache t_cache;                   // yes
void (*g_hook)(int) = nullptr;                   // yes
int function(int x);                             // no
std::vector<int> g_list;                         // yes
struct S {
  static std::atomic<int> count;                 // yes
  static constexpr int kMax = 4;                 // no
  int member = 0;                                // no
  int get() { static int calls = 0; return ++calls; }   // yes: S::get::calls
};
bool operator==(const S&, const S&) { static const int k = 1; return k; }  // no
Registry& registry() {
  static NoDestructor<Registry> r;               // yes
  static const NoDestructor<Table> t(make());    // yes: a NoDestructor
  static std::atomic<int> n{0};                  // yes
  static const int once = [] { static int inner; return 1; }();  // inner: yes
  int local = 0;                                 // no
  for (int i = 0; i < 3; ++i) { static bool seen; }   // yes
  return *r;
}
}  // namespace a
extern "C" {
__attribute__((visibility("hidden"))) void* g_real = nullptr;      // yes
__attribute__((visibility("hidden"))) void* resolve(void (*fn)(void*));  // no
}
extern "C" int hook(int x) noexcept { static std::atomic<int> calls; return x; }  // yes
std::atomic<bool> g_in{false}, g_out{false};    // yes, both
#define NOT_CODE(x) static int macro_var = x;
'''
SAMPLE_EXPECTED = {"g_flag", "g_text", "g_files", "t_depth", "t_cache", "g_hook", "g_list",
                   "S::count", "S::get::calls", "registry::r", "registry::t", "registry::n",
                   "registry::inner", "registry::seen",
                   "g_real", "hook::calls", "g_in", "g_out"}


def self_test():
    got = {k for k, _, g in scan(SAMPLE) if g}
    if got != SAMPLE_EXPECTED:
        print(f"FAIL: scanner found {sorted(got)}\n  expected {sorted(SAMPLE_EXPECTED)}\n"
              f"  missed {sorted(SAMPLE_EXPECTED - got)}, extra {sorted(got - SAMPLE_EXPECTED)}")
        return 1
    print(f"scanner: the sample's {len(got)} globals found, nothing else")
    return 0


def main():
    root = sys.argv[1]
    if sys.argv[2:] == ["--self-test"]:
        return self_test()
    want = listed(root)
    have = {}
    for path in product_sources(root):
        with open(os.path.join(root, path), encoding="utf-8") as f:
            for key, line, glob in scan(f.read()):
                if glob:
                    have.setdefault((path, key), line)
    bad = 0
    for (path, key), line in sorted(have.items()):
        if (path, key) not in want:
            print(f"FAIL: {path}:{line}: `{key}` is a process global that {LIST} does not list "
                  "(list it with its reason, or make it the runtime's)")
            bad += 1
    for path, key in sorted(want - set(have)):
        print(f"FAIL: {LIST} lists `{key}` in {path}, which has no such global")
        bad += 1
    if not bad:
        print(f"{LIST}: {len(have)} process globals, each listed; nothing else listed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
