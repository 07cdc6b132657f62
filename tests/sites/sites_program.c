/* A program whose allocation sites are known: keep_weights() allocates
 * buffers it never releases (the leak), scratch_loop() creates and releases
 * its buffers (no leak), on the main thread and on a second thread.
 *
 *   sites_program WEIGHTS SCRATCH      WEIGHTS buffers of 1 MiB kept,
 *                                      SCRATCH buffers of 64 KiB made and
 *                                      released on each of two threads
 */
#define _GNU_SOURCE
#include <CL/cl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static cl_context g_ctx;
static cl_mem g_weights[1024];

static void check(cl_int err, const char* what) {
  if (err != CL_SUCCESS) {
    fprintf(stderr, "sites_program: %s failed: %d\n", what, err);
    exit(3);
  }
}

__attribute__((noinline)) void keep_weights(int n) {
  for (int i = 0; i < n && i < 1024; ++i) {
    cl_int err;
    g_weights[i] = clCreateBuffer(g_ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
    check(err, "clCreateBuffer");
  }
}

__attribute__((noinline)) void scratch_loop(int n) {
  for (int i = 0; i < n; ++i) {
    cl_int err;
    cl_mem m = clCreateBuffer(g_ctx, CL_MEM_READ_WRITE, 64 << 10, NULL, &err);
    check(err, "clCreateBuffer");
    check(clReleaseMemObject(m), "clReleaseMemObject");
  }
}

static void* scratch_thread(void* n) {
  scratch_loop((int)(long)n);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sites_program WEIGHTS SCRATCH\n");
    return 2;
  }
  const int weights = atoi(argv[1]), scratch = atoi(argv[2]);
  cl_platform_id platform;
  cl_device_id device;
  check(clGetPlatformIDs(1, &platform, NULL), "clGetPlatformIDs");
  check(clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL), "clGetDeviceIDs");
  cl_int err;
  g_ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  check(err, "clCreateContext");
  pthread_t t;
  if (pthread_create(&t, NULL, scratch_thread, (void*)(long)scratch)) return 3;
  scratch_loop(scratch);
  pthread_join(t, NULL);
  keep_weights(weights);
  printf("done\n");
  return 0;
}
