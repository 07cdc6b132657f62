/* Preloaded beside gpupool: unshare(CLONE_FILES) is refused with EPERM, as
 * a seccomp filter (a container runtime's) may refuse it. gpupool then has
 * no descriptor table of its own and works among the program's (its
 * fallback, sys/io.hpp); run_host.py's fallback.* checks run it so. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>

int unshare(int flags) {
  if (flags & CLONE_FILES) {
    errno = EPERM;
    return -1;
  }
  int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "unshare");
  if (!real) {
    errno = ENOSYS;
    return -1;
  }
  return real(flags);
}
