#!/usr/bin/env bash
# Run HERE (Debian bookworm, with network), not on the GPU machine: downloads
# the Debian packages that the GPU machine may lack into .debs/, which
# scripts/h100.sh unpacks (dpkg -x) into a private prefix there. Headers are
# portable, and bookworm's ocl-icd loader (glibc 2.36) runs on the GPU
# machine's glibc 2.39. .debs/ is kept out of git through .git/info/exclude;
# name it in the device call's `carry` list.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

PKGS=(
  libspdlog-dev libfmt-dev            # header-only logging inside the library
  libgtest-dev libgmock-dev           # the CI tests (GTestTargets.cmake names gmock too)
  libbenchmark-dev libbenchmark1debian  # tests/bench, where built
  ocl-icd-libopencl1 ocl-icd-opencl-dev  # the OpenCL ICD loader (layers) and its .so
  opencl-c-headers opencl-clhpp-headers  # CL/cl.h, CL/cl_layer.h
)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.debs/' "$exclude" 2>/dev/null || echo '/.debs/' >>"$exclude"

rm -rf .debs
mkdir -p .debs
(cd .debs && apt-get download "${PKGS[@]}")
ls -l .debs
echo "total: $(du -sh .debs | cut -f1) in $(ls .debs/*.deb | wc -l) packages"
