"""What the launcher's tests share: the built programs' paths (from the
environment CMake sets), the launcher's exit codes, running it, a process
serving the control socket, a test with a temporary directory, and reading
traces and report pages.

The tests, one file per subcommand (each a unittest class per CTest group,
tests/launcher/CMakeLists.txt), run as: test_FILE.py [unittest args], with
LAUNCHER, HARNESS, CL_WORKLOAD (optional), SCHEMA, BUILD_DIR and
GPUPOOL_TEST_PRELOAD in the environment.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# gpupool_check: the tests that validate stats dumps take it from here.
import gpupool_check  # noqa: E402,F401
from harness import bare_env, sanitizer_runtime  # noqa: E402

LAUNCHER = os.environ["LAUNCHER"]
HARNESS = os.environ["HARNESS"]
CL_WORKLOAD = os.environ.get("CL_WORKLOAD", "")
REPORT_PROGRAM = os.environ.get("REPORT_PROGRAM", "")
# The build reads debug information (elfutils' libdw): frames name lines.
DWARF = os.environ.get("GPUPOOL_TEST_DWARF") == "1"
SCHEMA = json.load(open(os.environ["SCHEMA"]))
BUILD_DIR = os.environ["BUILD_DIR"]
TEST_PRELOAD = os.environ["GPUPOOL_TEST_PRELOAD"]
# Sanitizer runtimes that must stay first in LD_PRELOAD (sanitizer builds).
SANITIZER_PRELOAD = sanitizer_runtime(TEST_PRELOAD)

OK, FAILED, USAGE, NO_PROCESS, NOT_GPUPOOL, IDLE, DENIED, TIMEOUT, LEAKED, PEAK_GREW = range(10)


def clean_env(**extra):
    env = bare_env("LD_PRELOAD")
    if SANITIZER_PRELOAD:
        env["LD_PRELOAD"] = SANITIZER_PRELOAD
    env.update(extra)
    return env


def gp(*args, env=None, timeout=120, **kw):
    return subprocess.run([LAUNCHER, *args], env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout, **kw)


def read_text(path):
    with open(path) as f:
        return f.read()


def gp_with_rss(*args):
    """gp(), and the launcher's peak resident memory in bytes (its own
    getrusage, as wait4 gives it)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen([LAUNCHER, *args], env=clean_env(), stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (subprocess.CompletedProcess(p.args, p.returncode, out.read(), err.read()),
                usage.ru_maxrss * 1024)


class Serving:
    """A process serving the control socket until closed."""

    def __init__(self, argv, env, user=None):
        if user is not None:
            argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        self.p = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line.startswith("ready"):
            out, err = self.p.communicate(timeout=60)
            raise AssertionError(f"did not start: {line}{out}{err}")
        self.pid = int(line.split()[1])

    def close(self):
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGCONT)
            out, err = self.p.communicate(input="", timeout=120)
            return self.p.returncode, out, err
        return self.p.returncode, "", ""


class InTmpDir(unittest.TestCase):
    """A test with a temporary directory of its own (self.tmp), removed
    after it; write() puts a file there."""

    PREFIX = "gpupool-"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix=self.PREFIX)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path


def killed_trace(tmp):
    """The trace of a program killed with SIGKILL mid-run (at least 200 kB
    written), its last line cut short as a kill during a write leaves it."""
    trace = os.path.join(tmp, "killed.trace")
    p = subprocess.Popen([HARNESS, "workload", "100000000"], env=clean_env(GPUPOOL_TRACE_FILE=trace),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline and (not os.path.exists(trace) or
                                      os.path.getsize(trace) < 200000):
        time.sleep(0.05)
    p.kill()
    p.wait()
    with open(trace, "a") as f:
        f.write("a 99999999999 1 0 ab")
    return trace


def trace_text(pid, start_ns, lines, cmdline=None, version=2):
    """A trace file's text: the header, then `lines`."""
    head = [f"# gpupool trace {version}", f"# pid {pid} start_unix_ns {start_ns}"]
    if cmdline is not None:
        head.append(f"# cmdline {cmdline}")
    return "\n".join(head + lines) + "\n"


def head_and_tail(path):
    """A text file's lines."""
    with open(path) as f:
        return f.read().splitlines()


def page_data(html_path):
    """The data block of a report page, and the page's text."""
    with open(html_path) as f:
        text = f.read()
    tag = '<script type="application/json" id="data">'
    start = text.index(tag) + len(tag)
    return json.loads(text[start:text.index("</script>", start)]), text


def chromium():
    """Chromium's path. Missing, the test fails (CI installs it), or is
    skipped where SKIP_BROWSER_TESTS is set (the GPU machines,
    which cannot install it)."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("SKIP_BROWSER_TESTS"):
        raise unittest.SkipTest("no Chromium here (SKIP_BROWSER_TESTS is set)")
    raise AssertionError("chromium is needed (scripts/install-deps.sh installs it)")


def chromium_dom(page):
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=5000", "--dump-dom", "file://" + page],
                          capture_output=True, text=True, timeout=120).stdout


def flame_paths(flame):
    """A flame graph's nodes as {(frame, ...) from the root: (bytes, blocks)}."""
    nodes, names = flame["nodes"], flame["names"]
    paths = {}
    for i, (name, parent, nbytes, blocks) in enumerate(nodes):
        path = () if i == 0 else paths[parent][0] + (names[name],)
        paths[i] = (path, nbytes, blocks)
    return {p: (b, k) for p, b, k in paths.values()}


MIB = 1 << 20
KIB = 1 << 10

# Two threads' blocks in two arenas, device and pinned, whose numbers the
# Trace group knows (the Report group draws it too).
KNOWN_TRACE = ("# gpupool trace 1\n# pid 77 start_unix_ns 1000000000000000000\n"
               "arena 0 cuda cuda:0 cuda dev 0 ctx 0x1\n"
               "arena 1 cuda-host cuda-host pinned flags 0x3\n"
               # thread 8's records come after thread 7's, as the file has them
               "a 1000 7 0 a000 1000 1024 m\n"
               "f 3000 7 0 a000 1000 1024\n"
               "a 4000 7 0 a000 900 1024 h\n"
               "a 2000 8 1 b000 4096 4096 m\n"
               "f 5000 8 1 b000 4096 4096\n")

# Sites of known call stacks, native and Python, one of them freed: the
# Flame group's (the Text group reads it too).
KNOWN_STACKS = trace_text(4, 1, [
    "module 0 1000 2000 0 - /nonexistent/libcuda.so.1",
    "module 1 5000 9000 4000 - /nonexistent/libapp.so",
    "pyframe 0 10 step /src/train.py", "pyframe 1 30 main /src/train.py",
    # innermost first: the runtime, then the program's frames
    "site 0 1010,5020,5100,5200 -", "site 1 1010,5030,5100,5200 -",
    "site 2 1010,5020,5100,5300 -", "site 3 1010 0,1",
    "arena 0 cuda cuda:0 dev 0",
    "a 10 1 0 a0 1000 1024 m 0", "a 20 1 0 b0 2000 2048 m 1", "a 30 1 0 c0 4000 4096 m 2",
    "a 40 1 0 d0 8000 8192 m 3", "f 50 1 0 c0 4000 4096"])
