/* A program that never links libOpenCL: it dlopens the loader (RTLD_LOCAL,
   by name or by the path in $CLTEST_LOADER) and calls what dlsym returns, so
   preloaded exports never see its calls. gpupool reaches it as an ICD layer
   (plain LD_PRELOAD adds itself to OPENCL_LAYERS). */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define CHECK(c, ...)                                              \
  do {                                                             \
    if (!(c)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c); \
      fprintf(stderr, __VA_ARGS__);                                \
      fprintf(stderr, "\n");                                       \
      failures++;                                                  \
    }                                                              \
  } while (0)

#define FN(name) static __typeof__(&name) p_##name
FN(clGetPlatformIDs);
FN(clGetDeviceIDs);
FN(clCreateContext);
FN(clCreateCommandQueue);
FN(clCreateBuffer);
FN(clReleaseMemObject);
FN(clEnqueueWriteBuffer);
FN(clEnqueueReadBuffer);
FN(clEnqueueCopyBuffer);
FN(clFinish);
FN(clReleaseCommandQueue);
FN(clReleaseContext);
FN(clGetMemObjectInfo);

int main(void) {
  const char* path = getenv("CLTEST_LOADER");
  void* h = dlopen(path && *path ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "SKIP: cannot dlopen the OpenCL loader: %s\n", dlerror());
    return 77;
  }
#define LOAD(name)                                    \
  do {                                                \
    p_##name = (__typeof__(p_##name))dlsym(h, #name); \
    if (!p_##name) {                                  \
      fprintf(stderr, "FAIL: dlsym %s\n", #name);     \
      return 1;                                       \
    }                                                 \
  } while (0)
  LOAD(clGetPlatformIDs);
  LOAD(clGetDeviceIDs);
  LOAD(clCreateContext);
  LOAD(clCreateCommandQueue);
  LOAD(clCreateBuffer);
  LOAD(clReleaseMemObject);
  LOAD(clEnqueueWriteBuffer);
  LOAD(clEnqueueReadBuffer);
  LOAD(clEnqueueCopyBuffer);
  LOAD(clFinish);
  LOAD(clReleaseCommandQueue);
  LOAD(clReleaseContext);
  LOAD(clGetMemObjectInfo);

  cl_platform_id plat;
  cl_device_id dev;
  cl_uint n = 0;
  if (p_clGetPlatformIDs(1, &plat, &n) != CL_SUCCESS || !n ||
      p_clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &dev, &n) != CL_SUCCESS || !n) {
    fprintf(stderr, "SKIP: no OpenCL device\n");
    return 77;
  }
  cl_int err;
  cl_context ctx = p_clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  cl_command_queue q = p_clCreateCommandQueue(ctx, dev, 0, &err);
  if (!ctx || !q) {
    fprintf(stderr, "FAIL: context/queue %d\n", err);
    return 1;
  }
  /* The counting layer's counters, if it is loaded. */
  long (*count)(const char*) = NULL;
  const char* cl = getenv("COUNT_LAYER");
  if (cl && *cl) {
    void* ch = dlopen(cl, RTLD_NOW | RTLD_NOLOAD);
    CHECK(ch != NULL, "COUNT_LAYER not loaded");
    if (ch) count = (long (*)(const char*))dlsym(ch, "count_layer_get");
  }
  long c0 = count ? count("create") : -1;

  enum { N = 10000 };
  static unsigned char src[N], dst[N];
  int calls = 0;
  for (int it = 0; it < 100; it++) {
    for (int i = 0; i < N; i++) src[i] = (unsigned char)(i + it);
    cl_mem a = p_clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    cl_mem b = p_clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    calls += 2;
    CHECK(a && b, "create: %d", err);
    p_clEnqueueWriteBuffer(q, a, CL_TRUE, 0, N, src, 0, NULL, NULL);
    p_clEnqueueCopyBuffer(q, a, b, 0, 0, N, 0, NULL, NULL);
    p_clEnqueueReadBuffer(q, b, CL_TRUE, 0, N, dst, 0, NULL, NULL);
    CHECK(!memcmp(src, dst, N), "data it %d", it);
    size_t s = 0;
    p_clGetMemObjectInfo(a, CL_MEM_SIZE, sizeof s, &s, NULL);
    CHECK(s == N, "CL_MEM_SIZE %zu", s);
    p_clReleaseMemObject(a);
    p_clReleaseMemObject(b);
    p_clFinish(q);
  }
  long made = count ? count("create") - c0 : -1;
  int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_active");
  const char* off = getenv("GPUPOOL_OPENCL");
  int pooling = active && active() && !(off && !strcmp(off, "0"));
  /* Layer mode is what reaches dlopen users; GPUPOOL_OPENCL_LAYER=0 opts out. */
  const char* lay = getenv("GPUPOOL_OPENCL_LAYER");
  if (lay && !strcmp(lay, "0")) pooling = 0;
  fprintf(stderr, "dlopen: %d creates, %ld reached the driver\n", calls, made);
  if (made >= 0) {
    if (pooling) CHECK(made <= 2, "expected <= 2 driver creates, got %ld", made);
    else CHECK(made == calls, "expected %d driver creates, got %ld", calls, made);
  }
  printf("R dlopen ok\n");
  p_clReleaseCommandQueue(q);
  p_clReleaseContext(ctx);
  if (failures) {
    fprintf(stderr, "FAIL dlopen: %d check(s) failed\n", failures);
    return 1;
  }
  fprintf(stderr, "PASS dlopen (gpupool %s)\n", pooling ? "pooling" : "not pooling");
  return 0;
}
