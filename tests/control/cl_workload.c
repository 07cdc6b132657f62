/* An unmodified OpenCL program for the control tests (run under gpupool by
 * LD_PRELOAD or `gpupool run`). It knows nothing of gpupool except that it
 * prints gpupool_stats_json() at the end when that symbol exists.
 *
 *   cl_workload storm THREADS SECONDS  create/release buffers from THREADS
 *                                      threads for SECONDS, then print stats
 *   cl_workload serve                  keep 3 buffers, release 7, print
 *                                      "ready PID", wait for stdin to close
 *   cl_workload once                   create and release a few buffers
 */
#include <CL/cl.h>
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static cl_context ctx;
static volatile int stop;
static unsigned long long allocations[64];

static void die(const char* what, cl_int err) {
  fprintf(stderr, "cl_workload: %s failed: %d\n", what, err);
  exit(3);
}

static void* churn(void* arg) {
  const unsigned id = (unsigned)(uintptr_t)arg;
  unsigned seed = 1234 + id;
  static const size_t sizes[] = {256, 1000, 4096, 65536, 100000, 1 << 20};
  cl_mem mine[16];
  int n = 0;
  while (!stop) {
    if (n < 16 && (n == 0 || rand_r(&seed) % 2)) {
      cl_int err;
      const size_t size = sizes[rand_r(&seed) % 6] - rand_r(&seed) % 7;
      cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &err);
      if (!m) die("clCreateBuffer", err);
      mine[n++] = m;
      allocations[id]++;
    } else {
      const int i = rand_r(&seed) % n;
      cl_int err = clReleaseMemObject(mine[i]);
      if (err != CL_SUCCESS) die("clReleaseMemObject", err);
      mine[i] = mine[--n];
    }
  }
  while (n > 0) clReleaseMemObject(mine[--n]);
  return NULL;
}

static void print_stats(void) {
  size_t (*stats_json)(char*, size_t) =
      (size_t (*)(char*, size_t))dlsym(RTLD_DEFAULT, "gpupool_stats_json");
  if (!stats_json) {
    printf("stats: gpupool not loaded\n");
    return;
  }
  size_t n = stats_json(NULL, 0);
  char* buf = malloc(n + 1);
  stats_json(buf, n + 1);
  printf("stats: %s", buf);
  free(buf);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: cl_workload storm THREADS SECONDS | serve | once\n");
    return 2;
  }
  cl_platform_id platform;
  cl_device_id device;
  cl_int err = clGetPlatformIDs(1, &platform, NULL);
  if (err != CL_SUCCESS) die("clGetPlatformIDs", err);
  err = clGetDeviceIDs(platform, CL_DEVICE_TYPE_ALL, 1, &device, NULL);
  if (err != CL_SUCCESS) die("clGetDeviceIDs", err);
  ctx = clCreateContext(NULL, 1, &device, NULL, NULL, &err);
  if (!ctx) die("clCreateContext", err);

  if (!strcmp(argv[1], "storm") && argc == 4) {
    const int threads = atoi(argv[2]);
    const double seconds = atof(argv[3]);
    /* gpupool starts at the first OpenCL call it intercepts: make it
       happen before "ready", after which signals come. */
    cl_mem warm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    if (!warm) die("clCreateBuffer", err);
    clReleaseMemObject(warm);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; ++i)
      pthread_create(&t[i], NULL, churn, (void*)(uintptr_t)i);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    stop = 1;
    unsigned long long total = 0;
    for (int i = 0; i < threads && i < 64; ++i) {
      pthread_join(t[i], NULL);
      total += allocations[i];
    }
    printf("allocations: %llu\n", total);
    print_stats();
  } else if (!strcmp(argv[1], "serve")) {
    cl_mem m[10];
    for (int i = 0; i < 10; ++i) {
      m[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 10000 * (i + 1), NULL, &err);
      if (!m[i]) die("clCreateBuffer", err);
    }
    for (int i = 0; i < 7; ++i) clReleaseMemObject(m[i]);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    /* Wait for stdin to close, waking every 100 ms: ThreadSanitizer runs a
       signal handler that lands in a restarted read() only when the thread
       next passes through one of its interceptors. */
    char c;
    for (;;) {
      struct pollfd in = {0, POLLIN, 0};
      /* Interrupted by a signal (-1, EINTR) is not readable either: a read()
         then would block with the signal's handler held back. */
      if (poll(&in, 1, 100) <= 0) continue;
      if (read(0, &c, 1) <= 0) break;
    }
    for (int i = 7; i < 10; ++i) clReleaseMemObject(m[i]);
    print_stats();
  } else if (!strcmp(argv[1], "once")) {
    for (int i = 0; i < 4; ++i) {
      cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
      if (!a) die("clCreateBuffer", err);
      clReleaseMemObject(a);
    }
  } else {
    fprintf(stderr, "cl_workload: unknown mode %s\n", argv[1]);
    return 2;
  }
  fflush(stdout);
  clReleaseContext(ctx);
  return 0;
}
