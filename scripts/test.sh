#!/usr/bin/env bash
# Build gpupool and run its tests. README's test command.
#   scripts/test.sh                 release build in build/, all tests
#   scripts/test.sh --sanitizers    also ASan+UBSan and TSan builds (CI)
#   scripts/test.sh --fuzz          also a 30-second fuzz run of the config parser (CI; clang)
#   scripts/test.sh --package       also the wheel and the Debian package, installed and run
#                                   (CI; scripts/package-check.sh, in build-wheel/)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
sanitizers=0 fuzz=0 package=0
for a in "$@"; do
  case "$a" in
    --sanitizers) sanitizers=1 ;;
    --fuzz) fuzz=1 ;;
    --package) package=1 ;;
    --all) sanitizers=1 fuzz=1 package=1 ;;
    *) echo "usage: $0 [--sanitizers] [--fuzz] [--package] [--all]" >&2; exit 2 ;;
  esac
done

step() { printf '\n== %s\n' "$*"; }

step "build (build/)"
cmake -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
step "tests"
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 300

if [ "$package" = 1 ]; then
  # The wheel is built anew in build-wheel/ (about two minutes on two cores);
  # the Debian package comes from build/, just built and tested.
  step "packages: wheel and .deb, installed and run (build-wheel/)"
  scripts/package-check.sh --deb build
fi

if [ "$sanitizers" = 1 ]; then
  step "AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)"
  cmake -B build-asan -DCMAKE_BUILD_TYPE=Debug -DGPUPOOL_SANITIZE=address,undefined -DGPUPOOL_WERROR=ON \
    -DGPUPOOL_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  # Leak checks off: gpupool keeps its process-wide state until the process
  # ends on purpose (hooks may run during exit), and the Python tests' own
  # allocations are not ours to judge.
  ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" --timeout 600 -LE python

  step "ThreadSanitizer (build-tsan/)"
  cmake -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DGPUPOOL_SANITIZE=thread -DGPUPOOL_WERROR=ON \
    -DGPUPOOL_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build-tsan -j"$jobs"
  # -LE variant: the CUDA scenarios repeated without gpupool or through
  # another way of finding the hooks (tests/cuda/CMakeLists.txt), half of
  # this stage's time for no new interleaving.
  # die_after_fork=0: a forked child starts its own control thread, which
  # ThreadSanitizer cannot follow by default.
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$PWD/tests/tsan.supp \
    ctest --test-dir build-tsan --output-on-failure -j"$jobs" --timeout 600 -LE 'python|variant'
fi

if [ "$fuzz" = 1 ]; then
  step "fuzz smoke run (build-fuzz/)"
  CC=clang CXX=clang++ cmake -B build-fuzz -DGPUPOOL_FUZZ=ON -DGPUPOOL_BUILD_TESTS=ON \
    -DGPUPOOL_BUILD_BENCHMARKS=OFF >/dev/null
  cmake --build build-fuzz -j"$jobs" --target config_fuzz
  mkdir -p build-fuzz/corpus
  build-fuzz/tests/fuzz/config_fuzz -max_total_time=30 -print_final_stats=1 \
    -dict=tests/fuzz/config.dict build-fuzz/corpus tests/fuzz/corpus
fi
