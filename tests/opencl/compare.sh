#!/bin/sh
# Run an OpenCL test program twice, without gpupool and under it, and require
# both runs to pass and to print the same "R ..." result lines.
#   compare.sh PRELOAD PROGRAM [ARGS...]
# Every other environment variable (OPENCL_LAYERS, COUNT_LAYER, GPUPOOL_*)
# is kept for both runs; GPUPOOL_* only matters under the shim.
set -u
preload=$1
shift
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
env -u LD_PRELOAD "$@" >"$tmp/plain" 2>"$tmp/plain.err"
rc_plain=$?
LD_PRELOAD="$preload" "$@" >"$tmp/shim" 2>"$tmp/shim.err"
rc_shim=$?
cat "$tmp/plain.err" "$tmp/shim.err" >&2
if [ "$rc_plain" = 77 ] || [ "$rc_shim" = 77 ]; then
  echo "SKIP: program skipped" >&2
  exit 77
fi
if [ "$rc_plain" != 0 ] || [ "$rc_shim" != 0 ]; then
  echo "FAIL: exit status without gpupool $rc_plain, under gpupool $rc_shim" >&2
  exit 1
fi
grep '^R ' "$tmp/plain" >"$tmp/plain.r"
grep '^R ' "$tmp/shim" >"$tmp/shim.r"
if ! [ -s "$tmp/plain.r" ]; then
  echo "FAIL: no result lines" >&2
  exit 1
fi
if ! diff -u "$tmp/plain.r" "$tmp/shim.r" >&2; then
  echo "FAIL: results differ under gpupool" >&2
  exit 1
fi
echo "PASS: $(wc -l <"$tmp/plain.r") result lines identical with and without gpupool" >&2
exit 0
