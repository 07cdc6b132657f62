/* A program that makes no GPU call, run with libgpupool.so preloaded (and
 * the stats-at-exit and trace-level log switches on): loading must start no
 * thread and print nothing, since no intercepted call was made. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
  if (!strstr(getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "", "libgpupool")) {
    fprintf(stderr, "FAIL: libgpupool.so is not preloaded\n");
    return 1;
  }
  int threads = 0;
  DIR* d = opendir("/proc/self/task");
  for (struct dirent* e; d && (e = readdir(d));)
    if (e->d_name[0] != '.') ++threads;
  if (d) closedir(d);
  if (threads != 1) {
    fprintf(stderr, "FAIL: %d threads after loading gpupool, expected 1\n", threads);
    return 1;
  }
  printf("PASS: one thread\n");
  return 0;
}
