/* Stands for a Python extension such as PyOpenCL's wheel: linked against its
   own copy of the ICD loader (another SONAME, found through its RUNPATH) and
   loaded RTLD_LOCAL, so the copy is invisible to dlsym(RTLD_NEXT) while the
   extension's own OpenCL calls still bind to preloaded exports first. */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

/* Creates and releases `rounds` buffers of `size` bytes on the first device;
   returns the first error, or CL_SUCCESS. */
__attribute__((visibility("default"))) cl_int private_ext_churn(int rounds, size_t size) {
  cl_platform_id platform;
  cl_device_id device;
  cl_int err = clGetPlatformIDs(1, &platform, NULL);
  if (err != CL_SUCCESS) return err;
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
  if (err != CL_SUCCESS) return err;
  cl_context ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (!ctx) return err;
  for (int i = 0; i < rounds && err == CL_SUCCESS; i++) {
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
    if (m) err = clReleaseMemObject(m);
  }
  clReleaseContext(ctx);
  return err;
}
