/* Out-of-memory with release-and-retry: memory the pool holds must not make
   an allocation fail that succeeds without gpupool.
   CPU devices (PoCL) overcommit, so the limit is made real with
   setrlimit(RLIMIT_AS); PoCL allocates CL_MEM_ALLOC_HOST_PTR buffers at
   create (others at first use, where PoCL 3.1 aborts on failure).
   GPUs: fill the device with buffers of the maximum size, release all but
   one (gpupool holds them), then ask for more than fits beside the held ones. */
#include <sys/resource.h>
#include <unistd.h>

#include "cltest.h"

static cl_context ctx;
static cl_command_queue q;

/* Make the allocation real (first use), report the error. */
static cl_int touch(cl_mem m) {
  char z = 0;
  cl_int e = clEnqueueFillBuffer(q, m, &z, 1, 0, 1, 0, NULL, NULL);
  if (e != CL_SUCCESS) return e;
  return clFinish(q);
}

static void cpu_mode(void) {
  const size_t MiB = 1 << 20;
  const cl_mem_flags F = CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR;
  cl_int err;
  long pages = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  REQUIRE(f && fscanf(f, "%ld", &pages) == 1, "statm");
  fclose(f);
  struct rlimit rl;
  getrlimit(RLIMIT_AS, &rl);
  rl.rlim_cur = (rlim_t)pages * sysconf(_SC_PAGESIZE) + 400 * MiB;
  REQUIRE(setrlimit(RLIMIT_AS, &rl) == 0, "setrlimit");

  long rel0 = cltest_count("release");
  cl_mem a = clCreateBuffer(ctx, F, 256 * MiB, NULL, &err);
  REQUIRE(a, "256 MiB: %d", err);
  CHECK_ERR(touch(a), CL_SUCCESS);
  CHECK_ERR(clReleaseMemObject(a), CL_SUCCESS);
  clFinish(q);
  /* Another bin: under gpupool the 256 MiB block is held, so this only fits
     after gpupool releases it. */
  cl_mem b = clCreateBuffer(ctx, F, 300 * MiB, NULL, &err);
  printf("R oom after release: %d\n", err);
  CHECK(b && err == CL_SUCCESS, "300 MiB after releasing 256 MiB: %d", err);
  if (b) CHECK_ERR(touch(b), CL_SUCCESS);
  if (cltest_pooling() && rel0 >= 0)
    CHECK(cltest_count("release") > rel0, "held block not released for the retry");
  if (cltest_pooling())
    CHECK(cltest_stat("oom_retries") >= 1, "oom_retries %ld", cltest_stat("oom_retries"));
  /* Cannot fit at all: the implementation's own error, after gpupool has
     given back everything it could. */
  cl_mem c = clCreateBuffer(ctx, F, 600 * MiB, NULL, &err);
  printf("R oom too big: %d %d\n", c != NULL, err);
  CHECK(!c && (err == CL_OUT_OF_HOST_MEMORY || err == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
               err == CL_OUT_OF_RESOURCES),
        "600 MiB under a 400 MiB limit: %d", err);
  if (b) clReleaseMemObject(b);
  /* And the pool still works. */
  for (int i = 0; i < 3; i++) {
    cl_mem m = clCreateBuffer(ctx, F, 100 * MiB, NULL, &err);
    CHECK(m, "100 MiB: %d", err);
    if (m) clReleaseMemObject(m);
    clFinish(q);
  }
  printf("R oom cpu done\n");
}

static void gpu_mode(void) {
  cl_int err;
  size_t max = (size_t)cltest_device_ulong(CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  size_t global = (size_t)cltest_device_ulong(CL_DEVICE_GLOBAL_MEM_SIZE);
  size_t k = global / max;
  if (k < 3 || k > 64) {
    fprintf(stderr, "SKIP: global %zu / max alloc %zu does not suit this test\n", global, max);
    exit(77);
  }
  cl_mem full[64];
  size_t made = 0;
  for (; made < k; made++) {
    full[made] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, max, NULL, &err);
    if (!full[made] || touch(full[made]) != CL_SUCCESS) {
      if (full[made]) clReleaseMemObject(full[made]);
      break;
    }
  }
  fprintf(stderr, "gpu: %zu buffers of %zu bytes made real\n", made, max);
  REQUIRE(made >= 3, "could not fill the device (%zu)", made);
  for (size_t i = 1; i < made; i++) clReleaseMemObject(full[i]);
  clFinish(q);
  /* Two buffers of 3/4 of the maximum (another bin): they fit beside the one
     kept, but not beside the ones gpupool holds. */
  cl_mem s[2];
  for (int i = 0; i < 2; i++) {
    s[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, max / 4 * 3, NULL, &err);
    cl_int t = s[i] ? touch(s[i]) : err;
    printf("R oom gpu %d: %d\n", i, t);
    CHECK(s[i] && t == CL_SUCCESS, "3/4 max buffer %d: create %d use %d", i, err, t);
  }
  if (cltest_pooling())
    CHECK(cltest_stat("oom_retries") >= 1, "oom_retries %ld", cltest_stat("oom_retries"));
  for (int i = 0; i < 2; i++)
    if (s[i]) clReleaseMemObject(s[i]);
  clReleaseMemObject(full[0]);
}

int main(void) {
  cltest_pick_device();
  ctx = cltest_context();
  q = cltest_queue(ctx);
  cl_device_type t = 0;
  clGetDeviceInfo(cltest_device, CL_DEVICE_TYPE, sizeof t, &t, NULL);
  if (t & CL_DEVICE_TYPE_CPU) cpu_mode();
  else gpu_mode();
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return cltest_finish("oom");
}
