/* OpenCL checks and create/release benchmarks on a real GPU (NVIDIA's
 * OpenCL on the H100), run by scripts/gpu/harness.sh without and under gpupool.
 * Also runs on PoCL (where out of memory cannot be reached: PoCL overcommits
 * host memory, so that check reports SKIP).
 *
 *   opencl_gpu_check check [--label L]   PASS/FAIL/SAME/INFO lines, exit 1 on FAIL
 *   opencl_gpu_check bench --label L     JSON lines like tests/gpu/bench_alloc
 *
 * The platform is the first one with a GPU device (else the first device of
 * any kind), or the first whose name contains $GPU_CHECK_CL_PLATFORM.
 *
 * The out-of-memory check: fill the device with buffers of one size (each
 * made real by a migrate, since NVIDIA allocates at first use), release them
 * all (gpupool holds them), then fill it with buffers of another size. Without
 * release-and-retry the second fill stops at once. Where the error surfaces
 * (at create: gpupool's probe; at the first command: the driver's deferred
 * allocation) is reported. */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures = 0;

static void line(const char* kind, const char* name, const char* f, ...) {
  va_list ap;
  va_start(ap, f);
  printf("%s %s: ", kind, name);
  vprintf(f, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  if (!strcmp(kind, "FAIL")) ++failures;
}
#define CHECK(ok, name, ...) line((ok) ? "PASS" : "FAIL", name, __VA_ARGS__)

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static cl_context ctx;
static cl_command_queue queue;
static cl_device_id dev;
static cl_ulong max_alloc, global_mem;

static int setup(void) {
  cl_platform_id plats[16];
  cl_uint np = 0;
  cl_int err = clGetPlatformIDs(16, plats, &np);
  if (err != CL_SUCCESS || np == 0) {
    printf("FAIL setup: clGetPlatformIDs -> %d, %u platforms\n", err, np);
    return 0;
  }
  const char* want = getenv("GPU_CHECK_CL_PLATFORM");
  int chosen = -1;
  for (int pass = 0; pass < 2 && chosen < 0; ++pass) {
    for (cl_uint i = 0; i < np && chosen < 0; ++i) {
      char name[256] = {0};
      clGetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
      if (want && *want && !strstr(name, want)) continue;
      cl_device_type type = pass == 0 ? CL_DEVICE_TYPE_GPU : CL_DEVICE_TYPE_ALL;
      cl_uint nd = 0;
      if (clGetDeviceIDs(plats[i], type, 1, &dev, &nd) == CL_SUCCESS && nd > 0) chosen = (int)i;
    }
  }
  if (chosen < 0) {
    printf("FAIL setup: no OpenCL device found\n");
    return 0;
  }
  char pname[256] = {0}, dname[256] = {0}, dver[256] = {0};
  clGetPlatformInfo(plats[chosen], CL_PLATFORM_NAME, sizeof pname, pname, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof dver, dver, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof max_alloc, &max_alloc, NULL);
  clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global_mem, &global_mem, NULL);
  fprintf(stderr,
          "opencl_gpu_check: platform \"%s\", device \"%s\" (%s), max alloc %llu, global %llu\n",
          pname, dname, dver, (unsigned long long)max_alloc, (unsigned long long)global_mem);
  ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (err != CL_SUCCESS) {
    printf("FAIL setup: clCreateContext -> %d\n", err);
    return 0;
  }
  queue = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  if (err != CL_SUCCESS) {
    printf("FAIL setup: clCreateCommandQueue -> %d\n", err);
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */

static cl_event gate;
static atomic_int gate_opened = 0; /* 1: by the watchdog, 2: by main */
static atomic_int gate_done = 0;

static void open_gate(void) {
  int expected = 0;
  if (atomic_compare_exchange_strong(&gate_opened, &expected, 2))
    clSetUserEventStatus(gate, CL_COMPLETE);
  atomic_store(&gate_done, 1);
}

static void* open_gate_later(void* arg) {
  (void)arg;
  for (int i = 0; i < 300 && !atomic_load(&gate_done); ++i) usleep(10000);
  int expected = 0;
  if (atomic_compare_exchange_strong(&gate_opened, &expected, 1))
    clSetUserEventStatus(gate, CL_COMPLETE);
  return NULL;
}

static void check_basics(void) {
  cl_int err;
  /* Size 0 and over the device maximum: the implementation's own errors. */
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err);
  CHECK(m == NULL && err == CL_INVALID_BUFFER_SIZE, "cl.size0", "err=%d (spec: %d)", err,
        CL_INVALID_BUFFER_SIZE);
  m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)max_alloc + 1, NULL, &err);
  line("SAME", "cl.size-over-max", "%d", err);
  if (m) clReleaseMemObject(m);
  m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, (size_t)max_alloc, NULL, &err);
  line("SAME", "cl.size-max", "%d", err);
  if (m) clReleaseMemObject(m);
  m = clCreateBuffer(NULL, CL_MEM_READ_WRITE, 4096, NULL, &err);
  line("SAME", "cl.null-context", "%d", err);
  if (m) clReleaseMemObject(m);
  m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_READ_ONLY, 4096, NULL, &err);
  line("SAME", "cl.bad-flags", "%d", err);
  if (m) clReleaseMemObject(m);

  /* COPY_HOST_PTR data on a reused buffer, and CL_MEM_SIZE the requested size. */
  const size_t n = 1000003;
  unsigned char* a = malloc(n);
  unsigned char* back = malloc(n);
  size_t bad = 0;
  int errs = 0;
  for (int round = 0; round < 4; ++round) {
    memset(a, 0x30 + round, n);
    m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, a, &err);
    if (!m) {
      ++errs;
      continue;
    }
    size_t sz = 0;
    cl_uint refs = 0;
    clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof sz, &sz, NULL);
    clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof refs, &refs, NULL);
    if (sz != n || refs != 1) ++errs;
    memset(back, 0, n);
    if (clEnqueueReadBuffer(queue, m, CL_TRUE, 0, n, back, 0, NULL, NULL) != CL_SUCCESS) ++errs;
    for (size_t i = 0; i < n; ++i) bad += back[i] != (unsigned char)(0x30 + round);
    clReleaseMemObject(m);
  }
  CHECK(bad == 0 && errs == 0, "cl.copy-host-ptr-reuse",
        "4 rounds of create(COPY_HOST_PTR)+read+release: %zu wrong bytes, %d errors", bad, errs);

  /* Deferred deletion: a copy gated by a user event reads a buffer that the
   * program releases; a buffer created next and filled from a second queue
   * must not be the same memory. A watchdog thread opens the gate after 3 s
   * in case clCreateBuffer waits for the gated copy (which would deadlock a
   * program that opens the gate only later): that is reported as a failure. */
  cl_mem b1 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
  gate = clCreateUserEvent(ctx, &err);
  unsigned pat1 = 0x11111111u, pat2 = 0x22222222u;
  cl_mem dst = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
  clEnqueueFillBuffer(queue, b1, &pat1, 4, 0, 1 << 20, 0, NULL, NULL);
  clFinish(queue);
  cl_int e1 = clEnqueueCopyBuffer(queue, b1, dst, 0, 0, 1 << 20, 1, &gate, NULL);
  pthread_t watchdog;
  pthread_create(&watchdog, NULL, open_gate_later, NULL);
  clReleaseMemObject(b1);
  double t0 = now_ns();
  cl_mem b2 = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 1 << 20, NULL, &err);
  double create_ms = (now_ns() - t0) / 1e6;
  int opened_by_watchdog = atomic_load(&gate_opened);
  cl_command_queue q2 = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
  cl_int e2 = b2 ? clEnqueueFillBuffer(q2, b2, &pat2, 4, 0, 1 << 20, 0, NULL, NULL) : -1;
  clFinish(q2);
  open_gate();
  pthread_join(watchdog, NULL);
  clFinish(queue);
  unsigned* words = malloc(1 << 20);
  clEnqueueReadBuffer(queue, dst, CL_TRUE, 0, 1 << 20, words, 0, NULL, NULL);
  size_t wrong = 0;
  for (size_t i = 0; i < (1 << 20) / 4; ++i) wrong += words[i] != pat1;
  CHECK(e1 == CL_SUCCESS && e2 == CL_SUCCESS && wrong == 0, "cl.deferred-deletion",
        "copy/fill err=%d/%d; %zu of %d words of the released buffer overwritten", e1, e2, wrong,
        (1 << 20) / 4);
  CHECK(!opened_by_watchdog, "cl.deferred-deletion-no-wait",
        "clCreateBuffer took %.1f ms with a gated command pending on a released buffer%s",
        create_ms,
        opened_by_watchdog ? " (it waited for the gate: a deadlock for real programs)" : "");
  free(words);
  if (b2) clReleaseMemObject(b2);
  clReleaseMemObject(dst);
  clReleaseEvent(gate);
  clReleaseCommandQueue(q2);
  free(a);
  free(back);
}

/* One buffer of `size` made real: returns NULL and sets *where on failure. */
static cl_mem real_buffer(size_t size, cl_int* err, const char** where) {
  cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, err);
  if (!m) {
    *where = "create";
    return NULL;
  }
  *err = clEnqueueMigrateMemObjects(queue, 1, &m, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0, NULL,
                                    NULL);
  if (*err == CL_SUCCESS) *err = clFinish(queue);
  if (*err != CL_SUCCESS) {
    *where = "first command";
    clReleaseMemObject(m);
    clFinish(queue);
    return NULL;
  }
  return m;
}

static void check_oom(void) {
  /* Sizes under the max allocation; the byte budget keeps an overcommitting
   * runtime (PoCL) from filling the host: there the check is skipped. */
  size_t s1 = (size_t)48 << 20, s2 = (size_t)32 << 20; /* pooled sizes */
  if (s1 > max_alloc / 2) s1 = (size_t)(max_alloc / 2);
  if (s2 > max_alloc / 3) s2 = (size_t)(max_alloc / 3);
  double budget = 2.5 * (double)global_mem;
  const size_t cap = 65536;
  cl_mem* v = calloc(cap, sizeof(cl_mem));
  size_t n1 = 0, n2 = 0;
  cl_int err = CL_SUCCESS;
  const char* where = "none";
  double t0 = now_ns();
  while (n1 < cap && (double)(n1 + 1) * s1 <= budget) {
    cl_mem m = real_buffer(s1, &err, &where);
    if (!m) break;
    v[n1++] = m;
  }
  if (err == CL_SUCCESS) {
    line("INFO", "cl.oom",
         "SKIP: %zu buffers of %zu MiB (%.1f x global memory) all succeeded: "
         "this runtime overcommits",
         n1, s1 >> 20, (double)n1 * s1 / (double)global_mem);
    for (size_t i = 0; i < n1; ++i) clReleaseMemObject(v[i]);
    free(v);
    return;
  }
  line("INFO", "cl.oom-first-fill", "%zu x %zu MiB, then err %d at %s", n1, s1 >> 20, err, where);
  for (size_t i = 0; i < n1; ++i) clReleaseMemObject(v[i]);
  clFinish(queue);
  err = CL_SUCCESS;
  where = "none";
  while (n2 < cap && (double)(n2 + 1) * s2 <= budget) {
    cl_mem m = real_buffer(s2, &err, &where);
    if (!m) break;
    v[n2++] = m;
  }
  double b1 = (double)n1 * s1, b2 = (double)n2 * s2;
  /* Requested bytes; gpupool's bin rounding (under 1/16 by default) may
     leave the second fill up to 1/16 short even with every held buffer
     given back. */
  CHECK(err != CL_SUCCESS && b2 >= b1 * (1 - 1.0 / 16) - 1024.0 * 1024 * 1024,
        "cl.oom-refill-other-size",
        "%zu x %zu MiB = %.1f GiB after %.1f GiB of %zu MiB buffers; then err %d at %s", n2,
        s2 >> 20, b2 / (1 << 30), b1 / (1 << 30), s1 >> 20, err, where);
  line("INFO", "cl.oom-error-at", "%s", where);
  for (size_t i = 0; i < n2; ++i) clReleaseMemObject(v[i]);
  clFinish(queue);
  /* And the first size again. */
  cl_mem m = real_buffer(s1, &err, &where);
  CHECK(m != NULL, "cl.oom-after", "a %zu MiB buffer after the fills: err %d", s1 >> 20,
        m ? 0 : err);
  if (m) clReleaseMemObject(m);
  line("INFO", "cl.oom-time", "%.0f ms", (now_ns() - t0) / 1e6);
  free(v);
}

/* ------------------------------------------------------------------------ */

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

/* ns per pair: median of up to 15 batches (>= 1 ms each, ~150 ms in all).
 * use=1: each buffer gets a 4-byte fill and the queue is finished before the
 * release, as a program would use it (NVIDIA allocates at first use). */
static double bench_pairs(size_t size, int use, const char* label) {
  cl_int err;
  unsigned pat = 7;
  long k = 1;
  double per[16];
  int reps = 0;
  double one = 0, start = 0;
#define PAIRS(K)                                                          \
  for (long i_ = 0; i_ < (K); ++i_) {                                     \
    cl_mem m_ = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err); \
    if (!m_) {                                                            \
      fprintf(stderr, "opencl_gpu_check: create %zu -> %d\n", size, err); \
      return -1;                                                          \
    }                                                                     \
    if (use) {                                                            \
      clEnqueueFillBuffer(queue, m_, &pat, 4, 0, 4, 0, NULL, NULL);       \
      clFinish(queue);                                                    \
    }                                                                     \
    clReleaseMemObject(m_);                                               \
  }
  PAIRS(2); /* cold: first-use setup (kernels for fills) stays out */
  for (;;) {
    double t = now_ns();
    PAIRS(k);
    one = now_ns() - t;
    if (one >= 1e6 || k >= (1L << 20)) break;
    k *= one < 1e4 ? 16 : 2;
  }
  per[reps++] = one / k;
  start = now_ns();
  while (reps < 15 && (reps < 3 || now_ns() - start < 150e6)) {
    double t = now_ns();
    PAIRS(k);
    per[reps++] = (now_ns() - t) / k;
  }
#undef PAIRS
  qsort(per, reps, sizeof per[0], cmp_double);
  printf(
      "{\"bench\":\"%s\",\"label\":\"%s\",\"size\":%zu,\"threads\":1,\"ns\":%.1f,\"reps\":%d,"
      "\"iters\":%ld}\n",
      use ? "cl_pair_use" : "cl_pair", label, size, per[reps / 2], reps, k);
  fflush(stdout);
  return per[reps / 2];
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "check";
  const char* label = "raw";
  for (int i = 2; i + 1 < argc; ++i)
    if (!strcmp(argv[i], "--label")) label = argv[i + 1];
  if (strcmp(mode, "check") && strcmp(mode, "bench")) {
    fprintf(stderr, "usage: %s check|bench [--label NAME]\n", argv[0]);
    return 2;
  }
  if (!setup()) return 1;
  if (!strcmp(mode, "bench")) {
    size_t sizes[] = {4096, 65536, 1 << 20, 16 << 20, 256 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; ++i) {
      if (sizes[i] > max_alloc) continue;
      bench_pairs(sizes[i], 0, label);
      bench_pairs(sizes[i], 1, label);
    }
  } else {
    check_basics();
    check_oom();
    printf("DONE %d failure(s)\n", failures);
  }
  clReleaseCommandQueue(queue);
  clReleaseContext(ctx);
  return failures ? 1 : 0;
}
