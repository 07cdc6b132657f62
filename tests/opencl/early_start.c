/* A library that uses OpenCL from its constructor, as some plugins and
   language runtimes do. Linked into the program, it is initialised before
   the preloaded libgpupool's own static initialisers: gpupool starts from
   inside this constructor, and must not rely on them (its files thread's
   state was made by one: a crash here before). */
#include "cltest.h"

int early_start_rounds;
int early_start_failures;

__attribute__((constructor)) static void early_start(void) {
  cltest_pick_device();
  cl_context ctx = cltest_context();
  cl_command_queue q = cltest_queue(ctx);
  for (int round = 0; round < 4; round++) {
    cl_int err;
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    REQUIRE(b, "clCreateBuffer: %d", err);
    char v = (char)('a' + round), back[4096];
    clEnqueueFillBuffer(q, b, &v, 1, 0, sizeof back, 0, NULL, NULL);
    REQUIRE(clEnqueueReadBuffer(q, b, CL_TRUE, 0, sizeof back, back, 0, NULL, NULL) == CL_SUCCESS,
            "read");
    for (size_t i = 0; i < sizeof back; i++) early_start_failures += back[i] != v;
    clReleaseMemObject(b);
    early_start_rounds++;
  }
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
}
