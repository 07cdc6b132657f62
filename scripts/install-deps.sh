#!/usr/bin/env bash
# Install what gpupool needs to build and test on Debian 12 (bookworm).
# The CUDA driver API headers come from the CUDA Toolkit (/usr/local/cuda);
# gpupool never links libcuda or libOpenCL.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
sudo_=""
[ "$(id -u)" = 0 ] || sudo_=sudo
$sudo_ apt-get update -qq
$sudo_ apt-get install -y -qq --no-install-recommends \
  build-essential cmake clang libclang-rt-14-dev \
  libspdlog-dev libfmt-dev googletest libgtest-dev libbenchmark-dev \
  pocl-opencl-icd ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-headers clinfo patchelf \
  python3-pyopencl python3-numpy >/dev/null
if [ ! -f /usr/local/cuda/include/cuda.h ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "install-deps.sh: CUDA Toolkit headers not found (/usr/local/cuda/include/cuda.h); set CUDA_HOME" >&2
  exit 1
fi
echo "install-deps.sh: dependencies installed"
