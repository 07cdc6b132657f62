#!/usr/bin/env bash
# Run HERE (Debian bookworm, with network), not on the GPU machine: downloads
# the Debian packages that the GPU machine may lack into .debs/, which
# the harness's suite unpacks (dpkg -x) into a private prefix there. Headers are
# portable, and bookworm's ocl-icd loader (glibc 2.36) runs on the GPU
# machine's glibc 2.39. .debs/ is kept out of git through .git/info/exclude;
# name it in the device call's `carry` list.
# Also fetches PyOpenCL's wheels for the GPU machine's Python 3.12 into .whl/
# (carry it too): the suite then runs the PyOpenCL workload on NVIDIA.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

PKGS=(
  libfmt-dev                          # the log lines' formatting, compiled into the library
  libgtest-dev libgmock-dev           # the CI tests (GTestTargets.cmake names gmock too)
  libbenchmark-dev libbenchmark1debian  # tests/bench, where built
  ocl-icd-libopencl1 ocl-icd-opencl-dev  # the OpenCL ICD loader (layers) and its .so
  opencl-c-headers opencl-clhpp-headers  # CL/cl.h, CL/cl_layer.h
)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.debs/' "$exclude" 2>/dev/null || echo '/.debs/' >>"$exclude"
grep -qxF '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

rm -rf .debs
mkdir -p .debs
(cd .debs && apt-get download "${PKGS[@]}")
ls -l .debs
echo "total: $(du -sh .debs | cut -f1) in $(ls .debs/*.deb | wc -l) packages"

# PyOpenCL and what it needs beyond the GPU machine's packages (numpy and
# typing_extensions are there); its wheel bundles its own ocl-icd loader.
rm -rf .whl
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl pyopencl pytools platformdirs siphash24 mako markupsafe
ls -l .whl
echo "wheels: $(du -sh .whl | cut -f1) in $(ls .whl/*.whl | wc -l) files"
