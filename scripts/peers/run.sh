#!/usr/bin/env bash
# The peers' own test suites on the GPU machine (issues 24 and 34), each run
# twice (without gpupool, and with LD_PRELOAD=LIB) in one device call, all
# suites at once, plus the JAX and PyCUDA allocation loops, interleaved, for
# the speed.
#
#   bash scripts/peers/run.sh LIB OUTDIR [SUITE...]
#     LIB     a built libgpupool.so (the device machine builds nothing of ours here)
#     OUTDIR  where the results go ($OUT in a device call): four files,
#             peers-run.log, peers-summary.txt, compat.md, peers-results.tar.gz
#     SUITE   pycuda numba cupy torch jax pyopencl (default: all)
#   PEERS_LOOPS=1: the timing loops too (JAX's comes with the suite jax, PyCUDA's with pycuda)
#   PEERS_DEADLINE: seconds until everything, results included, is written (default 540)
#   PEERS_DRY_RUN=1: install and select as for real, print each pytest command, run none
#   PEERS_GPUPOOL_ENV: more VAR=value words for the runs with gpupool (GPUPOOL_SEGMENTS=expandable)
#
# What it needs besides the machine's own packages is carried in .peers/
# (made by scripts/peers/fetch.sh, listed in .peers/SOURCES.txt): PyCUDA's
# sdist (built there, in the background, while other work runs), the wheels
# the machine lacks (installed only where it lacks them), numba-cuda's own
# numpy and pytest (numba-wheels/, first on the numba runs' PYTHONPATH only),
# PyOpenCL's wheel and test files, and the test files of CuPy, numba-cuda,
# PyTorch and JAX at the machine's versions. scripts/peers/README.md says
# what runs and why.
#
# Order (the deadline PEERS_DEADLINE bounds everything):
#   A  pycuda build (background) | with PEERS_LOOPS=1, JAX loop, 3 modes x PEERS_JAX_ROUNDS rounds
#      (a quiet GPU for the timing; the build takes one core)
#   B  every suite's tests, both runs of each at once (pytest-xdist workers),
#      each run under `timeout -s INT` so that pytest still writes its junit
#      XML, and killed by the deadline less PEERS_FINAL_RESERVE; PyCUDA's
#      start when its build is done
#   C  with PEERS_LOOPS=1, PyCUDA's gpuarray loop, 4 modes x PEERS_PYCUDA_ROUNDS rounds (quiet GPU)
#   D  scripts/peers/compare.py: per suite, the outcomes without / with
#      gpupool and every test whose outcome differs; compat.md
# Missing pieces (a package, the GPU, OpenCL, the library) give SKIP lines,
# never a hang.
set -u -o pipefail

usage() {
  sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
(($# >= 2)) || usage
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$ROOT/scripts/peers
LIB_ARG=$1
OUTDIR=$2
shift 2
ALL=(pycuda numba cupy torch jax pyopencl)
SUITES=("$@")
((${#SUITES[@]})) || SUITES=("${ALL[@]}")
for s in "${SUITES[@]}"; do
  [[ " ${ALL[*]} " == *" $s "* ]] || { echo "run.sh: unknown suite '$s' (known: ${ALL[*]})" >&2; exit 2; }
done
want() { [[ " ${SUITES[*]} " == *" $1 "* ]]; }

PEERS=${PEERS_DIR:-$ROOT/.peers}
WORK=${PEERS_WORK:-/tmp/gpupool-peers}
RES=$WORK/results
DEADLINE=${PEERS_DEADLINE:-540}
PY=${PEERS_PY:-python3}
FINAL=${PEERS_FINAL_RESERVE:-15}            # seconds kept for compare.py and the tarball
GRACE=20                                    # a run's seconds between SIGINT and SIGKILL
LOOPS=${PEERS_LOOPS:-0}
DRY=${PEERS_DRY_RUN:-0}
LOOP_RESERVE=${PEERS_LOOP_RESERVE:-100}     # seconds kept for phase C
JAX_BUDGET=${PEERS_JAX_BUDGET:-150}         # phase A's JAX rounds end by this many seconds
JAX_ROUNDS=${PEERS_JAX_ROUNDS:-5}
PYCUDA_ROUNDS=${PEERS_PYCUDA_ROUNDS:-10}
NCPU=$(nproc 2>/dev/null || echo 4)
# xdist workers per run (both runs of every suite go at once). For 16 cores and
# numba cupy torch jax: CuPy's selection is the longest (65 to 101 s of test time
# in the calls of 2026-11-29), numba-cuda's the shortest (about 25).
W_PYCUDA=${PEERS_PYCUDA_WORKERS:-6}
W_NUMBA=${PEERS_NUMBA_WORKERS:-2}
W_CUPY=${PEERS_CUPY_WORKERS:-7}
W_TORCH=${PEERS_TORCH_WORKERS:-2}
W_JAX=${PEERS_JAX_WORKERS:-3}
W_PYOPENCL=${PEERS_PYOPENCL_WORKERS:-3}
T0=$SECONDS

# The selections (README.md says why these). numba-cuda 0.30.4's tests that allocate
# (modules of its wheel's numba.cuda.tests)
NUMBA_TESTS=${PEERS_NUMBA_TESTS:-"
  cudadrv.test_cuda_memory cudadrv.test_deallocations cudadrv.test_context_stack
  cudadrv.test_cuda_ndarray cudadrv.test_cuda_array_slicing cudadrv.test_array_attr
  cudadrv.test_host_alloc cudadrv.test_pinned cudadrv.test_streams cudadrv.test_events
  cudadrv.test_emm_plugins cudadrv.test_reset_device cudadrv.test_select_device
  cudadrv.test_cuda_auto_context cudadrv.test_cuda_driver cudadrv.test_runtime
  cudapy.test_ipc cudapy.test_stream_api cudapy.test_array cudapy.test_cuda_array_interface
  cudapy.test_multithreads cudapy.test_multiprocessing cudapy.test_sync cudapy.test_transpose
  cudapy.test_array_args cudapy.test_retrieve_autoconverted_arrays
  cudapy.test_device_array_capture cudapy.test_slicing"}
CUPY_TESTS=${PEERS_CUPY_TESTS:-"
  cuda_tests/test_memory.py cuda_tests/test_stream.py cuda_tests/test_pinned_memory.py
  cuda_tests/test_device.py cuda_tests/test_driver.py cuda_tests/test_memory_hook.py
  core_tests/test_ndarray.py core_tests/test_ndarray_copy_and_view.py core_tests/test_elementwise.py
  core_tests/test_dlpack.py core_tests/test_ndarray_get.py core_tests/test_ndarray_cuda_array_interface.py
  core_tests/test_multithreading.py core_tests/test_ndarray_owndata.py"}
PYOPENCL_TESTS=${PEERS_PYOPENCL_TESTS:-"
  test_array.py test_wrapper.py test_algorithm.py test_clmath.py test_enqueue_copy.py
  test_clrandom.py test_arrays_in_structs.py"}
PYCUDA_TESTS=${PEERS_PYCUDA_TESTS:-"test_driver.py test_cumath.py test_gpuarray.py"}
# PyTorch's test_cuda.py with the caching allocator off (every tensor a cudaMalloc),
# less (a -k expression; PEERS_TORCH_K= for none) the tests that take half the GPU or
# 20 GB while the other suites run beside them, and those of what the caching
# allocator does only when on: its statistics (device and pinned), its out-of-memory
# message and its record_stream bookkeeping (each failed both ways on the H200)
TORCH_TESTS=${PEERS_TORCH_TESTS:-"test/test_cuda.py::TestCuda"}
TORCH_K=${PEERS_TORCH_K-"not test_out_of_memory_retry and not test_set_per_process_memory_fraction
  and not test_randint_generation_for_large_numel and not test_memory_stats
  and not test_cublas_workspace_explicit_allocation and not test_memory_allocation
  and not test_host_memory_stats and not test_out_of_memory and not test_record_stream"}
TORCH_K=$(xargs <<<"$TORCH_K")
# JAX's tests that allocate: memory kinds and transfers between them, jax.Array,
# placement, transfer guards, and jit's buffers, donation and collection
JAX_TESTS=${PEERS_JAX_TESTS:-"
  tests/memories_test.py tests/array_test.py tests/multi_device_test.py tests/transfer_guard_test.py
  tests/api_test.py::JitTest tests/api_test.py::BufferDonationTest
  tests/api_test.py::GarbageCollectionTest tests/api_test.py::CleanupTest"}

mkdir -p "$OUTDIR" || exit 1
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/peers-run.log
rm -f "$LOG" "$OUTDIR"/peers-summary.txt "$OUTDIR"/compat.md "$OUTDIR"/peers-results.tar.gz
rm -rf "$WORK"
mkdir -p "$WORK"/site "$WORK"/cache "$WORK"/src "$WORK"/vendors \
  "$RES"/junit "$RES"/logs "$RES"/meta "$RES"/loops "$RES"/gpstats "$RES"/gplog || exit 1

unset LD_PRELOAD  # each run says whether it has gpupool
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[[ -d /usr/local/cuda/bin ]] && export PATH=/usr/local/cuda/bin:$PATH
export PYTHONPATH=$HERE/plugins:$WORK/site${PYTHONPATH:+:$PYTHONPATH}

squeeze() { xargs <<<"$1"; }  # one line, single spaces
# count_groups "a.x a.y b.z" . -> "2 a + 1 b modules"
count_groups() { tr ' ' '\n' <<<"$1" | grep . | cut -d"$2" -f1 | uniq -c | awk '{ s = s (NR > 1 ? " + " : "") $1 " " $2 } END { print s " modules" }'; }
say() { printf '[%3ds] %s\n' $((SECONDS - T0)) "$*" | tee -a "$LOG"; }
left() { echo $((DEADLINE - (SECONDS - T0))); }
# meta SUITE KEY VALUE: what compare.py puts in the table (library, version, tests, skip)
meta() { printf '%s=%s\n' "$2" "$3" >>"$RES/meta/$1.info"; }
skip_suite() { meta "$1" skip "$2"; say "SKIP $1: $2"; }

say "peers run: suites ${SUITES[*]}; loops $( ((LOOPS)) && echo on || echo off); deadline ${DEADLINE}s; $NCPU cores; python $(command -v "$PY")$( ((DRY)) && echo '; DRY RUN: no test runs')"
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1 |
  sed "s/\$/; $(nproc) cores; $(date -u '+%Y-%m-%d %H:%M UTC')/" >"$RES/meta/machine.txt"
say "machine: $(cat "$RES/meta/machine.txt")"

# ---- the library ------------------------------------------------------------
GP_OK=0
LIB=$(readlink -f -- "$LIB_ARG" 2>/dev/null || true)
if [[ -z $LIB || ! -f $LIB ]]; then
  GP_WHY="library '$LIB_ARG' not found"
else
  pre=$(LD_PRELOAD=$LIB /bin/true 2>&1)
  if grep -qiE 'ld\.so|cannot be preloaded|cannot open shared object|undefined symbol' <<<"$pre"; then
    GP_WHY="LD_PRELOAD=$LIB does not load: $pre"
  else
    GP_OK=1
    [[ -n $pre ]] && say "note: under LD_PRELOAD=$LIB, /bin/true printed: $pre"
  fi
fi
if ((GP_OK)); then say "gpupool: $LIB"; else say "WARNING: $GP_WHY: every 'with gpupool' run is skipped"; fi
printf 'lib=%s\nok=%s\n' "$LIB_ARG" "$GP_OK" >"$RES/meta/gpupool.info"

# MENV: the environment of a run. plain: no gpupool at all; gpupool: the
# preload, its log in a file (never on the tests' stderr) and its stats at
# exit, all processes of the run appending to one file.
mode_env() {
  MENV=()
  [[ $1 == gpupool ]] && MENV=(LD_PRELOAD="$LIB" GPUPOOL_LOG="${PEERS_GPUPOOL_LOG:-warn}"
    GPUPOOL_LOG_FILE="$RES/gplog/$2.log" GPUPOOL_STATS_AT_EXIT=1 GPUPOOL_STATS_FORMAT=json
    GPUPOOL_STATS_FILE="$RES/gpstats/$2.jsonl" ${PEERS_GPUPOOL_ENV:-})
  return 0
}
MODES=(plain)
((GP_OK)) && MODES+=(gpupool)

# ---- carried wheels: only what the machine lacks ------------------------------
WHEELS=$PEERS/wheels
words() { read -r -d '' -a WORDS <<<"$1"; return 0; }  # WORDS: the words of $1
words "${PEERS_PIP_ARGS:-}"  # more pip install arguments (a dry run elsewhere: --python-version ...)
PIP_ARGS=("${WORDS[@]}")
pip_target() {  # pip_target DIR WHEEL...: install carried wheels into a private folder
  local dir=$1
  shift
  timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    "${PIP_ARGS[@]}" --target "$dir" "$@"
}
if [[ -d $WHEELS ]]; then
  mapfile -t missing < <(cd "$WHEELS" && "$PY" - <<'EOF'
import glob, importlib.util
names = {"pytest_xdist": "xdist"}
# numba-cuda's pytest.ini wants pytest 8 or newer: an older one brings the carried stack
stack = {"pytest", "pluggy", "iniconfig", "xdist", "execnet"}
old_pytest = False
if importlib.util.find_spec("pytest") is not None:
    import pytest
    old_pytest = int(pytest.__version__.split(".")[0]) < 8
for w in sorted(glob.glob("*.whl")):
    mod = w.split("-")[0].lower()
    mod = names.get(mod, mod)
    if importlib.util.find_spec(mod) is None or (old_pytest and mod in stack):
        print(w)
EOF
  )
  if ((${#missing[@]})); then
    say "installing ${#missing[@]} carried wheels the machine lacks: ${missing[*]}"
    if ! (cd "$WHEELS" && pip_target "$WORK/site" "${missing[@]}") >>"$RES/logs/setup.log" 2>&1; then
      say "one pip call failed; installing them one by one"
      for w in "${missing[@]}"; do
        (cd "$WHEELS" && pip_target "$WORK/site" "$w") >>"$RES/logs/setup.log" 2>&1 ||
          say "  could not install $w (see setup.log)"
      done
    fi
  else
    say "the machine has every carried wheel's package"
  fi
else
  say "WARNING: $WHEELS missing (carry .peers): PyCUDA and PyOpenCL cannot be installed"
fi
# numba-cuda's own numpy and pytest, for its runs only (first on their PYTHONPATH)
NUMBA_SITE=$WORK/site-numba
NUMBA_SITE_OK=0
if want numba; then
  if compgen -G "$PEERS/numba-wheels/*.whl" >/dev/null &&
    pip_target "$NUMBA_SITE" "$PEERS"/numba-wheels/*.whl >>"$RES/logs/setup.log" 2>&1; then
    NUMBA_SITE_OK=1
    say "numba: $(cd "$PEERS/numba-wheels" && echo *.whl) in $NUMBA_SITE"
  fi
fi
"$PY" - >"$RES/meta/versions.txt" 2>&1 <<'EOF'
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for d in ["pytest", "pytest-xdist", "pytest-timeout", "pytest-benchmark", "numpy", "numba",
          "numba-cuda", "cupy-cuda13x", "cupy-cuda12x", "torch", "expecttest", "hypothesis",
          "jax", "jaxlib", "jax-cuda13-plugin", "absl-py", "pyopencl", "pytools", "cuda-bindings",
          "cffi", "filecheck", "ml_dtypes"]:
    try:
        print(d, md.version(d))
    except md.PackageNotFoundError:
        pass
EOF
say "versions: $(tr '\n' ' ' <"$RES/meta/versions.txt")"
if ! "$PY" -c 'import pytest' 2>/dev/null; then
  say "WARNING: pytest is not importable: every test suite is skipped"
  HAVE_PYTEST=0
else
  HAVE_PYTEST=1
fi
XDIST=0
"$PY" -c 'import xdist' 2>/dev/null && XDIST=1
# pytest-timeout where the machine has it: a test that hangs fails alone, the run goes on
# (the help read whole first: `pytest --help | grep -q` under pipefail fails whenever grep
# stops reading before pytest has written the rest, which pytest reports as a broken pipe)
PT_TIMEOUT=()
if ((HAVE_PYTEST)); then
  pt_help=$(cd "$WORK" && "$PY" -m pytest --help 2>/dev/null)
  [[ $pt_help == *--timeout=* ]] && PT_TIMEOUT=(--timeout "${PEERS_TEST_TIMEOUT:-150}")
fi
say "pytest-xdist: $( ((XDIST)) && echo yes || echo no); pytest-timeout: ${PT_TIMEOUT[*]:-no}"
((XDIST)) || say "pytest-xdist is not importable: each run goes in one process (slower)"
# XA: pytest-xdist's arguments for N workers (none without xdist)
nflag() {
  XA=()
  ((XDIST && $1 > 1)) && XA=(-n "$1" "${@:2}")
  return 0
}
pyver() { "$PY" -c "$1" 2>/dev/null | tail -n 1; }

# ---- run_pytest SUITE MODE CWD END [VAR=VALUE...] -- PYTEST-ARGS...
# One run of a suite, in CWD, ended by END seconds after the start at the
# latest: SIGINT GRACE seconds before (pytest stops and still writes its
# XML), SIGKILL at END.
run_pytest() {
  local suite=$1 mode=$2 cwd=$3 end=$4
  shift 4
  local envs=()
  while (($#)) && [[ $1 != -- ]]; do envs+=("$1"); shift; done
  shift
  local tag=$suite--$mode t t1 rc
  t=$((end - GRACE - (SECONDS - T0)))
  if ((t < 20)); then
    echo "skip 0 0" >"$RES/meta/$tag.rc"
    say "$tag: not started (out of time)"
    return 0
  fi
  mode_env "$mode" "$tag"
  t1=$SECONDS
  local cmd="pytest $*"
  ((${#cmd} > 240)) && cmd="${cmd:0:240}..."
  say "$tag: start (limit ${t}s): $cmd"
  if ((DRY)); then
    {
      echo "cd $cwd &&"
      printf '%q ' env -u LD_PRELOAD "${envs[@]}" "${MENV[@]}" "$PY" -m pytest -v -rfEs -p no:cacheprovider \
        -p peers_sigint "${PT_TIMEOUT[@]}" --junitxml="$RES/junit/$tag.xml" "$@"
      echo
    } >"$RES/logs/$tag.log"
    echo "dry 0 $t" >"$RES/meta/$tag.rc"
    return 0
  fi
  (cd "$cwd" && timeout -s INT -k "$GRACE" "$t" env -u LD_PRELOAD "${envs[@]}" "${MENV[@]}" \
    "$PY" -m pytest -v -rfEs -p no:cacheprovider -p peers_sigint "${PT_TIMEOUT[@]}" \
    --junitxml="$RES/junit/$tag.xml" "$@") >"$RES/logs/$tag.log" 2>&1 </dev/null
  rc=$?
  echo "$rc $((SECONDS - t1)) $t" >"$RES/meta/$tag.rc"
  say "$tag: rc $rc in $((SECONDS - t1))s$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT: partial results)')"
  return 0
}

# check_import SUITE LOGNAME CODE [VAR=VALUE...]: CODE runs (a dry run only says so)
check_import() {
  local suite=$1 log=$RES/logs/$2.log code=$3
  shift 3
  ((DRY)) && { echo "dry run: not checked: $code" >"$log"; return 0; }
  env "$@" timeout 120 "$PY" -c "$code" >"$log" 2>&1 && return 0
  skip_suite "$suite" "$(head -c 60 <<<"$code") fails: $(tail -n 1 "$log")"
  return 1
}

TEST_PIDS=()

# ---- phase A: the PyCUDA build in the background ------------------------------
BUILD_PID=
PYSITE=${PEERS_PYCUDA_SITE:-$WORK/site-pycuda}  # PyCUDA goes there (or is there already)
SDIST=$(compgen -G "$WHEELS/pycuda-*.tar.gz" | head -n 1)
if want pycuda; then
  meta pycuda library PyCUDA
  meta pycuda tests "$(squeeze "$PYCUDA_TESTS")"
  if [[ -z $SDIST ]]; then
    skip_suite pycuda "no pycuda-*.tar.gz in $WHEELS"
  elif ! command -v nvcc >/dev/null; then
    skip_suite pycuda "nvcc not found (PATH has /usr/local/cuda/bin when it exists)"
  elif [[ -n ${PEERS_PYCUDA_SITE:-} ]]; then
    say "pycuda: not built: PEERS_PYCUDA_SITE=$PYSITE holds it"
    (echo 0 >"$WORK/pycuda-build.rc") &
    BUILD_PID=$!
  else
    say "pycuda: building $(basename "$SDIST") in the background"
    (timeout $(($(left) - LOOP_RESERVE - FINAL - 60)) "$PY" -m pip install -v --no-index \
      --find-links "$WHEELS" --no-build-isolation --no-deps --no-cache-dir \
      --target "$PYSITE" "$SDIST" >"$RES/logs/pycuda-build.log" 2>&1 </dev/null
    echo $? >"$WORK/pycuda-build.rc") &
    BUILD_PID=$!
  fi
fi

# ---- phase A: the JAX loop, interleaved, while the GPU is otherwise idle ------
jax_rounds() {
  local out=$RES/loops/jax.txt flags=--xla_gpu_autotune_level=0 probe r i m t1 longest=0 rstart
  if ! "$PY" -c 'import jax' 2>/dev/null; then skip_suite jax_loop "jax is not importable"; return; fi
  # Autotuning off: XLA then picks the same kernels in every process, so the
  # bits can be compared; probed first, since XLA aborts on an unknown flag.
  probe=$(XLA_FLAGS=$flags XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 "$PY" -c \
    'import jax, jax.numpy as jnp; x = jnp.ones((64, 64)); (x @ x).block_until_ready(); print("PROBE", jax.__version__, jax.devices()[0].device_kind)' 2>&1)
  if ! grep -q '^PROBE' <<<"$probe"; then
    say "jax: probe with XLA_FLAGS=$flags failed; without it: $(tail -n 2 <<<"$probe" | tr '\n' ' ')"
    flags=
    probe=$(XLA_PYTHON_CLIENT_PREALLOCATE=false timeout 90 "$PY" -c \
      'import jax, jax.numpy as jnp; x = jnp.ones((64, 64)); (x @ x).block_until_ready(); print("PROBE", jax.__version__, jax.devices()[0].device_kind)' 2>&1)
    if ! grep -q '^PROBE' <<<"$probe"; then
      skip_suite jax_loop "JAX cannot run on the GPU: $(tail -n 3 <<<"$probe" | tr '\n' ' ')"
      return
    fi
  fi
  meta jax_loop library JAX
  meta jax_loop version "$(grep '^PROBE' <<<"$probe" | awk '{print $2}')"
  meta jax_loop tests "scripts/peers/jax_loop.py: jit MLP, ${JAX_ROUNDS} rounds x (platform, platform+gpupool, bfc)${flags:+, XLA_FLAGS=$flags}"
  say "jax: $(grep '^PROBE' <<<"$probe"); XLA_FLAGS=${flags:-none}"
  local modes=(platform) jargs
  words "${PEERS_JAX_ARGS:-}"  # more jax_loop.py arguments
  jargs=("${WORDS[@]}")
  ((GP_OK)) && modes+=(platform-gpupool)
  modes+=(bfc)
  for ((r = 1; r <= JAX_ROUNDS; r++)); do
    if ((r > 1 && (SECONDS - T0) + longest > JAX_BUDGET)); then
      say "jax: stopping after $((r - 1)) rounds (phase A budget ${JAX_BUDGET}s)"
      break
    fi
    rstart=$SECONDS
    for ((i = 0; i < ${#modes[@]}; i++)); do
      m=${modes[$(((i + r - 1) % ${#modes[@]}))]}  # rotate the order every round
      local envs=(XLA_FLAGS="$flags")
      case $m in
        platform) mode_env plain x ;;
        platform-gpupool) mode_env gpupool jax_loop ;;
        bfc) mode_env plain x ;;
      esac
      [[ $m == platform* ]] && envs+=(XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_ALLOCATOR=platform)
      t1=$SECONDS
      {
        echo "=== round $r mode $m"
        timeout -k 5 90 env -u LD_PRELOAD -u XLA_PYTHON_CLIENT_PREALLOCATE -u XLA_PYTHON_CLIENT_ALLOCATOR \
          "${envs[@]}" "${MENV[@]}" "$PY" "$HERE/jax_loop.py" --mode "$m" --round "$r" "${jargs[@]}" 2>&1 </dev/null
        echo "=== rc $? in $((SECONDS - t1))s"
      } >>"$RES/logs/jax.log"
    done
    ((SECONDS - rstart > longest)) && longest=$((SECONDS - rstart))
    say "jax: round $r done in $((SECONDS - rstart))s"
  done
  grep -h '^RESULT' "$RES/logs/jax.log" >"$out"
}
# the loop's results are jax_loop's, the suite's jax's
if want jax && ((LOOPS && !DRY)); then jax_rounds; fi

# ---- phase B: the test suites, both runs of each at once ----------------------
TESTS_END=$((DEADLINE - FINAL))
want pycuda && ((LOOPS)) && TESTS_END=$((DEADLINE - FINAL - LOOP_RESERVE))

start_numba() {
  meta numba library numba-cuda
  meta numba version "$(pyver 'import importlib.metadata as m; print(m.version("numba-cuda"))')"
  local mods=() m
  for m in $NUMBA_TESTS; do mods+=("numba.cuda.tests.$m"); done
  meta numba tests_full "numba.cuda.tests.{$(squeeze "$NUMBA_TESTS" | tr ' ' ',')}"
  # numba-cuda 0.30.4 overloads np.row_stack, which numpy 2.5 (the machine's) removed
  # (numba-cuda's fix, fd35344b, came after the release): its runs get numba-wheels/'s
  # numpy and the pytest its test group names (>=8,<9), first on their PYTHONPATH
  if ((!NUMBA_SITE_OK)); then
    skip_suite numba "no numpy for numba-cuda: $PEERS/numba-wheels/*.whl missing or not installable (setup.log)"
    return
  fi
  local npath=$NUMBA_SITE:$PYTHONPATH
  meta numba tests "$(count_groups "$NUMBA_TESTS" .) of numba.cuda.tests; $(PYTHONPATH=$npath pyver 'import numpy, pytest; print("numpy", numpy.__version__, "and pytest", pytest.__version__)')"
  check_import numba numba-import 'import numba.cuda.tests.cudadrv.test_cuda_memory' PYTHONPATH="$npath" || return
  local where
  where=$(PYTHONPATH=$npath pyver 'import numba.cuda.tests as t; print(t.__file__)')
  say "numba: numba.cuda.tests from $where; $(PYTHONPATH=$npath pyver 'import numpy; print("numpy", numpy.__version__, numpy.__file__)')"
  [[ $where == */numba_cuda/* ]] || ((DRY)) || meta numba version "$(pyver 'import importlib.metadata as m; print(m.version("numba-cuda"))') (WARNING: numba.cuda.tests is numba's own, $where)"
  if [[ ! -f $PEERS/numba-cuda-testing/pytest.ini ]]; then
    skip_suite numba "$PEERS/numba-cuda-testing/pytest.ini missing"
    return
  fi
  for mode in "${MODES[@]}"; do
    local d=$WORK/numba-$mode
    mkdir -p "$d"
    cp "$PEERS"/numba-cuda-testing/pytest.ini "$d"/
    # Its conftest.py (the initialize_from_pytest_config fixture) sits beside the tests in
    # numba-cuda's tree, not in the wheel: pytest would not find it from the installed
    # tests, so it is loaded as a plugin (-p numba_cuda_conftest).
    cp "$PEERS"/numba-cuda-testing/conftest.py "$d"/numba_cuda_conftest.py
    # Its addopts name the whole package (--pyargs numba.cuda.tests): keep --pyargs, run the selection.
    sed -i 's/--pyargs numba\.cuda\.tests/--pyargs/' "$d/pytest.ini"
    # numba-cuda's CI has pytest-benchmark; without it its addopts would not parse
    "$PY" -c 'import pytest_benchmark' 2>/dev/null || sed -i 's/--benchmark-disable //; /pytest_benchmark/d' "$d/pytest.ini"
    # numba-cuda's CI: pytest -v -n auto --dist loadscope (CUDATestCase needs whole classes per worker).
    # --rootdir=/: the tests live in site-packages, outside the rootdir, where pytest would give
    # them ids without their module ("::TestX::test_y"); from / every id names its file.
    nflag "$W_NUMBA" --dist loadscope
    run_pytest numba "$mode" "$d" "$TESTS_END" PYTHONPATH="$d:$npath" -- -c "$d/pytest.ini" \
      --rootdir=/ -p numba_cuda_conftest "${XA[@]}" "${mods[@]}" &
    TEST_PIDS+=($!)
  done
}

start_cupy() {
  meta cupy library CuPy
  meta cupy version "$(pyver 'import cupy; print(cupy.__version__)')"
  # CuPy's own CI subsampling (its conftest.py and cupy.testing): 1 + n/15 of each test's
  # parametrizations and dtype loops, the same in both runs (one seed; PEERS_CUPY_SUBSAMPLE=0: all)
  local sub=()
  [[ ${PEERS_CUPY_SUBSAMPLE:-1} == 1 ]] && sub=(CUPY_TEST_RANDOM_SUBSAMPLE=1 _CUPY_TEST_SUBSAMPLE_SEED="${PEERS_CUPY_SEED:-24}")
  meta cupy tests "$(count_groups "$CUPY_TESTS" /) of tests/cupy_tests, CuPy's pools off$( ((${#sub[@]})) && echo ", CuPy's CI subsampling (seed ${PEERS_CUPY_SEED:-24})"), multi-GPU tests skipped beyond the machine's GPUs"
  meta cupy tests_full "tests/cupy_tests/{$(squeeze "$CUPY_TESTS" | tr ' ' ',')}"
  check_import cupy cupy-import 'import cupy' || return
  # As CuPy's CI (CUPY_TEST_GPU_LIMIT: the machine's GPUs): its multi_gpu tests skip where
  # the machine has fewer GPUs than they name. Run anyway on one GPU they fail with
  # cudaErrorInvalidDevice, and TestDeviceSwitch::test_thread_safe waits forever for a
  # thread that died on Device(1), holding its worker's queued tests with it.
  local ngpu
  ngpu=$(pyver 'import cupy; print(cupy.cuda.runtime.getDeviceCount())')
  [[ $ngpu =~ ^[0-9]+$ ]] || ngpu=1  # a dry run without a GPU
  say "cupy: CUPY_TEST_GPU_LIMIT=$ngpu"
  if [[ ! -d $PEERS/cupy-tests/tests ]]; then skip_suite cupy "$PEERS/cupy-tests missing"; return; fi
  local files=() f
  for f in $CUPY_TESTS; do files+=("tests/cupy_tests/$f"); done
  for mode in "${MODES[@]}"; do
    local d=$WORK/cupy-$mode
    cp -r "$PEERS/cupy-tests" "$d"
    # one kernel cache for both runs: CuPy writes its entries atomically
    nflag "$W_CUPY"
    run_pytest cupy "$mode" "$d" "$TESTS_END" CUPY_CACHE_DIR="$WORK/cache/cupy" CUPY_TEST_GPU_LIMIT="$ngpu" "${sub[@]}" -- \
      "${XA[@]}" -p peers_cupy_nopool "${files[@]}" &
    TEST_PIDS+=($!)
  done
}

start_torch() {
  meta torch library PyTorch
  meta torch version "$(pyver 'import torch; print(torch.__version__)')"
  local src="PyTorch's test_cuda.py"
  [[ -f $PEERS/torch-tests/SOURCE ]] && src=$(head -n 1 "$PEERS/torch-tests/SOURCE")
  meta torch tests "$(squeeze "$TORCH_TESTS")${TORCH_K:+ -k '$TORCH_K'}; caching allocator off; $src"
  if [[ ! -f $PEERS/torch-tests/test/test_cuda.py ]]; then
    skip_suite torch "$PEERS/torch-tests/test/test_cuda.py missing (fetch.sh: TORCH_GIT or TORCH_TEST_CUDA)"
    return
  fi
  # torch.testing._internal imports expecttest (a carried wheel where the machine lacks it)
  check_import torch torch-import 'import torch, torch.testing._internal.common_utils; assert torch.cuda.is_available(), "no CUDA device"' || return
  local k=()
  [[ -n $TORCH_K ]] && k=(-k "$TORCH_K")
  for mode in "${MODES[@]}"; do
    local d=$WORK/torch-$mode
    cp -r "$PEERS/torch-tests" "$d"
    # PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor's memory a cudaMalloc and cudaFree, what
    # gpupool pools (issue 34).
    nflag "$W_TORCH"
    words "$TORCH_TESTS"
    run_pytest torch "$mode" "$d" "$TESTS_END" PYTORCH_NO_CUDA_MEMORY_CACHING=1 -- \
      "${XA[@]}" -p peers_torch_compat "${k[@]}" "${WORDS[@]}" &
    TEST_PIDS+=($!)
  done
}

start_jax() {
  meta jax library JAX
  meta jax version "$(pyver 'import jax, jaxlib; print(jax.__version__, "(jaxlib", jaxlib.__version__ + ")")')"
  local src="JAX's tests"
  [[ -f $PEERS/jax-tests/SOURCE ]] && src=$(head -n 1 "$PEERS/jax-tests/SOURCE")
  meta jax tests "$(squeeze "$JAX_TESTS"); XLA's platform allocator, no preallocation; $src"
  if [[ ! -f $PEERS/jax-tests/pyproject.toml ]]; then
    skip_suite jax "$PEERS/jax-tests missing (fetch.sh)"
    return
  fi
  check_import jax jax-import 'import jax; d = jax.devices()[0]; assert d.platform == "gpu", d' \
    XLA_PYTHON_CLIENT_PREALLOCATE=false || return
  for mode in "${MODES[@]}"; do
    local d=$WORK/jax-$mode
    cp -r "$PEERS/jax-tests" "$d"
    # As JAX's own CUDA CI runs them (ci/run_pytest_cuda.sh): the platform allocator (each
    # buffer its own driver allocation: what gpupool pools), slow tests skipped, one
    # compilation thread, a GPU per xdist worker; and no preallocation, so that the
    # workers share the GPU (the sharing setting). The same in both runs.
    # No pytest-benchmark: its warning under xdist is an error with JAX's
    # filterwarnings, and pytest stops before the first test.
    nflag "$W_JAX"
    words "$JAX_TESTS"
    run_pytest jax "$mode" "$d" "$TESTS_END" XLA_PYTHON_CLIENT_ALLOCATOR=platform \
      XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_SKIP_SLOW_TESTS=true JAX_ENABLE_CUDA_XDIST=1 \
      XLA_FLAGS=--xla_gpu_force_compilation_parallelism=1 TF_CPP_MIN_LOG_LEVEL=1 -- \
      -p no:benchmark "${XA[@]}" "${WORDS[@]}" &
    TEST_PIDS+=($!)
  done
}

ocl_setup() {  # OCL_OK=1 and OCL_ENV when an OpenCL implementation is found
  OCL_OK=0
  OCL_ENV=()
  local icd=${PEERS_OPENCL_ICD:-}
  if [[ -z $icd ]]; then
    icd=$(ldconfig -p 2>/dev/null | awk '$1 == "libnvidia-opencl.so.1" { print $NF; exit }')
    for f in /usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1 /usr/lib64/libnvidia-opencl.so.1 \
      /usr/local/nvidia/lib64/libnvidia-opencl.so.1 /usr/local/nvidia/lib/libnvidia-opencl.so.1 \
      /usr/lib/libnvidia-opencl.so.1; do
      [[ -z $icd && -e $f ]] && icd=$f
    done
  fi
  [[ -n $icd ]] || return 0
  echo "$icd" >"$WORK/vendors/peers.icd"
  OCL_ENV=(OCL_ICD_VENDORS="$WORK/vendors")
  OCL_OK=1
  OCL_ICD=$icd
}

start_pyopencl() {
  meta pyopencl library PyOpenCL
  meta pyopencl tests "$(squeeze "$PYOPENCL_TESTS")"
  ocl_setup
  if ((!OCL_OK)); then skip_suite pyopencl "no OpenCL implementation found (libnvidia-opencl.so.1)"; return; fi
  local v
  v=$(env "${OCL_ENV[@]}" timeout 60 "$PY" -c 'import pyopencl as cl; print(cl.VERSION_TEXT, "on", "; ".join(p.name + ": " + ", ".join(d.name for d in p.get_devices()) for p in cl.get_platforms()))' 2>&1 | tail -n 1)
  meta pyopencl version "$v"
  if [[ $v != [0-9]* ]]; then skip_suite pyopencl "pyopencl does not import or sees no platform: $v"; return; fi
  say "pyopencl: $v (ICD $OCL_ICD)"
  if [[ ! -d $PEERS/pyopencl-tests ]]; then skip_suite pyopencl "$PEERS/pyopencl-tests missing"; return; fi
  for mode in "${MODES[@]}"; do
    local d=$WORK/pyopencl-$mode
    cp -r "$PEERS/pyopencl-tests" "$d"
    # PyOpenCL's binary cache per run (it locks its entries; two runs need not wait for each other)
    nflag "$W_PYOPENCL"
    words "$PYOPENCL_TESTS"
    run_pytest pyopencl "$mode" "$d" "$TESTS_END" "${OCL_ENV[@]}" XDG_CACHE_HOME="$WORK/cache/xdg-pyopencl-$mode" -- \
      "${XA[@]}" "${WORDS[@]}" &
    TEST_PIDS+=($!)
  done
}

start_pycuda() {
  local rc=1
  wait "$BUILD_PID"
  [[ -f $WORK/pycuda-build.rc ]] && rc=$(cat "$WORK/pycuda-build.rc")
  if [[ $rc != 0 ]]; then
    skip_suite pycuda "build failed (rc $rc): $(grep -iE 'error' "$RES/logs/pycuda-build.log" | tail -n 2 | tr '\n' ' ')"
    return
  fi
  local v
  v=$(PYTHONPATH=$PYSITE:$PYTHONPATH pyver 'import pycuda, pycuda.driver as d; d.init(); print(pycuda.VERSION_TEXT)')
  meta pycuda version "$v"
  if [[ $v != [0-9]* ]]; then
    skip_suite pycuda "built but 'import pycuda.driver' fails: $(PYTHONPATH=$PYSITE:$PYTHONPATH "$PY" -c 'import pycuda.driver' 2>&1 | tail -n 1)"
    return
  fi
  say "pycuda $v built"
  PYCUDA_OK=1
  if ! want pycuda || [[ -z $PYCUDA_TESTS ]]; then return; fi
  tar xzf "$SDIST" -C "$WORK/src" || { skip_suite pycuda "cannot unpack $SDIST"; return; }
  local src
  src=$(compgen -G "$WORK/src/pycuda-*/test" | head -n 1)
  for mode in "${MODES[@]}"; do
    local d=$WORK/pycuda-$mode
    mkdir -p "$d"
    cp "$src"/*.py "$d"/
    cp "$HERE/pycuda_conftest.py" "$d/conftest.py"
    nflag "$W_PYCUDA"
    words "$PYCUDA_TESTS"
    run_pytest pycuda "$mode" "$d" "$TESTS_END" PYTHONPATH="$PYSITE:$PYTHONPATH" \
      PEERS_PYCUDA_CACHE="$WORK/cache/pycuda-$mode" -- "${XA[@]}" "${WORDS[@]}" &
    TEST_PIDS+=($!)
  done
}

PYCUDA_OK=0
if ((HAVE_PYTEST)); then
  # the longest first
  want cupy && start_cupy
  want jax && start_jax
  want torch && start_torch
  want numba && start_numba
  want pyopencl && start_pyopencl
else
  for s in numba cupy torch jax pyopencl; do want "$s" && skip_suite "$s" "pytest is not importable"; done
  PYCUDA_TESTS=
fi
[[ -n $BUILD_PID ]] && start_pycuda
((${#TEST_PIDS[@]})) && wait "${TEST_PIDS[@]}"
say "phase B done"

# ---- phase C: PyCUDA's gpuarray loop, interleaved -----------------------------
pycuda_rounds() {
  local out=$RES/loops/pycuda.txt r i m t1 rstart longest=0 need warm=0
  local modes=(nopool)
  ((GP_OK)) && modes+=(gpupool gpupool-immediate)
  modes+=(dmpool)
  local largs
  words "${PEERS_PYCUDA_LOOP_ARGS:-}"  # more pycuda_loop.py arguments
  largs=("${WORDS[@]}")
  local penv=(PYTHONPATH="$PYSITE:$PYTHONPATH" PYCUDA_CACHE_DIR="$WORK/cache/pycuda-loop")
  mkdir -p "$WORK/cache/pycuda-loop"  # PyCUDA writes its cache there but does not make it
  for ((r = 0; r <= PYCUDA_ROUNDS; r++)); do  # round 0 warms the compile cache, untimed
    # a round is judged by the longest so far; the first by three warm-up runs
    need=$longest
    ((r == 1)) && need=$((3 * warm))
    if ((r > 0 && $(left) - FINAL < need + 5)); then
      say "pycuda loop: stopping after $((r - 1)) rounds (out of time)"
      break
    fi
    rstart=$SECONDS
    for ((i = 0; i < ${#modes[@]}; i++)); do
      m=${modes[$(((i + r) % ${#modes[@]}))]}
      ((r == 0)) && m=nopool
      if [[ $m == gpupool* ]]; then mode_env gpupool pycuda_loop; else mode_env plain x; fi
      [[ $m == gpupool-immediate ]] && MENV+=(GPUPOOL_REUSE=immediate)
      t1=$SECONDS
      {
        echo "=== round $r mode $m"
        timeout -k 5 60 env -u LD_PRELOAD "${penv[@]}" "${MENV[@]}" "$PY" "$HERE/pycuda_loop.py" \
          --mode "$m" --round "$r" "${largs[@]}" 2>&1 </dev/null
        echo "=== rc $? in $((SECONDS - t1))s"
      } >>"$RES/logs/pycuda_loop.log"
      ((r == 0)) && break
    done
    if ((r == 0)); then
      warm=$((SECONDS - rstart))
    elif ((SECONDS - rstart > longest)); then
      longest=$((SECONDS - rstart))
    fi
  done
  grep -h '^RESULT' "$RES/logs/pycuda_loop.log" | grep -v ' round=0 ' >"$out"
  say "pycuda loop: $(wc -l <"$out") timed runs"
}
if ((PYCUDA_OK && LOOPS && !DRY)); then pycuda_rounds; fi

# ---- phase D: compare, and pack ----------------------------------------------
say "comparing"
ct=$(($(left) - 5))
((ct < 10)) && ct=10
timeout "$ct" "$PY" "$HERE/compare.py" "$RES" --out "$OUTDIR" >"$OUTDIR/peers-summary.txt" 2>&1 ||
  echo "compare.py failed (rc $?)" >>"$OUTDIR/peers-summary.txt"
cp "$OUTDIR/peers-summary.txt" "$RES/"
cp "$LOG" "$RES/" 2>/dev/null
# compare.py has read everything: cut runaway files (stats, logs) so the tarball stays small
find "$RES" -type f -size +4M -exec truncate -s 4M {} + 2>/dev/null
tar czf "$OUTDIR/peers-results.tar.gz" -C "$WORK" results 2>>"$LOG"
say "done: $(cd "$OUTDIR" && echo *) ($(du -sh "$OUTDIR/peers-results.tar.gz" | cut -f1) tarball)"
cat "$OUTDIR/peers-summary.txt"
exit 0
