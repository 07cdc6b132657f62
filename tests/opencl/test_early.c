/* gpupool started from another library's constructor (early_start.c),
   before its own static initialisers ran: that library's buffers are right,
   pooled, and the program goes on using gpupool. */
#include "cltest.h"

extern int early_start_rounds;
extern int early_start_failures;

int main(void) {
  CHECK(early_start_rounds == 4, "the constructor made %d buffers of 4", early_start_rounds);
  CHECK(early_start_failures == 0, "%d bytes read back wrong", early_start_failures);
  printf("R early constructor buffers %d, bytes wrong %d\n", early_start_rounds,
         early_start_failures);
  cltest_pick_device();
  cl_context ctx = cltest_context();
  cl_int err;
  cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
  CHECK(b != NULL, "clCreateBuffer after main began: %d", err);
  if (b) clReleaseMemObject(b);
  clReleaseContext(ctx);
  /* The constructor's later rounds came from the pool (one context, one
     size), and so did main's if its context reused the device's arena. */
  if (cltest_pooling()) CHECK(cltest_stat("hits") >= 3, "hits %ld", cltest_stat("hits"));
  return cltest_finish("early");
}
