# cuda.h: the driver API's types and prototypes, all that gpupool takes from
# CUDA (it finds libcuda's entry points at run time). So a machine with only
# NVIDIA's driver, or with no GPU, builds gpupool with this header alone. It
# must be CUDA 13's or later (the driver table names CUDA 13 entry points,
# cuCtxSynchronize_v2), from one of two places:
#   toolkit  a CUDA Toolkit: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda, or the
#            compiler's and CMake's default paths;
#   pip      NVIDIA's nvidia-cuda-runtime wheel (2.5 MB, nvidia/cu13/include)
#            in the Python environment that CMake finds.
# GPUPOOL_CUDA_HEADERS=any (the default) takes a toolkit's header if there is
# one of CUDA 13, else the wheel's. A wheel build (pyproject.toml) says pip,
# so a wheel is built from the header its build requirements pin, whatever
# the build machine has. -DCUDA_DRIVER_INCLUDE_DIR=DIR names the directory.
set(GPUPOOL_CUDA_HEADERS any CACHE STRING "Where cuda.h comes from: any (toolkit, else pip), toolkit or pip")
set_property(CACHE GPUPOOL_CUDA_HEADERS PROPERTY STRINGS any toolkit pip)
if(NOT GPUPOOL_CUDA_HEADERS MATCHES "^(any|toolkit|pip)$")
  message(FATAL_ERROR "GPUPOOL_CUDA_HEADERS=${GPUPOOL_CUDA_HEADERS}: expected any, toolkit or pip")
endif()
set(_gpupool_cuda_min 13000)

# CUDA_VERSION of DIR/cuda.h into VAR (13050 for 13.5), 0 if it has none.
function(_gpupool_cuda_version dir var)
  set(_v 0)
  if(EXISTS "${dir}/cuda.h")
    file(STRINGS "${dir}/cuda.h" _line REGEX "^#define CUDA_VERSION [0-9]+")
    string(REGEX MATCH "[0-9]+$" _v "${_line}")
  endif()
  if(NOT _v)
    set(_v 0)
  endif()
  set(${var} ${_v} PARENT_SCOPE)
endfunction()

# A directory found by an earlier configure is looked for again if it is gone
# (pip deletes its build environment after each build) or if the source asked
# for changed; a directory given with -D is the user's, checked below, never
# replaced.
if(CUDA_DRIVER_INCLUDE_DIR AND CUDA_DRIVER_INCLUDE_DIR STREQUAL "${_GPUPOOL_CUDA_FOUND}"
   AND (NOT EXISTS "${CUDA_DRIVER_INCLUDE_DIR}/cuda.h"
        OR NOT GPUPOOL_CUDA_HEADERS STREQUAL "${_GPUPOOL_CUDA_FOUND_FOR}"))
  unset(CUDA_DRIVER_INCLUDE_DIR CACHE)
endif()

if(NOT CUDA_DRIVER_INCLUDE_DIR)
  set(_gpupool_too_old "")
  if(GPUPOOL_CUDA_HEADERS MATCHES "^(any|toolkit)$")
    find_path(CUDA_DRIVER_INCLUDE_DIR cuda.h
      HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda PATH_SUFFIXES include
      DOC "Directory with cuda.h, the CUDA driver API header")
    _gpupool_cuda_version("${CUDA_DRIVER_INCLUDE_DIR}" _gpupool_v)
    if(CUDA_DRIVER_INCLUDE_DIR AND _gpupool_v LESS _gpupool_cuda_min)
      math(EXPR _gpupool_major "${_gpupool_v} / 1000")
      math(EXPR _gpupool_minor "${_gpupool_v} % 1000 / 10")
      set(_gpupool_too_old
        "(${CUDA_DRIVER_INCLUDE_DIR}/cuda.h is CUDA ${_gpupool_major}.${_gpupool_minor}, too old.)\n")
      unset(CUDA_DRIVER_INCLUDE_DIR CACHE)
    endif()
  endif()
  set(_gpupool_python "")
  if(NOT CUDA_DRIVER_INCLUDE_DIR AND GPUPOOL_CUDA_HEADERS MATCHES "^(any|pip)$")
    # The interpreter scikit-build-core runs (it passes Python3_EXECUTABLE),
    # else an active virtual environment's, else python3 on PATH. Every
    # sys.path entry is looked at, so a user's site-packages counts as much
    # as a virtual environment's.
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      set(_gpupool_python "${Python3_EXECUTABLE}")
      execute_process(
        COMMAND "${Python3_EXECUTABLE}" -c [=[
import os, sys
for p in sys.path:
    if p and os.path.isfile(os.path.join(p, "nvidia/cu13/include/cuda.h")):
        print(os.path.join(os.path.abspath(p), "nvidia/cu13/include"))
]=]
        OUTPUT_VARIABLE _gpupool_wheel_dirs OUTPUT_STRIP_TRAILING_WHITESPACE
        RESULT_VARIABLE _gpupool_rc)
      if(_gpupool_rc EQUAL 0 AND _gpupool_wheel_dirs)
        string(REPLACE "\n" ";" _gpupool_wheel_dirs "${_gpupool_wheel_dirs}")
        list(GET _gpupool_wheel_dirs 0 _gpupool_dir)
        set(CUDA_DRIVER_INCLUDE_DIR "${_gpupool_dir}" CACHE PATH
          "Directory with cuda.h, the CUDA driver API header" FORCE)
      endif()
    endif()
  endif()
  if(NOT CUDA_DRIVER_INCLUDE_DIR)
    set(_gpupool_how "")
    if(GPUPOOL_CUDA_HEADERS MATCHES "^(any|pip)$")
      if(_gpupool_python)
        set(_gpupool_where "the Python that CMake found, ${_gpupool_python} (or pass -DPython3_EXECUTABLE=...)")
      else()
        set(_gpupool_where "a Python environment (CMake found no Python 3: pass -DPython3_EXECUTABLE=...)")
      endif()
      list(APPEND _gpupool_how
        "python3 -m pip install nvidia-cuda-runtime   (CUDA 13, 2.5 MB)\n      into ${_gpupool_where}")
    endif()
    if(GPUPOOL_CUDA_HEADERS MATCHES "^(any|toolkit)$")
      list(APPEND _gpupool_how
        "install the CUDA 13 Toolkit in /usr/local/cuda, or set CUDA_HOME to where it is")
    endif()
    list(APPEND _gpupool_how "pass -DCUDA_DRIVER_INCLUDE_DIR=DIR, a directory with cuda.h")
    list(JOIN _gpupool_how "\n  or " _gpupool_how)
    message(FATAL_ERROR
      "cuda.h of CUDA 13, the CUDA driver API header, not found (GPUPOOL_CUDA_HEADERS=${GPUPOOL_CUDA_HEADERS}). "
      "gpupool needs only this header, not the CUDA Toolkit nor a GPU:\n${_gpupool_too_old}  ${_gpupool_how}")
  endif()
  set(_GPUPOOL_CUDA_FOUND "${CUDA_DRIVER_INCLUDE_DIR}" CACHE INTERNAL "")
  set(_GPUPOOL_CUDA_FOUND_FOR "${GPUPOOL_CUDA_HEADERS}" CACHE INTERNAL "")
endif()

if(NOT EXISTS "${CUDA_DRIVER_INCLUDE_DIR}/cuda.h")
  message(FATAL_ERROR "CUDA_DRIVER_INCLUDE_DIR=${CUDA_DRIVER_INCLUDE_DIR} has no cuda.h: "
    "name a directory with cuda.h, or leave it out to search")
endif()
_gpupool_cuda_version("${CUDA_DRIVER_INCLUDE_DIR}" _gpupool_v)
math(EXPR _gpupool_major "${_gpupool_v} / 1000")
math(EXPR _gpupool_minor "${_gpupool_v} % 1000 / 10")
if(_gpupool_v EQUAL 0)
  message(FATAL_ERROR "${CUDA_DRIVER_INCLUDE_DIR}/cuda.h defines no CUDA_VERSION: not the CUDA driver API header")
elseif(_gpupool_v LESS _gpupool_cuda_min)
  message(FATAL_ERROR "${CUDA_DRIVER_INCLUDE_DIR}/cuda.h is CUDA ${_gpupool_major}.${_gpupool_minor} "
    "(CUDA_VERSION ${_gpupool_v}); gpupool needs CUDA 13's driver API header or later: "
    "python3 -m pip install nvidia-cuda-runtime (CUDA 13), or a CUDA 13 Toolkit")
endif()
message(STATUS "gpupool: cuda.h from ${CUDA_DRIVER_INCLUDE_DIR} (CUDA ${_gpupool_major}.${_gpupool_minor})")
