/* An unmodified OpenCL program for the control tests (run under gpupool by
 * LD_PRELOAD or `gpupool run`). It knows nothing of gpupool except that it
 * prints gpupool_stats_json() at the end when that symbol exists.
 *
 *   cl_workload storm THREADS SECONDS  create/release buffers from THREADS
 *                                      threads for SECONDS, then print stats
 *   cl_workload serve                  keep 3 buffers, release 7, print
 *                                      "ready PID", wait for stdin to close
 *   cl_workload once                   create and release a few buffers
 *   cl_workload api THREADS ROUNDS TRACE
 *                                      create/release buffers from THREADS
 *                                      threads while the main thread calls
 *                                      gpupool's C API (docs/c-api.md):
 *                                      ROUNDS times a trace into TRACE
 *                                      started and stopped, the peaks reset,
 *                                      the stats and the snapshot read,
 *                                      held blocks freed; then print stats
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

/* gpupool's C API, looked up (it must be loaded for the api mode). */
static void* api(const char* name) {
  void* f = dlsym(RTLD_DEFAULT, name);
  if (!f) {
    fprintf(stderr, "cl_workload: %s not found: is gpupool loaded?\n", name);
    exit(3);
  }
  return f;
}

static void call_api(int rounds, const char* trace) {
  int (*start)(const char*, char*, size_t) =
      (int (*)(const char*, char*, size_t))api("gpupool_trace_start");
  int (*stop)(char*, size_t) = (int (*)(char*, size_t))api("gpupool_trace_stop");
  int (*reset)(void) = (int (*)(void))api("gpupool_reset_peak");
  int (*free_held)(void) = (int (*)(void))api("gpupool_free_held");
  size_t (*stats)(char*, size_t) = (size_t(*)(char*, size_t))api("gpupool_stats_json");
  size_t (*snapshot)(char*, size_t) = (size_t(*)(char*, size_t))api("gpupool_snapshot_json");
  static char buf[1 << 20];
  char msg[512];
  for (int r = 0; r < rounds; ++r) {
    if (start(trace, msg, sizeof msg) != 0) {
      fprintf(stderr, "cl_workload: gpupool_trace_start: %s\n", msg);
      exit(4);
    }
    /* A second start while it runs is refused, and changes nothing. */
    if (start(trace, msg, sizeof msg) == 0 || !strstr(msg, "already running")) {
      fprintf(stderr, "cl_workload: a second gpupool_trace_start: %s\n", msg);
      exit(4);
    }
    if (reset() != 0 || stats(buf, sizeof buf) == 0 || snapshot(buf, sizeof buf) == 0) {
      fprintf(stderr, "cl_workload: reset, stats or snapshot failed\n");
      exit(4);
    }
    if (stop(msg, sizeof msg) != 0) {
      fprintf(stderr, "cl_workload: gpupool_trace_stop: %s\n", msg);
      exit(4);
    }
    if (stop(msg, sizeof msg) == 0 || free_held() != 0) {
      fprintf(stderr, "cl_workload: a second gpupool_trace_stop did not fail, or free_held did\n");
      exit(4);
    }
  }
}

static void print_stats(void) {
  size_t (*stats_json)(char*, size_t) =
      (size_t(*)(char*, size_t))dlsym(RTLD_DEFAULT, "gpupool_stats_json");
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
    fprintf(stderr,
            "usage: cl_workload storm THREADS SECONDS | serve | once | api THREADS ROUNDS TRACE\n");
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

  const int api_mode = !strcmp(argv[1], "api") && argc == 5;
  if ((!strcmp(argv[1], "storm") && argc == 4) || api_mode) {
    const int threads = atoi(argv[2]);
    const double seconds = api_mode ? 0 : atof(argv[3]);
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
    if (api_mode) {
      call_api(atoi(argv[3]), argv[4]);
    } else {
      struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
      while (nanosleep(&ts, &ts) != 0) {
      }
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
