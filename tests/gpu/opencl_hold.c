/* An OpenCL process on a shared GPU: the holder of scripts/gpu/workloads/neighbours.py
 * --opencl-holder, with cuda_neighbour's (tests/cuda/neighbour.c) lines.
 *
 *   opencl_hold uuid
 *       "uuid GPU-<uuid>" of the first GPU (cl_khr_device_uuid), or
 *       "uuid none"; the CUDA driver's UUID for the same GPU must match for
 *       the node's processes to name it alike.
 *   opencl_hold hold BLOCK_MIB COUNT
 *       create COUNT buffers on the first GPU, write one byte into each (so
 *       the driver really has the memory), print "allocated <n>", release
 *       them all, print "held" (under gpupool the pool now holds them); then
 *       wait for "exit" or EOF on stdin.
 *
 *   cc -O2 opencl_hold.c -lOpenCL
 * Errors go to stderr with exit status 1. */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check(cl_int r, const char* what) {
  if (r == CL_SUCCESS) return;
  fprintf(stderr, "opencl_hold: %s failed: %d\n", what, (int)r);
  exit(1);
}

static cl_device_id first_gpu(void) {
  cl_platform_id plats[8];
  cl_uint np = 0;
  check(clGetPlatformIDs(8, plats, &np), "clGetPlatformIDs");
  for (cl_uint i = 0; i < np; ++i) {
    cl_device_id d;
    cl_uint nd = 0;
    if (clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_GPU, 1, &d, &nd) == CL_SUCCESS && nd > 0) return d;
  }
  fprintf(stderr, "opencl_hold: no OpenCL GPU\n");
  exit(1);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: opencl_hold uuid | hold BLOCK_MIB COUNT\n");
    return 2;
  }
  cl_device_id dev = first_gpu();
  if (strcmp(argv[1], "uuid") == 0) {
    unsigned char u[CL_UUID_SIZE_KHR];
    char ext[8192] = "";
    clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
    if (!strstr(ext, "cl_khr_device_uuid") ||
        clGetDeviceInfo(dev, CL_DEVICE_UUID_KHR, sizeof u, u, NULL) != CL_SUCCESS) {
      printf("uuid none\n");
      return 0;
    }
    printf("uuid GPU-");
    for (int i = 0; i < 16; ++i)
      printf("%02x%s", u[i], i == 3 || i == 5 || i == 7 || i == 9 ? "-" : "");
    printf("\n");
    return 0;
  }
  if (strcmp(argv[1], "hold") != 0 || argc < 4) {
    fprintf(stderr, "usage: opencl_hold uuid | hold BLOCK_MIB COUNT\n");
    return 2;
  }
  const size_t bytes = (size_t)strtoull(argv[2], NULL, 10) << 20;
  const int count = atoi(argv[3]);
  cl_int err;
  cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  check(err, "clCreateContext");
  cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  check(err, "clCreateCommandQueueWithProperties");
  cl_mem* bufs = calloc((size_t)count, sizeof *bufs);
  static const char one = 1;
  int n = 0;
  for (; n < count; ++n) {
    bufs[n] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (!bufs[n]) break;
    if (clEnqueueWriteBuffer(q, bufs[n], CL_TRUE, 0, 1, &one, 0, NULL, NULL) != CL_SUCCESS) {
      clReleaseMemObject(bufs[n]);
      break;
    }
  }
  printf("allocated %d\n", n);
  fflush(stdout);
  for (int i = 0; i < n; ++i) check(clReleaseMemObject(bufs[i]), "clReleaseMemObject");
  check(clFinish(q), "clFinish");
  printf("held\n");
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin) && strncmp(line, "exit", 4) != 0) {
  }
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  free(bufs);
  return 0;
}
