/* One thread's warm allocate+free pair in a plain loop, for profiling the
   shim on the GPU machine (scripts/gpu/harness.sh hotpath): bench_alloc and
   opencl_gpu_check time the same pairs with calibration and repeats; this
   one is small enough for perf to show where each nanosecond goes.

     pair_loop device SIZE PAIRS   cuMemAlloc_v2 + cuMemFree_v2 (built with -DPAIR_CUDA)
     pair_loop ctx 0 CALLS         cuCtxGetCurrent alone (what the shim calls per allocation)
     pair_loop phases SIZE PAIRS   the device pair and cuCtxGetCurrent in 20 alternating
                                   phases of one process: the pair's cost in the host's own
                                   units, whatever speed the host gives this process
     pair_loop opencl SIZE PAIRS   clCreateBuffer + clReleaseMemObject, one in-order queue
                                   (built with -DPAIR_OPENCL)
   Prints "<what> <size> <ns per pair>"; phases prints "phases <size> <pair ns>
   <cuCtxGetCurrent ns> <pair/call ratio>", medians over the phases, then the
   ratio's range. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef PAIR_CUDA
#include <cuda.h>
#endif
#ifdef PAIR_OPENCL
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#endif

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

#ifdef PAIR_CUDA
enum { kPhases = 20 };

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, n, sizeof *v, by_value);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
#endif

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s device|ctx|phases|opencl SIZE PAIRS\n", argv[0]);
    return 2;
  }
  const char* what = argv[1];
  size_t size = strtoull(argv[2], NULL, 0);
  long n = atol(argv[3]);
  double t0 = 0, t1 = 0;
#ifdef PAIR_CUDA
  CUdevice dev;
  CUcontext ctx;
  if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
      cuCtxSetCurrent(ctx)) {
    fprintf(stderr, "pair_loop: CUDA set-up failed\n");
    return 1;
  }
  CUdeviceptr p;
  if (!strcmp(what, "device")) {
    for (int i = 0; i < 1000; ++i)
      if (cuMemAlloc(&p, size) || cuMemFree(p)) return 1;
    t0 = now_ns();
    for (long i = 0; i < n; ++i)
      if (cuMemAlloc(&p, size) || cuMemFree(p)) return 1;
    t1 = now_ns();
  } else if (!strcmp(what, "phases")) {
    /* Each phase about as long as the other, so that both see the same
       moments of the host. */
    const long pairs = n / kPhases, calls = 8 * pairs;
    double pair[kPhases], call[kPhases], ratio[kPhases];
    CUcontext c;
    for (int i = 0; i < 1000; ++i)
      if (cuMemAlloc(&p, size) || cuMemFree(p)) return 1;
    for (int k = 0; k < kPhases; ++k) {
      double a = now_ns();
      for (long i = 0; i < pairs; ++i)
        if (cuMemAlloc(&p, size) || cuMemFree(p)) return 1;
      double b = now_ns();
      for (long i = 0; i < calls; ++i)
        if (cuCtxGetCurrent(&c) || c != ctx) return 1;
      double e = now_ns();
      pair[k] = (b - a) / pairs;
      call[k] = (e - b) / calls;
      ratio[k] = pair[k] / call[k];
    }
    double r = median(ratio, kPhases);
    printf("phases %zu %.1f %.1f %.2f %.2f-%.2f\n", size, median(pair, kPhases),
           median(call, kPhases), r, ratio[0], ratio[kPhases - 1]);
    return 0;
  } else if (!strcmp(what, "ctx")) {
    CUcontext c;
    t0 = now_ns();
    for (long i = 0; i < n; ++i)
      if (cuCtxGetCurrent(&c) || c != ctx) return 1;
    t1 = now_ns();
  } else {
    fprintf(stderr, "pair_loop: built for CUDA: device, ctx or phases\n");
    return 2;
  }
#endif
#ifdef PAIR_OPENCL
  if (strcmp(what, "opencl")) {
    fprintf(stderr, "pair_loop: built for OpenCL: opencl\n");
    return 2;
  }
  cl_platform_id pl;
  cl_device_id dev;
  cl_int err;
  if (clGetPlatformIDs(1, &pl, NULL) || clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &dev, NULL)) {
    fprintf(stderr, "pair_loop: no OpenCL device\n");
    return 1;
  }
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  if (!ctx || !q) return 1;
  for (int i = 0; i < 1000; ++i) {
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    if (!m || clReleaseMemObject(m)) return 1;
  }
  t0 = now_ns();
  for (long i = 0; i < n; ++i) {
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    if (!m || clReleaseMemObject(m)) return 1;
  }
  t1 = now_ns();
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
#endif
  printf("%s %zu %.1f\n", what, size, (t1 - t0) / (double)n);
  return 0;
}
