/* Built twice, as libsites_reload_a.so (alloc_in_a) and libsites_reload_b.so
 * (alloc_in_b): the same code, so the second, loaded where the first was
 * unloaded, has its functions at the same addresses. */
#include <CL/cl.h>

#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

__attribute__((noinline)) cl_mem CAT(alloc_in_, WHICH)(cl_context ctx, size_t bytes) {
  cl_int err;
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, NULL, &err);
  return err == CL_SUCCESS ? m : NULL;
}
