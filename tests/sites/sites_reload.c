/* A library unloaded and another loaded at its addresses, each allocating a
 * buffer the program keeps (the leak report lists both):
 *
 *   sites_reload LIB_A LIB_B    alloc_in_a (1 MiB) from LIB_A, dlclose,
 *                               alloc_in_b (2 MiB) from LIB_B
 *
 * Prints "same addresses" when LIB_B's alloc_in_b is where alloc_in_a was
 * (the case being tested), then "done". */
#define _GNU_SOURCE
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef cl_mem (*alloc_fn)(cl_context, size_t);

static void* call(const char* lib, const char* fn, cl_context ctx, size_t bytes, cl_mem* out) {
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "sites_reload: %s\n", dlerror());
    exit(3);
  }
  alloc_fn f = (alloc_fn)dlsym(h, fn);
  if (!f || !(*out = f(ctx, bytes))) {
    fprintf(stderr, "sites_reload: %s failed\n", fn);
    exit(3);
  }
  void* where = (void*)f;
  if (dlclose(h) != 0) exit(3);
  return where;
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: sites_reload LIB_A LIB_B\n");
    return 2;
  }
  cl_platform_id platform;
  cl_device_id device;
  cl_int err;
  if (clGetPlatformIDs(1, &platform, NULL) ||
      clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL))
    return 3;
  cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (err != CL_SUCCESS) return 3;
  cl_mem a, b;
  void* fa = call(argv[1], "alloc_in_a", ctx, 1 << 20, &a);
  void* fb = call(argv[2], "alloc_in_b", ctx, 2 << 20, &b);
  if (fa == fb) printf("same addresses\n");
  printf("done\n");
  return 0;
}
