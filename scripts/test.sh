#!/usr/bin/env bash
# Build gpupool and run its tests. README's test command.
#   scripts/test.sh                 release build in build/, all tests
#   scripts/test.sh --package       also the Debian package and the wheel, made from
#                                   build/, installed and run (CI; scripts/package-check.sh)
#   scripts/test.sh --sanitizers    also ASan+UBSan (build-asan/, made with clang-19: every
#                                   test but the Python ones, -Wthread-safety -Werror, and a
#                                   30-second fuzz run of the config parser) and TSan
#                                   (build-tsan/: the tests with several threads: labels
#                                   shim and threads) (CI)
#   scripts/test.sh --all           all of them (CI: .ci/run)
# Each stage ends with its time, wall and CPU (CI's machine has two cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
sanitizers=0 package=0
for a in "$@"; do
  case "$a" in
    --sanitizers) sanitizers=1 ;;
    --package) package=1 ;;
    --all) sanitizers=1 package=1 ;;
    *) echo "usage: $0 [--package] [--sanitizers] [--all]" >&2; exit 2 ;;
  esac
done

stage="" stage_t0=0 stage_cpu0=0 cpu=0
times_file=$(mktemp)
# cpu: the CPU seconds used so far by this script's finished children
# (`times` in this shell: a subshell's would count none).
cpu_now() {
  times >"$times_file"
  cpu=$(awk 'NR == 2 { gsub(/[ms]/, " "); printf "%d", $1 * 60 + $2 + $3 * 60 + $4 }' "$times_file")
}
stage_end() {
  [ -n "$stage" ] || return 0
  cpu_now
  printf '== %s: %d s, %d s CPU\n' "$stage" $((SECONDS - stage_t0)) $((cpu - stage_cpu0))
  stage=""
}
step() {
  stage_end
  stage=$*
  cpu_now
  stage_t0=$SECONDS stage_cpu0=$cpu
  printf '\n== %s\n' "$*"
}
# At an early exit, a build still running beside the tests goes too. The
# script's own status is kept.
on_exit() {
  local rc=$?
  stage_end
  rm -f "$times_file"
  if [ "${bg_pid:-0}" != 0 ]; then
    pkill -P "$bg_pid" 2>/dev/null
    kill "$bg_pid" 2>/dev/null
  fi
  exit "$rc"
}
trap on_exit EXIT

# A new build directory uses Ninja (scripts/package-check.sh reads its
# record of the headers each object read); an existing one keeps its
# generator.
generator() { [ -f "$1/CMakeCache.txt" ] || echo "-GNinja"; }

# The builds after the first: each is made while the stage before it runs
# its tests (those mostly wait on processes, sockets and deadlines: CI's
# TSan stage used 1.2 of its 2 cores), at the lowest priority, so the tests
# get the CPU whenever they want it. One build at a time, in this order;
# its output goes to build-*.log, printed if it fails.
# Each file compiled alone (GPUPOOL_UNITY_BUILD off): a file that lacks an
# include the release build's unit gave it fails here.
sanitizer_build=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1
  -DGPUPOOL_WERROR=ON -DGPUPOOL_BUILD_BENCHMARKS=OFF -DGPUPOOL_UNITY_BUILD=OFF)
# The ASan build is clang's: besides the sanitizers, clang's thread-safety
# analysis of the lock annotations (core/thread_safety.hpp: -Wthread-safety,
# an error here) and the libFuzzer target; clang also compiles it in 40%
# less time than GCC. Clang 19, not Debian 12's default 14: AddressSanitizer
# took no lock of its allocator across fork() before LLVM 18 (llvm-project
# pull 75290), so a child forked while another thread was inside malloc or
# free, or still starting (its runtime frees as it starts), hung at its
# first allocation: host.cuda.fork.files in CI, gpupool's threads starting
# while the program forked; 10 children of 2,400 under load with clang 14,
# none of 2,400 with clang 19.
configure_asan() {
  cmake -B build-asan $(generator build-asan) "${sanitizer_build[@]}" \
    -DCMAKE_C_COMPILER=clang-19 -DCMAKE_CXX_COMPILER=clang++-19 \
    -DGPUPOOL_SANITIZE=address,undefined -DGPUPOOL_FUZZ=ON
  cmake --build build-asan -j"$jobs"
}
configure_tsan() {
  cmake -B build-tsan $(generator build-tsan) "${sanitizer_build[@]}" -DGPUPOOL_SANITIZE=thread
  cmake --build build-tsan -j"$jobs"
}
queue=()
[ "$sanitizers" = 0 ] || queue+=(asan tsan)
bg_name="" bg_pid=0 bg_t0=0
bg_start() {  # the next build of the queue, if any
  [ ${#queue[@]} -gt 0 ] || return 0
  bg_name=${queue[0]}
  queue=("${queue[@]:1}")
  bg_t0=$SECONDS
  nice -n 19 bash -c "$(declare -f generator "configure_$bg_name"); $(declare -p sanitizer_build jobs);
    configure_$bg_name" >"build-$bg_name.log" 2>&1 &
  bg_pid=$!
}
bg_wait() {  # the build started last, finished
  local rc=0
  wait "$bg_pid" || rc=$?
  if [ "$rc" != 0 ]; then
    tail -n 60 "build-$bg_name.log"
    echo "build of build-$bg_name/ failed (rc $rc): build-$bg_name.log" >&2
    exit "$rc"
  fi
  bg_pid=0
  printf '   (build-%s/ built beside the tests before it in %d s: build-%s.log)\n' \
    "$bg_name" $((SECONDS - bg_t0)) "$bg_name"
}

step "include map: no cycle between rooms, launcher/ includes nothing of interpose/"
python3 scripts/include_map.py --check

step "format: every C and C++ file as clang-format-14 writes it (scripts/format.sh)"
scripts/format.sh

step "build (build/)"
# The packages are made from build/ (scripts/package-check.sh): the wheel's
# cuda.h is the nvidia-cuda-runtime wheel's, never a toolkit's. SKBUILD*:
# what the wheel's configure left (where to install) is forgotten.
package_headers=()
[ "$package" = 0 ] || package_headers=(-DGPUPOOL_CUDA_HEADERS=pip)
cmake -B build $(generator build) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_WERROR=ON \
  "${package_headers[@]}" -U 'SKBUILD*' >/dev/null
cmake --build build -j"$jobs"
bg_start
step "tests (build/)"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 300

if [ "$package" = 1 ]; then
  step "packages: the .deb and the wheel from build/, installed and run (build-wheel/)"
  scripts/package-check.sh build
fi

if [ "$sanitizers" = 1 ]; then
  # Debug builds (the lock-rank checks), without benchmarks, with line
  # tables only (-g1): what the sanitizers' reports need, a fifth less
  # compile time than full debug information. Their tests run one more at
  # a time than cores: they mostly wait.
  san_jobs=$((jobs + 1))
  step "AddressSanitizer + UndefinedBehaviorSanitizer: tests (build-asan/)"
  bg_wait
  bg_start
  # Leak checks off: gpupool keeps its process-wide state until the process
  # ends on purpose (hooks may run during exit), and the Python tests' own
  # allocations are not ours to judge. -LE without_gpupool: the CUDA
  # scenarios on the stand-in driver alone (they check the stand-in);
  # -LE variant: the same scenarios through other lookups of the same
  # hooks (tests/cuda/CMakeLists.txt), which the release stage runs;
  # -LE fuzz: the fuzzer's short ctest run, which the 30-second run below
  # covers.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$san_jobs" --timeout 600 \
      -LE 'python|without_gpupool|variant|fuzz'

  step "fuzz: 30 seconds of the config parser (build-asan/)"
  mkdir -p build-asan/corpus
  build-asan/tests/fuzz/config_fuzz -max_total_time=30 -print_final_stats=1 \
    -dict=tests/fuzz/config.dict build-asan/corpus tests/fuzz/corpus

  step "ThreadSanitizer: tests (build-tsan/)"
  bg_wait
  bg_start
  # -L 'shim|threads': programs under gpupool (its control and files
  # threads run beside the program's) and the unit tests with threads; the
  # other unit tests run one thread, where ThreadSanitizer finds nothing
  # (they run in the stages above). -LE variant: the CUDA scenarios repeated
  # without gpupool or through another way of finding the hooks
  # (tests/cuda/CMakeLists.txt), half of this stage's time for no new
  # interleaving; -LE one_thread: the heaviest scenarios of one program
  # thread (tests/cuda/CMakeLists.txt), which the stages above run.
  # die_after_fork=0: a forked child starts its own control thread, which
  # ThreadSanitizer cannot follow by default. detect_deadlocks=0: its
  # detector holds at most 64 locks a thread, and fork() takes every lock of
  # gpupool's at once (more than 64 with the shards: "CHECK failed:
  # sanitizer_deadlock_detector.h:67" in the fork tests). The order of
  # gpupool's locks is checked in this Debug build by the lock ranks
  # (core/lock_rank.hpp), which abort on the first lock taken out of order.
  TSAN_OPTIONS=halt_on_error=1:detect_deadlocks=0:die_after_fork=0:suppressions=$PWD/tests/tsan.supp \
    ctest --test-dir build-tsan --output-on-failure -j"$san_jobs" --timeout 600 -L 'shim|threads' \
      -LE 'python|variant|one_thread'
fi
