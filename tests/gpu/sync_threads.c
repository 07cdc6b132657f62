/* N threads calling cuCtxSynchronize on an idle context at once, without
   gpupool: their rate together against one thread's (the driver serializes
   them: docs/memory.md).
     cc -O2 -o sync_threads tests/gpu/sync_threads.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
   -lpthread Argument: synchronizations per thread (default 50000). */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static CUcontext ctx;
static long k;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}
static void* work(void* a) {
  (void)a;
  cuCtxSetCurrent(ctx);
  for (long i = 0; i < k; i++) cuCtxSynchronize();
  return NULL;
}
int main(int argc, char** argv) {
  k = argc > 1 ? atol(argv[1]) : 50000;
  CUdevice d;
  cuInit(0);
  cuDeviceGet(&d, 0);
  cuDevicePrimaryCtxRetain(&ctx, d);
  cuCtxSetCurrent(ctx);
  work(NULL);
  int ns[] = {1, 2, 4, 8, 16};
  for (int r = 0; r < 3; r++)
    for (int j = 0; j < 5; j++) {
      int n = ns[j];
      pthread_t t[16];
      double t0 = now();
      for (int i = 0; i < n; i++) pthread_create(&t[i], 0, work, NULL);
      for (int i = 0; i < n; i++) pthread_join(t[i], 0);
      double el = now() - t0;
      printf("sync threads %2d: %.1f ns per sync per thread, aggregate %.2f syncs/us\n", n, el / k,
             n * k / el * 1000);
    }
  return 0;
}
