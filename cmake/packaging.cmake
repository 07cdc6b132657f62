# A Debian package of what `cmake --install` installs (the launcher and the
# library): `cpack -G DEB` in a build directory. Build it Release, without
# the tests (they install nothing, but it saves the time):
#   cmake -B build-pkg -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
#     -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_BUILD_BENCHMARKS=OFF
#   cmake --build build-pkg && (cd build-pkg && cpack -G DEB)
# With the /usr prefix at configure time the library goes to Debian's
# multiarch directory (/usr/lib/x86_64-linux-gnu), which the launcher, built
# knowing it, looks in; any other prefix puts it in /usr/lib, which it also
# looks in.
set(GPUPOOL_PACKAGE_CONTACT "gpupool maintainers <maintainers@users.noreply.a-seed-453d7d10.example>"
  CACHE STRING "Maintainer named in the Debian package")
set(CPACK_PACKAGE_NAME gpupool)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT ${GPUPOOL_PACKAGE_CONTACT})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "GPU memory pool for unmodified CUDA and OpenCL programs")
# Lines of the control file's long description: under 80 columns.
set(CPACK_PACKAGE_DESCRIPTION [=[
gpupool serves every cuMemAlloc, cuMemHostAlloc and clCreateBuffer of a
program (directly, through cudaMalloc, PyTorch, CuPy or PyOpenCL) from one
in-process binned pool, without changing the program: run it with
`gpupool run -- PROGRAM`, or put libgpupool.so in LD_PRELOAD. It links
neither libcuda nor libOpenCL: the driver is the program's own.]=])
set(CPACK_GENERATOR DEB)
set(CPACK_STRIP_FILES ON)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # gpupool_0.1.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Depends: what the launcher and the library link (libc, libstdc++ for the
# launcher), read from the binaries by dpkg-shlibdeps; the GPU driver and
# the OpenCL loader are not dependencies, they are the program's.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# elfutils' libdw is loaded with dlopen, where installed, to name the
# source lines of allocation sites: recommended, not needed.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "libdw1")
# Packed relative relocations (see the gpupool target) need the loader of
# glibc 2.36 (GLIBC_ABI_DT_RELR), which dpkg-shlibdeps does not count.
if(GPUPOOL_HAVE_RELR)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6 (>= 2.36)")
endif()
include(CPack)
