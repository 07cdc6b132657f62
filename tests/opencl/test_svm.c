/* Shared virtual memory (clSVMAlloc, clSVMFree, clEnqueueSVMFree): the
   program's pointers work as the implementation's (filled, copied, written
   by a kernel through clSetKernelArgSVMPointer); under gpupool freed blocks
   are reused instead of reaching the implementation, both kinds of
   clEnqueueSVMFree free what they name, what gpupool does not pool (size 0,
   bad flags or alignment, fine-grained memory) gets the implementation's
   answer, and releasing the context gives every block back. Skips (77)
   where the device has no coarse-grained SVM. */
#include "cltest.h"

#define N 10000 /* bytes */

static const char* kSource =
    "kernel void triple(global int* p) { size_t i = get_global_id(0); p[i] = (int)i * 3; }";

static int freed_by_callback;

static void CL_CALLBACK program_free(cl_command_queue q, cl_uint n, void* ptrs[], void* user) {
  cl_context c = (cl_context)user;
  (void)q;
  for (cl_uint i = 0; i < n; i++) clSVMFree(c, ptrs[i]);
  freed_by_callback += (int)n;
}

static int all_words(cl_command_queue q, void* p, size_t bytes, int (*want)(size_t)) {
  static int back[N / 4];
  if (clEnqueueSVMMemcpy(q, CL_TRUE, back, p, bytes, 0, NULL, NULL) != CL_SUCCESS) return 0;
  for (size_t i = 0; i < bytes / 4; i++)
    if (back[i] != want(i)) return 0;
  return 1;
}

static int g_pattern;
static int pattern(size_t i) {
  (void)i;
  return g_pattern;
}
static int tripled(size_t i) { return (int)i * 3; }

int main(void) {
  cltest_pick_device();
  cl_device_svm_capabilities caps = 0;
  if (clGetDeviceInfo(cltest_device, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL) !=
          CL_SUCCESS ||
      !(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) {
    fprintf(stderr, "SKIP: no coarse-grained SVM\n");
    return 77;
  }
  const int pool = cltest_pooling();
  cl_context ctx = cltest_context();
  cl_command_queue q = cltest_queue(ctx);
  cl_int err;
  const long a0 = cltest_count("svm_alloc"), f0 = cltest_count("svm_free");

  /* The same size again and again: one real allocation under gpupool. */
  int ok = 1;
  for (int i = 0; i < 50; i++) {
    void* p = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N, 0);
    REQUIRE(p, "clSVMAlloc %d", i);
    g_pattern = 0x1000 + i;
    CHECK_ERR(clEnqueueSVMMemFill(q, p, &g_pattern, 4, N, 0, NULL, NULL), CL_SUCCESS);
    ok &= all_words(q, p, N, pattern);
    clSVMFree(ctx, p);
  }
  printf("R svm fill and read back: %d\n", ok);
  if (pool) {
    CHECK(cltest_count("svm_alloc") - a0 == 1, "real allocations %ld",
          cltest_count("svm_alloc") - a0);
    CHECK(cltest_count("svm_free") == f0, "real frees %ld", cltest_count("svm_free") - f0);
  }

  /* A kernel writes through a pooled pointer. */
  cl_program prog = clCreateProgramWithSource(ctx, 1, &kSource, NULL, &err);
  REQUIRE(prog && clBuildProgram(prog, 1, &cltest_device, "", NULL, NULL) == CL_SUCCESS, "build");
  cl_kernel k = clCreateKernel(prog, "triple", &err);
  REQUIRE(k, "kernel %d", err);
  int* v = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N, 0);
  REQUIRE(v, "clSVMAlloc");
  CHECK_ERR(clSetKernelArgSVMPointer(k, 0, v), CL_SUCCESS);
  size_t global = N / 4;
  CHECK_ERR(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL), CL_SUCCESS);
  printf("R svm kernel wrote: %d\n", all_words(q, v, N, tripled));

  /* clEnqueueSVMFree without a callback: freed when the command runs; the
     next allocation of the size reuses it under gpupool. */
  cl_event ev = NULL;
  CHECK_ERR(clEnqueueSVMFree(q, 1, (void**)&v, NULL, NULL, 0, NULL, &ev), CL_SUCCESS);
  CHECK_ERR(clWaitForEvents(1, &ev), CL_SUCCESS);
  clReleaseEvent(ev);
  const long a1 = cltest_count("svm_alloc");
  void* again = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N, 0);
  CHECK(again != NULL, "clSVMAlloc after clEnqueueSVMFree");
  if (pool) CHECK(cltest_count("svm_alloc") == a1, "a real allocation after clEnqueueSVMFree");
  /* With the program's callback: it is called with the pointers and frees
     them itself. */
  void* two[2] = {again, clSVMAlloc(ctx, CL_MEM_READ_ONLY, 3000, 0)};
  CHECK(two[1] != NULL, "read-only SVM");
  CHECK_ERR(clEnqueueSVMFree(q, 2, two, program_free, ctx, 0, NULL, NULL), CL_SUCCESS);
  clFinish(q);
  printf("R svm callback freed: %d\n", freed_by_callback);
  if (pool)
    CHECK(cltest_count("svm_free") == f0, "a pooled pointer reached the implementation's free");

  /* Not pooled: the implementation's answers. */
  printf("R svm size 0: %d\n", clSVMAlloc(ctx, CL_MEM_READ_WRITE, 0, 0) == NULL);
  printf("R svm alignment 3: %d\n", clSVMAlloc(ctx, CL_MEM_READ_WRITE, N, 3) == NULL);
  printf("R svm two access flags: %d\n",
         clSVMAlloc(ctx, CL_MEM_READ_WRITE | CL_MEM_READ_ONLY, N, 0) == NULL);
  const cl_ulong max = cltest_device_ulong(CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  printf("R svm over the maximum: %d\n",
         clSVMAlloc(ctx, CL_MEM_READ_WRITE, (size_t)max + 1, 0) == NULL);
  void* aligned = clSVMAlloc(ctx, CL_MEM_READ_WRITE, N, 4096);
  printf("R svm alignment 4096: %d\n", aligned != NULL && ((size_t)aligned % 4096) == 0);
  clSVMFree(ctx, aligned);
  if (caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) {
    const long a2 = cltest_count("svm_alloc");
    for (int i = 0; i < 3; i++) {
      int* fine = clSVMAlloc(ctx, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, N, 0);
      CHECK(fine != NULL, "fine-grained SVM");
      if (fine) fine[0] = 42; /* host access without a map */
      clSVMFree(ctx, fine);
    }
    if (cltest_count("svm_alloc") >= 0)
      CHECK(cltest_count("svm_alloc") - a2 == 3, "fine-grained memory is the implementation's");
  }

  /* Released context: every block gpupool held for it goes back. (Without
     gpupool the implementation's own clEnqueueSVMFree frees past the
     counting layer: counted under gpupool only.) */
  clReleaseKernel(k);
  clReleaseProgram(prog);
  clReleaseCommandQueue(q);
  CHECK_ERR(clReleaseContext(ctx), CL_SUCCESS);
  if (pool && cltest_count("svm_alloc") >= 0)
    CHECK(cltest_count("svm_alloc") - a0 == cltest_count("svm_free") - f0,
          "%ld real allocations, %ld real frees", cltest_count("svm_alloc") - a0,
          cltest_count("svm_free") - f0);
  return cltest_finish("svm");
}
