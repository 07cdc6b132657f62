/* Deferred deletion: a buffer released while a command that uses it is still
   pending (held back by a user event) must not be handed out and overwritten
   before that command ran. Then, once the queues are done, it is reused. */
#include "cltest.h"

#define N 65536

int main(void) {
  cltest_pick_device();
  int pool = cltest_pooling();
  cl_context ctx = cltest_context();
  cl_command_queue q1 = cltest_queue(ctx), q2 = cltest_queue(ctx);
  cl_int err;
  static unsigned char p1[N], p2[N], back[N];
  for (int i = 0; i < N; i++) p1[i] = (unsigned char)(i * 13 + 1), p2[i] = (unsigned char)~p1[i];

  for (int round = 0; round < 3; round++) {
    cl_mem x = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    cl_mem r = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 2 * N, NULL, &err);
    REQUIRE(x && r, "create: %d", err);
    CHECK_ERR(clEnqueueWriteBuffer(q1, x, CL_TRUE, 0, N, p1, 0, NULL, NULL), CL_SUCCESS);
    cl_event gate = clCreateUserEvent(ctx, &err);
    REQUIRE(gate, "user event: %d", err);
    /* x -> r, held back until the gate opens; x is released meanwhile. */
    CHECK_ERR(clEnqueueCopyBuffer(q1, x, r, 0, 0, N, 1, &gate, NULL), CL_SUCCESS);
    clFlush(q1);
    CHECK_ERR(clReleaseMemObject(x), CL_SUCCESS);

    /* Same size, other queue: must not be x's storage. Overwrite it. */
    cl_mem y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    REQUIRE(y, "create y: %d", err);
    CHECK(y != x, "released buffer handed out while a command still uses it");
    CHECK_ERR(clEnqueueWriteBuffer(q2, y, CL_TRUE, 0, N, p2, 0, NULL, NULL), CL_SUCCESS);
    char zero = 0;
    CHECK_ERR(clEnqueueFillBuffer(q2, y, &zero, 1, 0, N / 2, 0, NULL, NULL), CL_SUCCESS);
    CHECK_ERR(clFinish(q2), CL_SUCCESS);

    /* Open the gate: the copy must see x's data. */
    CHECK_ERR(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    CHECK_ERR(clFinish(q1), CL_SUCCESS);
    CHECK_ERR(clEnqueueReadBuffer(q1, r, CL_TRUE, 0, N, back, 0, NULL, NULL), CL_SUCCESS);
    CHECK(!memcmp(back, p1, N), "round %d: the pending copy read overwritten data", round);
    printf("R deferred round %d ok %d\n", round, !memcmp(back, p1, N));
    clReleaseEvent(gate);

    /* Every queue is done now (both finished): a new buffer of that size
       reuses a held block, without asking the driver. */
    CHECK_ERR(clReleaseMemObject(y), CL_SUCCESS);
    CHECK_ERR(clFinish(q1), CL_SUCCESS);
    CHECK_ERR(clFinish(q2), CL_SUCCESS);
    long c0 = cltest_count("create");
    cl_mem z = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    REQUIRE(z, "create z: %d", err);
    if (pool) {
      CHECK(z == x || z == y, "no reuse once the queues finished");
      if (c0 >= 0) CHECK(cltest_count("create") == c0, "driver create after the queues finished");
    }
    clReleaseMemObject(z);
    clReleaseMemObject(r);
    clFinish(q1);
    clFinish(q2);
  }

  /* Without any clFinish: blocks freed under pending work on two queues are
     recycled only when markers show the work done; data stays right. */
  {
    cl_mem keep[8];
    for (int it = 0; it < 200; it++) {
      cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
      cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
      REQUIRE(a && b, "create: %d", err);
      cl_command_queue qa = (it & 1) ? q1 : q2, qb = (it & 1) ? q2 : q1;
      unsigned char v = (unsigned char)it;
      CHECK_ERR(clEnqueueFillBuffer(qa, a, &v, 1, 0, N, 0, NULL, NULL), CL_SUCCESS);
      cl_event done;
      CHECK_ERR(clEnqueueCopyBuffer(qa, a, b, 0, 0, N, 0, NULL, &done), CL_SUCCESS);
      clReleaseMemObject(a);
      unsigned char got[16];
      CHECK_ERR(clEnqueueReadBuffer(qb, b, CL_TRUE, N - 16, 16, got, 1, &done, NULL), CL_SUCCESS);
      for (int k = 0; k < 16; k++) CHECK(got[k] == v, "it %d byte %d: %u != %u", it, k, got[k], v);
      clReleaseEvent(done);
      if (it < 8) keep[it] = b;
      else clReleaseMemObject(b);
    }
    for (int i = 0; i < 8; i++) clReleaseMemObject(keep[i]);
  }
  printf("R deferred loop ok\n");

  clReleaseCommandQueue(q1);
  clReleaseCommandQueue(q2);
  clReleaseContext(ctx);
  return cltest_finish("deferred");
}
