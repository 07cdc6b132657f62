#!/usr/bin/env bash
# Install what gpupool needs to build and test on Debian 12 (bookworm).
# gpupool never links libcuda or libOpenCL; of CUDA it needs only cuda.h, the
# driver API header: the CUDA Toolkit's (/usr/local/cuda, CUDA_HOME) where
# there is one, else NVIDIA's nvidia-cuda-runtime wheel (2.5 MB), which this
# script installs (cmake/cuda-header.cmake looks in both; the packages of
# scripts/test.sh --package are built with the wheel's, toolkit or not).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
sudo_=""
[ "$(id -u)" = 0 ] || sudo_=sudo
$sudo_ apt-get update -qq
$sudo_ apt-get install -y -qq --no-install-recommends \
  build-essential cmake clang-19 libclang-rt-19-dev clang-format-14 \
  libfmt-dev googletest libgtest-dev libbenchmark-dev libdw-dev \
  pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo patchelf \
  python3-pyopencl python3-numpy python3-pytest \
  python3-pip python3-venv ninja-build chromium prometheus-node-exporter >/dev/null
# (clang-19: the AddressSanitizer build's compiler, scripts/test.sh, whose
# runtime keeps its allocator consistent across fork(), as Debian 12's
# default clang 14 does not; libdw-dev: elfutils' headers, so allocation sites name source lines; the
# library itself, libdw1, is loaded at run time where installed. pip and
# venv: the wheel and its install, scripts/package-check.sh; Ninja:
# its record of which headers each object was compiled from; Chromium: the
# test that draws `gpupool report`'s page in a real browser; pytest:
# PyOpenCL's own suite, below; node_exporter: host.cuda.procs.node_exporter
# runs its own, on a free port, so the service the package starts where
# systemd runs is stopped.)
if command -v systemctl >/dev/null && systemctl is-active -q prometheus-node-exporter 2>/dev/null; then
  $sudo_ systemctl disable --now prometheus-node-exporter >/dev/null 2>&1 || true
fi
if ! python3 -c 'import os, sys; sys.exit(not any(os.path.isfile(os.path.join(p, "nvidia/cu13/include/cuda.h")) for p in sys.path if p))'; then
  # --user puts it in ~/.local, where python3 (and so CMake) finds it;
  # Debian's python3 refuses --user installs unless told
  # --break-system-packages, which here breaks nothing: the package has no
  # dependencies and replaces no Debian package.
  echo "install-deps.sh: installing cuda.h from NVIDIA's nvidia-cuda-runtime wheel (pip --user)"
  python3 -m pip install -q --user --break-system-packages 'nvidia-cuda-runtime>=13.0,<14'
fi
# PyOpenCL's own test suite, of the version Debian installed (ctest
# peers.pyopencl_suite runs it on PoCL without and with gpupool): the test/
# folder of its sdist from PyPI, into build-peers/ (ignored by git; the project
# copies no other project's code). --no-build-isolation: pip prepares the
# sdist's metadata with Debian's setuptools instead of building its build
# requirements (numpy among them) from source (9 minutes here). Without
# PyPI the test reports SKIP.
peers="$(cd "$(dirname "$0")/.." && pwd)/build-peers"
ver=$(/usr/bin/python3 -c 'import pyopencl; print(pyopencl.VERSION_TEXT)' 2>/dev/null) || ver=
if [ -n "$ver" ] && [ ! -d "$peers/pyopencl-$ver/test" ]; then
  dl=$(mktemp -d)
  if /usr/bin/python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation \
       -d "$dl" "pyopencl==$ver" &&
     mkdir -p "$peers" && tar -xzf "$dl"/pyopencl-*.tar.gz -C "$peers" "pyopencl-$ver/test"; then
    echo "install-deps.sh: PyOpenCL $ver's tests in $peers/pyopencl-$ver/test"
  else
    echo "install-deps.sh: WARNING: could not download PyOpenCL $ver's sdist: peers.pyopencl_suite will SKIP" >&2
  fi
  rm -rf "$dl"
fi
echo "install-deps.sh: dependencies installed"
