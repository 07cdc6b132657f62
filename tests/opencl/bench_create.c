/* clCreateBuffer + clReleaseMemObject pairs: what a program pays per
   temporary buffer. Run it plainly and under gpupool (scripts/bench_opencl.sh
   does both, also with GPUPOOL_PROBE=0 and with GPUPOOL_HOLD=0 for the miss
   path).
     bench_create [PAIRS] [SIZE] [USE]
   USE=1 also writes one byte into every buffer (PoCL allocates at first use). */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char** argv) {
  long pairs = argc > 1 ? atol(argv[1]) : 100000;
  size_t size = argc > 2 ? (size_t)atol(argv[2]) : 1 << 20;
  int use = argc > 3 ? atoi(argv[3]) : 0;
  cl_platform_id p;
  cl_device_id d;
  cl_uint n = 0;
  if (clGetPlatformIDs(1, &p, &n) != CL_SUCCESS || !n ||
      clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL) != CL_SUCCESS)
    return 77;
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
  cl_command_queue q = clCreateCommandQueue(ctx, d, 0, &err);
  char byte = 1;
  double best = 1e30;
  for (int rep = 0; rep < 5; rep++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < pairs; i++) {
      cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
      if (!m) {
        fprintf(stderr, "clCreateBuffer: %d\n", err);
        return 1;
      }
      if (use) clEnqueueWriteBuffer(q, m, CL_TRUE, 0, 1, &byte, 0, NULL, NULL);
      clReleaseMemObject(m);
    }
    clFinish(q);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / pairs;
    if (ns < best) best = ns;
  }
  printf("%.0f\n", best);
  fprintf(stderr, "create+release%s of %zu bytes: %.0f ns per pair (best of 5 x %ld)\n",
          use ? "+1-byte write" : "", size, best, pairs);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return 0;
}
