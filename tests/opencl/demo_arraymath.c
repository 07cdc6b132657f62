/* The demo: an ordinary OpenCL program doing array math the simple way, with
   a new buffer for every intermediate result, released as soon as it has
   been used. It knows nothing of gpupool. scripts/demo.sh runs it with and
   without gpupool.
     demo_arraymath [STEPS] [ELEMENTS] */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char* kSource =
    "__kernel void mul(__global float* out, __global const float* x, __global const float* y) {\n"
    "  size_t i = get_global_id(0); out[i] = x[i] * y[i];\n"
    "}\n"
    "__kernel void axpby(__global float* out, __global const float* x, __global const float* y,\n"
    "                    float a, float b) {\n"
    "  size_t i = get_global_id(0); out[i] = a * x[i] + b * y[i];\n"
    "}\n";

#define DIE(...)                  \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fprintf(stderr, "\n");        \
    exit(1);                      \
  } while (0)

static cl_context ctx;
static cl_command_queue q;
static size_t n;

static cl_mem new_array(void) {
  cl_int err;
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n * sizeof(float), NULL, &err);
  if (!m) DIE("clCreateBuffer: %d", err);
  return m;
}

static void run(cl_kernel k, cl_mem out, cl_mem x, cl_mem y, const float* ab) {
  clSetKernelArg(k, 0, sizeof out, &out);
  clSetKernelArg(k, 1, sizeof x, &x);
  clSetKernelArg(k, 2, sizeof y, &y);
  if (ab) {
    clSetKernelArg(k, 3, sizeof(float), &ab[0]);
    clSetKernelArg(k, 4, sizeof(float), &ab[1]);
  }
  cl_int err = clEnqueueNDRangeKernel(q, k, 1, NULL, &n, NULL, 0, NULL, NULL);
  if (err) DIE("clEnqueueNDRangeKernel: %d", err);
}

int main(int argc, char** argv) {
  int steps = argc > 1 ? atoi(argv[1]) : 200;
  n = argc > 2 ? (size_t)atol(argv[2]) : 1 << 20;
  cl_platform_id plat;
  cl_device_id dev;
  cl_uint np = 0;
  if (clGetPlatformIDs(1, &plat, &np) != CL_SUCCESS || !np ||
      clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, NULL) != CL_SUCCESS) {
    fprintf(stderr, "SKIP: no OpenCL device\n");
    return 77;
  }
  char name[256] = "";
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
  cl_int err;
  ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (!ctx) DIE("clCreateContext: %d", err);
  q = clCreateCommandQueue(ctx, dev, 0, &err);
  if (!q) DIE("clCreateCommandQueue: %d", err);
  cl_program prog = clCreateProgramWithSource(ctx, 1, &kSource, NULL, &err);
  if (clBuildProgram(prog, 1, &dev, "", NULL, NULL) != CL_SUCCESS) DIE("clBuildProgram failed");
  cl_kernel kmul = clCreateKernel(prog, "mul", &err);
  cl_kernel kaxpby = clCreateKernel(prog, "axpby", &err);

  float* host = malloc(n * sizeof(float));
  cl_mem a = new_array(), b = new_array(), c = new_array(), acc = new_array();
  for (size_t i = 0; i < n; i++) host[i] = (float)(i % 1000) / 1000.0f;
  clEnqueueWriteBuffer(q, a, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL);
  for (size_t i = 0; i < n; i++) host[i] = 1.0f - (float)(i % 777) / 777.0f;
  clEnqueueWriteBuffer(q, b, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL);
  float zero = 0, half = 0.5f;
  clEnqueueFillBuffer(q, c, &half, sizeof half, 0, n * sizeof(float), 0, NULL, NULL);
  clEnqueueFillBuffer(q, acc, &zero, sizeof zero, 0, n * sizeof(float), 0, NULL, NULL);

  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int s = 0; s < steps; s++) {
    /* acc = 0.5 * acc + 0.25 * ((a*b + 0.5*c)^2) : four temporaries */
    cl_mem t1b = new_array();
    run(kmul, t1b, a, b, NULL);
    cl_mem t2 = new_array();
    const float one_half[2] = {1.0f, 0.5f};
    run(kaxpby, t2, t1b, c, one_half);
    clReleaseMemObject(t1b);
    cl_mem t3 = new_array();
    run(kmul, t3, t2, t2, NULL);
    clReleaseMemObject(t2);
    cl_mem next = new_array();
    const float decay[2] = {0.5f, 0.25f};
    run(kaxpby, next, acc, t3, decay);
    clReleaseMemObject(t3);
    clReleaseMemObject(acc);
    acc = next;
  }
  clFinish(q);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  clEnqueueReadBuffer(q, acc, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL);
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += host[i];
  printf("R demo device \"%s\" steps %d elements %zu buffers created %d checksum %.9e\n", name,
         steps, n, 4 * steps + 4, sum);
  fprintf(stderr, "demo: %d steps x 4 temporary buffers of %zu KiB: %.1f ms\n", steps,
          n * sizeof(float) / 1024,
          (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
  clReleaseMemObject(a);
  clReleaseMemObject(b);
  clReleaseMemObject(c);
  clReleaseMemObject(acc);
  clReleaseKernel(kmul);
  clReleaseKernel(kaxpby);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  free(host);
  return 0;
}
