#!/usr/bin/env bash
# Run HERE (with network), not on the GPU machine: fills .peers/ (kept out of
# git through .git/info/exclude; name it in the device call's `carry`) with
# what scripts/peers/run.sh needs there and the machine lacks:
#   wheels/            PyCUDA's sdist (built there), PyOpenCL's wheel, and the
#                      cp312 manylinux wheels of their dependencies, pytest and
#                      pytest-xdist, cffi and filecheck (numba-cuda's tests import them),
#                      expecttest (torch.testing._internal imports it); run.sh
#                      installs only those the machine lacks
#   numba-wheels/      numba-cuda's run only, first on its PYTHONPATH: a numpy its
#                      release supports (the machine's numpy 2.5 removed np.row_stack,
#                      which numba-cuda 0.30.4 overloads: its commit fd35344b, after
#                      the release) and the pytest its test group names (>=8,<9)
#   pyopencl-tests/    PyOpenCL's test/ from the sdist of the wheel's version
#   cupy-tests/        CuPy's tests for memory, streams and core arrays, and the
#                      conftest.py and pyproject.toml (pytest settings) they use,
#                      at the tag of the machine's CuPy
#   numba-cuda-testing/ numba-cuda's testing/pytest.ini and conftest.py at the
#                      tag of the machine's numba-cuda (its tests ship in its wheel)
#   torch-tests/       PyTorch's test/test_cuda.py at the machine's torch's tag
#                      (torch.testing._internal, which it imports, is in the wheel)
#   jax-tests/         JAX's tests that allocate, its conftest.py and pyproject.toml
#                      (pytest settings), at the machine's jax's tag
#   SOURCES.txt        what came from where, with sha256 sums; torch-tests/SOURCE and
#                      jax-tests/SOURCE name the revision (run.sh puts it in the table)
# Versions: the GPU machine's CuPy, numba-cuda, torch and jax (KINDS.md); the newest
# PyCUDA and PyOpenCL unless PYCUDA_VERSION / PYOPENCL_VERSION say otherwise.
# CUPY_GIT / NUMBA_CUDA_GIT / JAX_GIT / TORCH_GIT: a clone or bare mirror to read
# instead of GitHub; JAX_REF / TORCH_REF: another revision where the mirror lacks
# the tag (JAX_REF_NOTE: why, for the table); TORCH_TEST_CUDA: a test_cuda.py file to take instead of TORCH_GIT's, with
# TORCH_TEST_CUDA_SOURCE saying where it came from (TORCH_GIT=none: no PyTorch suite).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
P=$ROOT/.peers
CUPY_VERSION=${CUPY_VERSION:-14.2.0}
NUMBA_CUDA_VERSION=${NUMBA_CUDA_VERSION:-0.30.4}
CUPY_GIT=${CUPY_GIT:-https://github.com/cupy/cupy.git}
NUMBA_CUDA_GIT=${NUMBA_CUDA_GIT:-https://github.com/NVIDIA/numba-cuda.git}
JAX_GIT=${JAX_GIT:-https://github.com/jax-ml/jax.git}
JAX_REF=${JAX_REF:-jax-v0.11.2}
TORCH_GIT=${TORCH_GIT:-https://github.com/pytorch/pytorch.git}
TORCH_REF=${TORCH_REF:-v2.11.0}
NUMBA_NUMPY=${NUMBA_NUMPY:-numpy==2.4.6}  # numba 0.68 (the machine's) takes numpy <2.6
PY=${PYTHON:-python3}
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform any)

exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.peers/' "$exclude" 2>/dev/null || echo '/.peers/' >>"$exclude"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$P"
mkdir -p "$P/wheels" "$P/numba-wheels" "$P/pyopencl-tests" "$P/cupy-tests" "$P/numba-cuda-testing" \
  "$P/torch-tests" "$P/jax-tests"

# --- wheels and the PyCUDA sdist (--no-binary pycuda only: :all: would build numpy too)
"$PY" -m pip download -q --no-deps --no-binary pycuda -d "$P/wheels" "pycuda${PYCUDA_VERSION:+==$PYCUDA_VERSION}"
"$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$P/wheels" \
  "pyopencl${PYOPENCL_VERSION:+==$PYOPENCL_VERSION}" pytools platformdirs mako markupsafe \
  typing_extensions siphash24 pytest pluggy iniconfig packaging pygments pytest-xdist execnet \
  cffi pycparser filecheck expecttest  # numba-cuda's test group: numba.cuda.testing imports filecheck
"$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$P/numba-wheels" "$NUMBA_NUMPY" 'pytest>=8,<9'

# every Requires-Dist (no extras, no old-Python markers) must be among the files
echo "Requires-Dist check:"
"$PY" - "$P/wheels" <<'EOF'
import glob, os, re, sys, tarfile, zipfile
d = sys.argv[1]
have = {re.split(r"[-]", os.path.basename(f))[0].lower().replace("_", "-") for f in os.listdir(d)}
bad = 0
for w in sorted(glob.glob(os.path.join(d, "*.whl"))):
    meta = next(n for n in zipfile.ZipFile(w).namelist() if n.endswith(".dist-info/METADATA"))
    for line in zipfile.ZipFile(w).read(meta).decode().splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req or "python_version <" in req or 'sys_platform == "win32"' in req:
            continue
        name = re.split(r"[ <>=!;\[(]", req)[0].lower().replace("_", "-")
        ok = name in have or name == "numpy"   # numpy: the GPU machine has it
        bad += not ok
        print(f"  {'ok ' if ok else 'MISSING'} {os.path.basename(w).split('-')[0]} -> {req}")
sys.exit(1 if bad else 0)
EOF

# --- PyOpenCL's tests at its wheel's version (the sdist holds test/)
pv=$(basename "$(compgen -G "$P/wheels/pyopencl-*.whl" | head -n 1)" | cut -d- -f2)
"$PY" -m pip download -q --no-deps --no-binary pyopencl -d "$tmp" "pyopencl==$pv"
tar xzf "$tmp/pyopencl-$pv.tar.gz" -C "$tmp"
cp -r "$tmp/pyopencl-$pv/test/." "$P/pyopencl-tests/"
cat >"$P/pyopencl-tests/pytest.ini" <<EOF
# From PyOpenCL $pv's pyproject.toml [tool.pytest.ini_options].
[pytest]
markers =
    bitonic: tests involving bitonic sort
EOF

# --- files of a git repository at a tag: git_files URL_OR_DIR TAG DEST PATH...
git_files() {
  local src=$1 tag=$2 dest=$3
  shift 3
  if [[ -d $src ]]; then
    git -C "$src" archive "$tag" "$@" | tar x -C "$dest"
  else
    local c
    c=$tmp/clone-$(basename "$src" .git)
    if [[ ! -d $c ]]; then  # a tag: a shallow clone; a commit: fetched alone
      git init -q "$c" && git -C "$c" fetch -q --depth 1 "$src" "$tag" && git -C "$c" tag -f "$tag" FETCH_HEAD >/dev/null
    fi
    git -C "$c" archive "$tag" "$@" | tar x -C "$dest"
  fi
  local rev
  rev=$(git -C "${c:-$src}" rev-parse "$tag^{commit}" 2>/dev/null || echo '?')
  [[ $rev == "$tag" ]] && tag=commit
  echo "$tag $rev ($(git -C "${c:-$src}" log -1 --format=%cs "$rev" 2>/dev/null))" >"$tmp/rev-$(basename "$dest")"
}

# CuPy: memory, streams, pinned memory, device and driver, and core arrays
CT=tests/cupy_tests
git_files "$CUPY_GIT" "v$CUPY_VERSION" "$P/cupy-tests" pyproject.toml tests/conftest.py \
  $CT/__init__.py $CT/cuda_tests/__init__.py $CT/core_tests/__init__.py \
  $CT/cuda_tests/test_memory.py $CT/cuda_tests/test_stream.py $CT/cuda_tests/test_pinned_memory.py \
  $CT/cuda_tests/test_device.py $CT/cuda_tests/test_driver.py $CT/cuda_tests/test_memory_hook.py \
  $CT/core_tests/test_ndarray.py $CT/core_tests/test_ndarray_copy_and_view.py \
  $CT/core_tests/test_elementwise.py $CT/core_tests/test_dlpack.py $CT/core_tests/test_ndarray_get.py \
  $CT/core_tests/test_ndarray_cuda_array_interface.py $CT/core_tests/test_multithreading.py \
  $CT/core_tests/test_ndarray_owndata.py
# numba-cuda: how its CI runs its tests with pytest
git_files "$NUMBA_CUDA_GIT" "v$NUMBA_CUDA_VERSION" "$tmp" testing/pytest.ini testing/conftest.py
cp "$tmp"/testing/pytest.ini "$tmp"/testing/conftest.py "$P/numba-cuda-testing/"
mv "$tmp/rev-$(basename "$tmp")" "$tmp/rev-numba"

# JAX: the tests that allocate (run.sh's selection) and its pytest settings
git_files "$JAX_GIT" "$JAX_REF" "$P/jax-tests" pyproject.toml conftest.py tests/memories_test.py \
  tests/array_test.py tests/multi_device_test.py tests/transfer_guard_test.py tests/api_test.py
echo "JAX's tests at $(cat "$tmp/rev-jax-tests")${JAX_REF_NOTE:+, $JAX_REF_NOTE}" >"$P/jax-tests/SOURCE"

# PyTorch: test/test_cuda.py
if [[ -n ${TORCH_TEST_CUDA:-} ]]; then
  mkdir -p "$P/torch-tests/test"
  cp "$TORCH_TEST_CUDA" "$P/torch-tests/test/test_cuda.py"
  echo "PyTorch's test/test_cuda.py: ${TORCH_TEST_CUDA_SOURCE:-$TORCH_TEST_CUDA}" >"$P/torch-tests/SOURCE"
elif [[ $TORCH_GIT != none ]]; then
  git_files "$TORCH_GIT" "$TORCH_REF" "$P/torch-tests" test/test_cuda.py
  echo "PyTorch's test/test_cuda.py at $(cat "$tmp/rev-torch-tests")" >"$P/torch-tests/SOURCE"
fi

{
  echo "# .peers/: made by scripts/peers/fetch.sh on $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "pyopencl-tests/: test/ of the pyopencl-$pv sdist (PyPI)"
  echo "cupy-tests/: $CUPY_GIT at $(cat "$tmp/rev-cupy-tests")"
  echo "numba-cuda-testing/: $NUMBA_CUDA_GIT testing/ at $(cat "$tmp/rev-numba")"
  echo "jax-tests/: $JAX_GIT; $(cat "$P/jax-tests/SOURCE")"
  echo "torch-tests/: $(cat "$P/torch-tests/SOURCE")"
  echo "wheels/ and numba-wheels/ (PyPI):"
  (cd "$P" && sha256sum -- wheels/* numba-wheels/*)
} >"$P/SOURCES.txt"
cat "$P/SOURCES.txt"
echo "total: $(du -sh "$P" | cut -f1)"
