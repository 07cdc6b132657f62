/* A context with one in-order queue: gpupool reuses a freed block at once
   (every later command on it is queued behind the older ones). Checked here:
   the older command still sees its data; a COPY_HOST_PTR create on a reused
   block neither blocks behind a gated command nor overtakes it; and when a
   second queue appears while such a block is out, that queue waits for the
   older work (hazard barrier) instead of racing it. CLTEST_SOLO_EXPECT=1 (or
   0) also checks that variant 0's new buffer is (or is not) the released
   one: GPUPOOL_REUSE=fenced never reuses a block the device may still use. */
#include "cltest.h"

#define N 32768

static unsigned char p1[N], p2[N], back[N];

int main(void) {
  cltest_pick_device();
  int pool = cltest_pooling();
  for (int i = 0; i < N; i++)
    p1[i] = (unsigned char)(i * 7 + 3), p2[i] = (unsigned char)(i * 5 + 11);
  cl_int err;

  for (int variant = 0; variant < 3; variant++) {
    cl_context ctx = cltest_context();
    cl_command_queue q = cltest_queue(ctx);
    cl_mem r = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
    /* x (and y) with the flags variant 1 uses, so y can reuse x's block. */
    cl_mem_flags xf = CL_MEM_READ_WRITE | (variant == 1 ? CL_MEM_COPY_HOST_PTR : 0);
    /* Warm the pool: a block of size N held and idle. */
    cl_mem w = clCreateBuffer(ctx, xf, N, variant == 1 ? p1 : NULL, &err);
    clReleaseMemObject(w);
    clFinish(q);
    cl_mem x = clCreateBuffer(ctx, xf, N, variant == 1 ? p1 : NULL, &err);
    REQUIRE(x && r, "create: %d", err);
    CHECK_ERR(clEnqueueWriteBuffer(q, x, CL_TRUE, 0, N, p1, 0, NULL, NULL), CL_SUCCESS);
    cl_event gate = clCreateUserEvent(ctx, &err);
    CHECK_ERR(clEnqueueCopyBuffer(q, x, r, 0, 0, N, 1, &gate, NULL), CL_SUCCESS);
    clFlush(q);
    CHECK_ERR(clReleaseMemObject(x), CL_SUCCESS);

    cl_mem y = NULL;
    cl_command_queue q2 = NULL;
    if (variant == 0) {
      /* Same queue, non-blocking overwrite: ordered behind the copy. */
      y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
      CHECK_ERR(clEnqueueWriteBuffer(q, y, CL_FALSE, 0, N, p2, 0, NULL, NULL), CL_SUCCESS);
    } else if (variant == 1) {
      /* COPY_HOST_PTR: must return (not wait for the gate) with p2 in it. */
      static unsigned char tmp[N];
      memcpy(tmp, p2, N);
      y = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, N, tmp, &err);
      memset(tmp, 0, N); /* host_ptr is free again once create returned */
    } else {
      /* A second queue appears while the reused block may still be read by
         the gated copy: its commands must wait for that copy. */
      y = clCreateBuffer(ctx, CL_MEM_READ_WRITE, N, NULL, &err);
      q2 = cltest_queue(ctx);
      CHECK_ERR(clEnqueueWriteBuffer(q2, y, CL_FALSE, 0, N, p2, 0, NULL, NULL), CL_SUCCESS);
      clFlush(q2);
    }
    REQUIRE(y, "create y: %d", err);
    fprintf(stderr, "variant %d: new buffer %s the released one\n", variant,
            y == x ? "reuses" : "is not");
    const char* expect = getenv("CLTEST_SOLO_EXPECT");
    if (expect && variant == 0)
      CHECK((y == x) == (atoi(expect) != 0), "variant 0: reuse %d, expected %s", y == x, expect);
    CHECK_ERR(clSetUserEventStatus(gate, CL_COMPLETE), CL_SUCCESS);
    CHECK_ERR(clFinish(q), CL_SUCCESS);
    if (q2) CHECK_ERR(clFinish(q2), CL_SUCCESS);
    CHECK_ERR(clEnqueueReadBuffer(q, r, CL_TRUE, 0, N, back, 0, NULL, NULL), CL_SUCCESS);
    CHECK(!memcmp(back, p1, N), "variant %d: the gated copy saw overwritten data", variant);
    CHECK_ERR(clEnqueueReadBuffer(q, y, CL_TRUE, 0, N, back, 0, NULL, NULL), CL_SUCCESS);
    CHECK(!memcmp(back, p2, N), "variant %d: new buffer lacks its data", variant);
    printf("R solo variant %d ok\n", variant);
    clReleaseEvent(gate);
    clReleaseMemObject(y);
    clReleaseMemObject(r);
    if (q2) clReleaseCommandQueue(q2);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
  }
  if (pool) CHECK(cltest_stat("hits") > 0, "no pool hits");
  return cltest_finish("solo");
}
