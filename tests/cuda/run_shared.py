#!/usr/bin/env python3
"""Several processes on one simulated GPU (the stand-in's STANDIN_SHARED).

Shows the stand-in behaves like one device shared by processes, with no
gpupool loaded: one budget for all of them, a killed process's memory given
back, NVML agreeing with cuMemGetInfo, one UUID per device for every process
on the file, NVML's per-process list, the memory contexts take
(STANDIN_CONTEXT_BYTES), pinned host memory shared like device memory
(STANDIN_HOST_CAPACITY). Each test uses a fresh shared file, so they run in
parallel.

usage: run_shared.py NEIGHBOUR PROBE TEST
(LD_LIBRARY_PATH must name the stand-in directory.)
"""
import os
import queue
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
CAPACITY = 64 * MIB
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY

NEIGHBOUR = PROBE = None


def fail(msg):
    print("FAIL: " + msg, flush=True)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


class Proc:
    """A neighbour process followed line by line (a reader thread, so a
    timeout never leaves a half-read line behind)."""

    def __init__(self, args, env, cwd=None):
        self.args = args
        self.p = subprocess.Popen(args, env=env, cwd=cwd, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout=20):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            fail("%s: no output in %ss" % (self.args, timeout))
        if line is None:
            fail("%s: ended early (status %s)" % (self.args, self.p.wait()))
        return line

    def expect(self, pattern, timeout=20):
        line = self.line(timeout)
        m = re.fullmatch(pattern, line)
        check(m, "%s: expected /%s/, got %r" % (self.args, pattern, line))
        return m

    def send(self, text):
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def finish(self):
        self.p.stdin.close()
        check(self.p.wait(timeout=20) == 0, "%s: exit status %s" % (self.args, self.p.returncode))


def environ(shared, context_bytes=0, host_capacity=0):
    env = dict(os.environ, STANDIN_CAPACITY=str(CAPACITY))
    for k in ("STANDIN_SHARED", "STANDIN_CONTEXT_BYTES", "STANDIN_HOST_CAPACITY",
              "STANDIN_DEVICES", "LD_PRELOAD"):
        env.pop(k, None)
    if shared:
        env["STANDIN_SHARED"] = shared
    if context_bytes:
        env["STANDIN_CONTEXT_BYTES"] = str(context_bytes)
    if host_capacity:
        env["STANDIN_HOST_CAPACITY"] = str(host_capacity)
    return env


def run(args, env, cwd=None):
    r = subprocess.run(args, env=env, cwd=cwd, stdout=subprocess.PIPE, text=True, timeout=60)
    check(r.returncode == 0, "%s: exit status %d\n%s" % (args, r.returncode, r.stdout))
    return r.stdout.splitlines()


def hold(env, mib, count=0, host=False):
    """A process holding `mib` MiB of 1 MiB blocks until told otherwise
    (pinned host memory with `host`)."""
    p = Proc([NEIGHBOUR, "hold", "1", str(count)] + (["host"] if host else []), env)
    p.expect("allocated %d" % count)
    p.expect("held")
    if mib:
        p.send("alloc %d" % mib)
        p.expect("allocated %d" % mib)
    return p


def free_bytes(env):
    (line,) = run([NEIGHBOUR, "info"], env)
    m = re.fullmatch(r"free (\d+) total (\d+)", line)
    check(m and int(m.group(2)) == CAPACITY, "info: %r" % line)
    return int(m.group(1))


def grab(env, block_mib=1, *extra):
    out = run([NEIGHBOUR, "grab", str(block_mib)] + [str(x) for x in extra], env)
    m = re.fullmatch(r"got (\d+) blocks (\d+) bytes err (\d+)", out[-1])
    check(m, "grab: last line %r" % out[-1])
    n = int(m.group(1))
    check(int(m.group(2)) == n * block_mib * MIB, "grab: bytes in %r" % out[-1])
    check(len(out) == n + 1, "grab: %d block lines for %d blocks" % (len(out) - 1, n))
    for i, line in enumerate(out[:-1]):
        check(re.fullmatch(r"block %d \d+" % i, line), "grab: line %r" % line)
    return n, int(m.group(3))


SLOT = 80  # sizeof(SbSlot): pid, pad, 8 devices + the host account


def slots_ever_used(path):
    """Slots of the shared file that some process has owned (its layout is
    SbFile in shared_budget.h: a 64-byte header, slots of SLOT bytes)."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version = struct.unpack_from("<II", data, 0)
    check(magic == 0x53424731 and version == 2, "shared file header %x %d" % (magic, version))
    return sum(1 for off in range(64, len(data) - SLOT + 1, SLOT)
               if struct.unpack_from("<i", data, off)[0])


# ---- the tests ---------------------------------------------------------------


def test_budget(tmp):
    """The second process's grab gets the capacity minus what the first holds."""
    env = environ(os.path.join(tmp, "gpu"))
    a = hold(env, 20, count=8)
    check(free_bytes(env) == CAPACITY - 20 * MIB, "free with 20 MiB held elsewhere")
    check(grab(env) == (44, OOM), "grab beside 20 MiB")
    check(grab(env, 1, 0, 10) == (10, 0), "grab stops at MAX_BLOCKS")
    a.send("free")
    a.expect("freed")
    check(grab(env) == (64, OOM), "grab after the neighbour freed")
    a.send("alloc 100")
    a.expect("allocated 64")
    check(grab(env) == (0, OOM), "grab on a full device")
    a.send("info")
    a.expect("free 0 total %d" % CAPACITY)
    a.send("exit")
    a.finish()
    check(grab(env, 4) == (16, OOM), "grab after the neighbour exited")


def test_race(tmp):
    """Allocation is check-and-add across processes: neighbours allocating at
    once never get more than the device has, and leave nothing unused."""
    env = environ(os.path.join(tmp, "gpu"))
    procs = [hold(env, 0) for _ in range(6)]
    for _ in range(20):
        for p in procs:
            p.send("alloc 1000")
        got = [int(p.expect(r"allocated (\d+)").group(1)) for p in procs]
        check(sum(got) == 64, "neighbours got %s blocks of 1 MiB, %d in all" % (got, sum(got)))
        check(free_bytes(env) == 0, "device not full")
        for p in procs:
            p.send("free")
        for p in procs:
            p.expect("freed")
    for p in procs:
        p.finish()
    check(free_bytes(env) == CAPACITY, "device not empty after all exited")


def test_sigkill(tmp):
    """A process killed with SIGKILL stops counting at once, while still a
    zombie (not reaped), and its slot is used again."""
    path = os.path.join(tmp, "gpu")
    env = environ(path)
    a = hold(env, 40)
    check(free_bytes(env) == 24 * MIB, "free with 40 MiB held elsewhere")
    a.p.kill()
    deadline = time.time() + 10
    while free_bytes(env) != CAPACITY:
        check(time.time() < deadline, "a killed process still counts")
        time.sleep(0.05)
    # Its files close before it becomes a zombie (exit_files, then
    # exit_notify): the state may lag the freed memory by a moment.
    while True:
        with open("/proc/%d/stat" % a.p.pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        if state == "Z" or time.time() > deadline:
            break
        time.sleep(0.01)
    check(state == "Z", "the killed process is %r, not a zombie" % state)
    b = hold(env, 10)
    for _ in range(5):
        check(free_bytes(env) == 54 * MIB, "free beside 10 MiB")
    check(grab(env) == (54, OOM), "grab beside 10 MiB")
    b.send("exit")
    b.finish()
    a.p.wait()
    # a, b and one at a time of the short-lived ones: dead processes' slots
    # are taken again.
    check(slots_ever_used(path) <= 3, "%d slots used by 3 live processes at most"
          % slots_ever_used(path))


def probe_mem(env, mib):
    out = run([PROBE, "mem", str(mib)], env)
    vals = {}
    for line in out:
        words = line.split()
        vals[words[0]] = {words[i]: int(words[i + 1]) for i in range(1, len(words) - 1, 2)} \
            if len(words) > 2 else int(words[1])
    return vals


def test_nvml(tmp):
    """NVML's memory info is cuMemGetInfo's, from the shared file: the
    neighbours' usage and the probe's own (its libcuda's slot)."""
    env = environ(os.path.join(tmp, "gpu"))
    a = hold(env, 20)
    v = probe_mem(env, 5)
    check(v["cuda"] == {"free": CAPACITY - 25 * MIB, "total": CAPACITY}, "cuda %s" % v)
    check(v["nvml"] == {"free": CAPACITY - 25 * MIB, "used": 25 * MIB, "total": CAPACITY},
          "nvml %s" % v)
    check(v["all"] == 25 * MIB, "standin_used_all %s" % v)
    calls = v["nvml_calls"]
    check(calls >= 1, "nvmlDeviceGetMemoryInfo not counted")
    a.send("free")
    a.expect("freed")
    v = probe_mem(env, 0)
    check(v["nvml"]["used"] == 0 and v["cuda"]["free"] == CAPACITY, "after free: %s" % v)
    check(v["nvml_calls"] == calls + 1, "calls %d then %d" % (calls, v["nvml_calls"]))
    a.send("exit")
    a.finish()
    # Without a shared file: the process's own device, its libcuda's count.
    env = environ(None)
    a = hold(env, 20)
    v = probe_mem(env, 5)
    check(v["nvml"] == {"free": CAPACITY - 5 * MIB, "used": 5 * MIB, "total": CAPACITY},
          "private nvml %s" % v)
    check(v["nvml_calls"] == 0, "private: counted %s" % v)
    a.finish()


def uuids(env, cwd=None):
    out = run([PROBE, "uuid"], env, cwd)
    check(len(out) == 2, "uuid: %s" % out)
    for line in out:
        check(re.fullmatch(r"uuid \d GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                           line), "uuid line %r" % line)
    return out


def test_uuid(tmp):
    """One UUID per device for every process on the file (however it names
    it); other files and unshared processes are other GPUs. The probe itself
    checks CUDA's and NVML's views agree."""
    x = uuids(environ(os.path.join(tmp, "x")))
    check(uuids(environ(os.path.join(tmp, "x"))) == x, "two processes on one file")
    check(uuids(environ("x"), cwd=tmp) == x, "a relative path to the same file")
    y = uuids(environ(os.path.join(tmp, "y")))
    check(not set(x) & set(y), "two files, one GPU: %s %s" % (x, y))
    p1, p2 = uuids(environ(None)), uuids(environ(None))
    check(not set(p1) & set(p2) and not set(p1) & set(x), "unshared processes share a GPU")


def procs(env, mib=0):
    """NVML's list of the processes using device 0, seen by a probe that
    itself allocates `mib` MiB: ({pid: bytes} of the others, the probe's own
    bytes or None if not listed). The probe checks the list adds up to NVML's
    used memory and gives it its own usage."""
    out = run([PROBE, "procs", str(mib)], env)
    check(re.fullmatch(r"self \d+", out[-1]), "procs: last line %r" % out[-1])
    self_pid = int(out[-1].split()[1])
    listed = {}
    for line in out[:-1]:
        m = re.fullmatch(r"proc (\d+) (\d+)", line)
        check(m, "procs: line %r" % line)
        listed[int(m.group(1))] = int(m.group(2))
    return listed, listed.pop(self_pid, None)


def test_procs(tmp):
    """NVML lists each live process on the file with its own usage, only
    while it uses the device; without a file, the process alone."""
    env = environ(os.path.join(tmp, "gpu"))
    check(procs(env) == ({}, None), "an idle device lists processes")
    a = hold(env, 20)
    b = hold(env, 7)
    listed = procs(env)
    check(listed == ({a.p.pid: 20 * MIB, b.p.pid: 7 * MIB}, None), "two neighbours: %s" % (listed,))
    listed = procs(env, 3)
    check(listed == ({a.p.pid: 20 * MIB, b.p.pid: 7 * MIB}, 3 * MIB), "with the probe: %s" % (listed,))
    a.send("free")
    a.expect("freed")
    check(procs(env) == ({b.p.pid: 7 * MIB}, None), "a process with nothing left is listed")
    b.p.kill()
    b.p.wait()
    check(procs(env) == ({}, None), "a killed process is still listed")
    a.finish()
    # Without a file: this process alone, if it uses the device.
    env = environ(None)
    a = hold(env, 20)
    listed = procs(env, 5)
    check(listed == ({}, 5 * MIB), "private: %s" % (listed,))
    check(procs(env) == ({}, None), "private, unused: listed")
    a.finish()


CTX = 3 * MIB  # STANDIN_CONTEXT_BYTES in test_context


def test_context(tmp):
    """STANDIN_CONTEXT_BYTES: each process's primary context and each "ctx"
    hold that much of the shared device, listed as that process's usage; a
    context that does not fit fails with out of memory; destroying gives it
    back (the probe checks destroy, release and reset in one process)."""
    env = environ(os.path.join(tmp, "gpu"), CTX)
    # Lists from a probe with no context bytes of its own: it also looks at a
    # full device.
    observer = environ(os.path.join(tmp, "gpu"))
    a = hold(env, 10)
    listed = procs(env)
    check(listed == ({a.p.pid: 10 * MIB + CTX}, CTX), "primary contexts + 10 MiB: %s" % (listed,))
    a.send("ctx")
    a.expect("ctx 0")
    check(procs(observer)[0] == {a.p.pid: 10 * MIB + 2 * CTX}, "a ctx raises the usage by CTX")
    a.send("info")
    a.expect("free %d total %d" % (CAPACITY - 10 * MIB - 2 * CTX, CAPACITY))
    b = hold(env, 0)
    b.send("alloc 1000")
    left = CAPACITY - 10 * MIB - 3 * CTX
    b.expect("allocated %d" % (left // MIB))
    a.send("ctx")
    a.expect("ctx %d" % OOM)
    check(procs(observer)[0] == {a.p.pid: 10 * MIB + 2 * CTX, b.p.pid: CTX + left},
          "a failed ctx changed the usage")
    b.send("free")
    b.expect("freed")
    a.send("ctx")
    a.expect("ctx 0")
    check(procs(observer)[0] == {a.p.pid: 10 * MIB + 3 * CTX, b.p.pid: CTX}, "after b freed")
    # Beside them, one process's contexts come and go (the probe's checks).
    out = run([PROBE, "ctx"], env)
    fits = (CAPACITY - 10 * MIB - 5 * CTX) // CTX
    check(out == ["ok contexts %d" % fits], "probe ctx beside neighbours: %s" % out)
    check(procs(observer)[0] == {a.p.pid: 10 * MIB + 3 * CTX, b.p.pid: CTX}, "after the probe")
    a.send("exit")
    a.finish()  # destroys its two extra contexts on the way out
    check(procs(observer)[0] == {b.p.pid: CTX}, "after a exited")
    b.finish()
    check(free_bytes(env) == CAPACITY - CTX, "info's own primary context")
    # Without a file: the same within one process.
    out = run([PROBE, "ctx"], environ(None, CTX))
    check(out == ["ok contexts %d" % ((CAPACITY - CTX) // CTX)], "private probe ctx: %s" % out)


HOST_CAPACITY = 32 * MIB  # STANDIN_HOST_CAPACITY in test_host


def test_host(tmp):
    """STANDIN_HOST_CAPACITY with STANDIN_SHARED: one pinned budget for the
    processes on the file (check-and-add, given back by cuMemFreeHost and by
    a SIGKILL), apart from the device budget, and invisible to NVML. Unset,
    or without the file, each process has its own."""
    path = os.path.join(tmp, "gpu")
    env = environ(path, host_capacity=HOST_CAPACITY)
    all_host = HOST_CAPACITY // MIB
    a = hold(env, 12, count=4, host=True)
    check(grab(env, 1, "host") == (all_host - 12, OOM), "pinned grab beside 12 MiB pinned")
    check(grab(env, 4, 0, 2, "host") == (2, 0), "pinned grab stops at MAX_BLOCKS")
    # The device budget is untouched, and NVML sees no device usage, no
    # process and no extra device.
    check(free_bytes(env) == CAPACITY, "pinned memory taken from the device")
    check(grab(env) == (CAPACITY // MIB, OOM), "device grab beside pinned memory")
    v = probe_mem(env, 0)
    check(v["nvml"]["used"] == 0 and v["all"] == 0, "NVML counts pinned memory: %s" % v)
    check(procs(env) == ({}, None), "NVML lists a process holding pinned memory only")
    out = run([PROBE, "uuid"], dict(env, STANDIN_DEVICES="8"))
    check(len(out) == 8, "8 devices and pinned memory: %s" % out)
    # Device memory leaves the pinned budget alone.
    b = hold(env, 40)
    check(grab(env, 1, "host") == (all_host - 12, OOM), "pinned grab beside device memory")
    b.finish()
    a.send("free")
    a.expect("freed")
    check(grab(env, 1, "host") == (all_host, OOM), "pinned grab after the neighbour freed")
    a.send("alloc 1000")
    a.expect("allocated %d" % all_host)
    check(grab(env, 1, "host") == (0, OOM), "pinned grab with all pinned memory held")
    a.send("info")
    a.expect("free %d total %d" % (CAPACITY, CAPACITY))
    a.p.kill()
    deadline = time.time() + 10
    while grab(env, 1, "host") != (all_host, OOM):
        check(time.time() < deadline, "a killed process's pinned memory still counts")
        time.sleep(0.05)
    a.p.wait()
    # Neighbours asking at once never get more than the budget, nor leave
    # any of it unused.
    ps = [hold(env, 0, host=True) for _ in range(4)]
    for _ in range(5):
        for p in ps:
            p.send("alloc 1000")
        got = [int(p.expect(r"allocated (\d+)").group(1)) for p in ps]
        check(sum(got) == all_host, "pinned race: %s" % got)
        for p in ps:
            p.send("free")
        for p in ps:
            p.expect("freed")
    for p in ps:
        p.finish()
    # Without the file: the limit is each process's own.
    env = environ(None, host_capacity=HOST_CAPACITY)
    a = hold(env, 20, host=True)
    check(grab(env, 1, "host") == (all_host, OOM), "private pinned grab")
    a.send("alloc 1000")
    a.expect("allocated %d" % (all_host - 20))
    a.finish()
    # On the file without STANDIN_HOST_CAPACITY: as before, 1 GiB per
    # process, not shared (the blocks are never touched: no real memory).
    env = environ(path)
    a = hold(env, 0, host=True)
    a.send("alloc 2000")
    a.expect("allocated 1024")
    check(grab(env, 64, "host") == (16, OOM), "unset host capacity shared")
    a.finish()


def test_private(tmp):
    """Without STANDIN_SHARED every process has its own device, as before."""
    env = environ(None)
    a = hold(env, 40)
    check(free_bytes(env) == CAPACITY, "a private device sees a neighbour")
    check(grab(env) == (64, OOM), "a private grab")
    a.send("info")
    a.expect("free %d total %d" % (24 * MIB, CAPACITY))
    a.finish()


def main():
    global NEIGHBOUR, PROBE
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    NEIGHBOUR, PROBE, name = sys.argv[1:]
    test = globals().get("test_" + name)
    if not test:
        print("no test %r" % name)
        return 2
    with tempfile.TemporaryDirectory(prefix="standin-shared-") as tmp:
        test(tmp)
    print("ok " + name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
