/* Context lifetime: buffers gpupool holds (and its own queue) keep a context
   alive only while the program does. At the program's last clReleaseContext
   gpupool lets go, so the context dies and its destructor callback fires;
   a buffer the program still holds keeps it alive until released. */
#include <unistd.h>

#include "cltest.h"

static volatile int fired[4];
static void CL_CALLBACK ctx_dtor(cl_context c, void* ud) {
  (void)c;
  fired[(long)ud]++;
}

/* The callback may come from a driver thread: wait for it (the assertion is
   only that it comes). */
static int wait_fired(int i) {
  for (int t = 0; t < 1000 && !fired[i]; t++) usleep(10000);
  return fired[i];
}

static void use(cl_context ctx, cl_command_queue q, size_t n) {
  cl_int err;
  cl_mem bufs[4];
  for (int i = 0; i < 4; i++) {
    bufs[i] = clCreateBuffer(ctx, i & 1 ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE, n << i, NULL, &err);
    REQUIRE(bufs[i], "create: %d", err);
    char v = (char)i;
    clEnqueueFillBuffer(q, bufs[i], &v, 1, 0, n << i, 0, NULL, NULL);
  }
  clFinish(q);
  for (int i = 0; i < 4; i++) clReleaseMemObject(bufs[i]);
  clFinish(q);
}

int main(void) {
  cltest_pick_device();
  cl_int err;

  /* 1: held buffers only. */
  {
    cl_context ctx = cltest_context();
    cl_command_queue q = cltest_queue(ctx);
    REQUIRE(clSetContextDestructorCallback(ctx, ctx_dtor, (void*)0) == CL_SUCCESS,
            "clSetContextDestructorCallback");
    use(ctx, q, 4096);
    use(ctx, q, 4096);
    clRetainContext(ctx);
    clReleaseContext(ctx);
    CHECK(!fired[0], "context died while the program holds a reference");
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    CHECK(wait_fired(0) == 1, "context destructor callback did not fire");
    printf("R context held-only fired %d\n", fired[0]);
  }

  /* 2: a buffer the program still holds keeps the context; its release ends it. */
  {
    cl_context ctx = cltest_context();
    cl_command_queue q = cltest_queue(ctx);
    clSetContextDestructorCallback(ctx, ctx_dtor, (void*)1);
    use(ctx, q, 1000);
    cl_mem live = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1000, NULL, &err);
    REQUIRE(live, "create: %d", err);
    unsigned char data[1000], back[1000];
    for (int i = 0; i < 1000; i++) data[i] = (unsigned char)i;
    clEnqueueWriteBuffer(q, live, CL_TRUE, 0, 1000, data, 0, NULL, NULL);
    clReleaseContext(ctx);
    CHECK(!fired[1], "context died under a live buffer");
    /* The buffer still works, through the queue the program holds. */
    CHECK_ERR(clEnqueueReadBuffer(q, live, CL_TRUE, 0, 1000, back, 0, NULL, NULL), CL_SUCCESS);
    CHECK(!memcmp(data, back, 1000), "live buffer data");
    clReleaseCommandQueue(q);
    CHECK(!fired[1], "context died under a live buffer (queue released)");
    clReleaseMemObject(live);
    CHECK(wait_fired(1) == 1, "context did not die at the last buffer's release");
    printf("R context live-buffer fired %d\n", fired[1]);
  }

  /* 3: a new context (perhaps at the same address) pools afresh. */
  for (int k = 2; k < 4; k++) {
    cl_context ctx = cltest_context();
    cl_command_queue q = cltest_queue(ctx);
    clSetContextDestructorCallback(ctx, ctx_dtor, (void*)(long)k);
    use(ctx, q, 3000);
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 3000, NULL, &err);
    REQUIRE(m, "create: %d", err);
    cl_context mc = NULL;
    clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof mc, &mc, NULL);
    CHECK(mc == ctx, "buffer of another context handed out");
    clReleaseMemObject(m);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    CHECK(wait_fired(k) == 1, "context %d did not die", k);
    printf("R context %d fired %d\n", k, fired[k]);
  }
  return cltest_finish("context");
}
