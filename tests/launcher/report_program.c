/* A program whose memory `gpupool report` must show exactly (the Report
 * group of test_report.py), on one OpenCL context:
 *
 *   load_weights()  3 buffers of 1 MiB, never released        3 MiB at exit
 *   forward()       5 buffers of 2 MiB at once, then released; run twice:
 *                   the first run makes the peak (3 + 10 = 13 MiB active),
 *                   the second takes the 5 blocks held (5 hits)
 *   keep_scratch()  1 buffer of 64 KiB, never released       64 KiB at exit
 *
 * so the peak of managed memory is 13 MiB + 64 KiB, at the end, and what is
 * still held at exit is 3 MiB from load_weights and 64 KiB from
 * keep_scratch. With the argument "free-all" it releases them before exit:
 * nothing is held at the end. The functions are not static and never inlined: the report
 * names them from this file's symbol table; create() is always inlined, so
 * they are the frames that call OpenCL at every optimisation level (the
 * sanitizer builds are -O0).
 */
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static cl_context g_ctx;
static cl_mem g_weights[3];
static cl_mem g_scratch;

static inline __attribute__((always_inline)) cl_mem create(size_t size) {
  cl_int err;
  cl_mem m = clCreateBuffer(g_ctx, CL_MEM_READ_WRITE, size, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "report_program: clCreateBuffer(%zu) failed: %d\n", size, err);
    exit(3);
  }
  return m;
}

__attribute__((noinline)) void load_weights(void) {
  for (int i = 0; i < 3; ++i) g_weights[i] = create(1 << 20);
}

__attribute__((noinline)) void forward(void) {
  cl_mem activations[5];
  for (int i = 0; i < 5; ++i) activations[i] = create(2 << 20);
  for (int i = 0; i < 5; ++i) clReleaseMemObject(activations[i]);
}

__attribute__((noinline)) void keep_scratch(void) { g_scratch = create(64 << 10); }

int main(int argc, char** argv) {
  cl_platform_id platform;
  cl_device_id device;
  cl_int err;
  if (clGetPlatformIDs(1, &platform, NULL) != CL_SUCCESS ||
      clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL) != CL_SUCCESS) {
    fprintf(stderr, "report_program: no OpenCL device\n");
    return 3;
  }
  g_ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    fprintf(stderr, "report_program: clCreateContext failed: %d\n", err);
    return 3;
  }
  load_weights();
  forward();
  forward();
  keep_scratch();
  if (argc > 1 && strcmp(argv[1], "free-all") == 0) {
    for (int i = 0; i < 3; ++i) clReleaseMemObject(g_weights[i]);
    clReleaseMemObject(g_scratch);
  }
  printf("done\n");
  return 0;
}
