/* One process on a shared GPU, for tests of processes that share a device
 * (gpupool's good-neighbour behaviour) driven line by line from a script.
 *
 * Plain driver API from cuda.h only, so the same program runs on a real GPU:
 *   cc -O2 neighbour.c -lcuda -I/usr/local/cuda/include
 * (in this project's build it links the stand-in libcuda.so.1).
 *
 *   neighbour hold BLOCK_MIB COUNT
 *       allocate COUNT blocks, print "allocated <n>", free them, print
 *       "held" (under gpupool the pool now holds them); then read stdin until
 *       EOF or "exit":
 *         alloc K   allocate K more blocks, keep them: "allocated <k>"
 *         free      free the kept blocks: "freed"
 *         info      "free <bytes> total <bytes>"
 *         infos N   N calls of cuMemGetInfo_v2: "infos" and how long each
 *                   took, in microseconds
 *         ctx       create one more context on the device (cuCtxCreate), make
 *                   the primary context current again: "ctx <CUresult>"
 *                   (the memory a context takes shows up on the device;
 *                   the extra contexts are destroyed at exit)
 *         stdio     close 0, 1 and 2 (a daemon about to reopen them), talking
 *                   on copies of stdin and stdout meanwhile: "closed"; count
 *                   how often one of 0-2 was open until the line "reopen",
 *                   then open /dev/null three times:
 *                   "reopened <fd> <fd> <fd> taken <count>" (0 1 2 expected);
 *                   stdin and stdout are the copies again, stderr /dev/null
 *   neighbour grab BLOCK_MIB [INTERVAL_MS [MAX_BLOCKS]]
 *       allocate until the allocation fails (or MAX_BLOCKS), INTERVAL_MS apart:
 *       "block <i> <microseconds that call took>" per block, then
 *       "got <n> blocks <bytes> bytes err <failing call's CUresult or 0>";
 *       free them all, exit 0.
 *   neighbour info
 *       "free <bytes> total <bytes>" (cuMemGetInfo_v2).
 *
 * A last argument "host" makes hold's and grab's blocks pinned host memory
 * (cuMemHostAlloc(&p, bytes, 0) / cuMemFreeHost) instead of device memory,
 * with the same output lines, for neighbours that compete for pinned memory:
 *   neighbour hold BLOCK_MIB COUNT host
 *   neighbour grab BLOCK_MIB [INTERVAL_MS [MAX_BLOCKS]] host
 * ("info" still reports device memory.) A last argument "async" makes them
 * stream-ordered allocations of the device's default memory pool
 * (cuMemAllocAsync / cuMemFreeAsync on the legacy stream, which is
 * synchronized after each round of frees: the driver's pool then keeps
 * nothing, its release threshold being 0, unless gpupool manages it).
 *
 * NEIGHBOUR_START_DELAY_MS: wait that long after the context exists, before
 * the command (a program that loads a model before it allocates).
 *
 * Every line is flushed at once; errors go to stderr with exit status 1.
 * Device 0, or the ordinal in NEIGHBOUR_DEVICE (so that two processes can
 * name one GPU by different ordinals, with CUDA_VISIBLE_DEVICES). */
#define _POSIX_C_SOURCE 200809L
#include <cuda.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

__attribute__((format(printf, 1, 2))) static void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  putchar('\n');
  fflush(stdout);
}

static void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  fprintf(stderr, "neighbour: %s failed: %d\n", what, (int)r);
  exit(1);
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void sleep_ms(long ms) {
  if (ms <= 0) return;
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Blocks are pinned host memory rather than device memory ("host"), or
   stream-ordered device memory ("async"). */
static int g_host, g_async;

/* One block of either kind; a host pointer is kept as a CUdeviceptr. */
static CUresult alloc_one(CUdeviceptr* p, size_t bytes) {
  if (g_async) return cuMemAllocAsync(p, bytes, NULL);
  if (!g_host) return cuMemAlloc_v2(p, bytes);
  void* h = NULL;
  const CUresult r = cuMemHostAlloc(&h, bytes, 0);
  if (r == CUDA_SUCCESS) *p = (CUdeviceptr)(uintptr_t)h;
  return r;
}

static void free_one(CUdeviceptr p) {
  if (g_async) check(cuMemFreeAsync(p, NULL), "cuMemFreeAsync");
  else if (g_host) check(cuMemFreeHost((void*)(uintptr_t)p), "cuMemFreeHost");
  else check(cuMemFree_v2(p), "cuMemFree_v2");
}

/* A growing list of blocks. */
typedef struct Blocks {
  CUdeviceptr* p;
  size_t n, cap;
} Blocks;

static void push(Blocks* b, CUdeviceptr p) {
  if (b->n == b->cap) {
    b->cap = b->cap ? 2 * b->cap : 64;
    b->p = (CUdeviceptr*)realloc(b->p, b->cap * sizeof *b->p);
    if (!b->p) {
      fprintf(stderr, "neighbour: out of host memory\n");
      exit(1);
    }
  }
  b->p[b->n++] = p;
}

static void free_all(Blocks* b) {
  for (size_t i = 0; i < b->n; ++i) free_one(b->p[i]);
  b->n = 0;
  if (g_async) check(cuStreamSynchronize(NULL), "cuStreamSynchronize");
}

/* Allocates up to `count` blocks into `b`; the number it got. */
static size_t alloc_blocks(Blocks* b, size_t bytes, size_t count) {
  size_t got = 0;
  for (; got < count; ++got) {
    CUdeviceptr p;
    if (alloc_one(&p, bytes) != CUDA_SUCCESS) break;
    push(b, p);
  }
  return got;
}

static void info(void) {
  size_t free_bytes = 0, total = 0;
  check(cuMemGetInfo_v2(&free_bytes, &total), "cuMemGetInfo_v2");
  say("free %zu total %zu", free_bytes, total);
}

static void infos(unsigned long long n) {
  size_t free_bytes = 0, total = 0;
  printf("infos");
  for (unsigned long long i = 0; i < n; ++i) {
    const double t0 = now_us();
    check(cuMemGetInfo_v2(&free_bytes, &total), "cuMemGetInfo_v2");
    printf(" %.0f", now_us() - t0);
  }
  say("%s", "");
}

/* Contexts made by "ctx", destroyed when hold ends. */
static CUcontext* g_extra;
static size_t g_n_extra;

/* One more context on the device; the primary (current before) stays current:
   cuCtxCreate pushes the new one, popping it leaves the primary on top. */
static CUresult extra_context(void) {
  g_extra = (CUcontext*)realloc(g_extra, (g_n_extra + 1) * sizeof *g_extra);
  if (!g_extra) {
    fprintf(stderr, "neighbour: out of host memory\n");
    exit(1);
  }
  CUdevice dev;
  check(cuCtxGetDevice(&dev), "cuCtxGetDevice");
  CUcontext c = NULL;
#if CUDA_VERSION >= 13000 /* cuCtxCreate is cuCtxCreate_v4 (creation params) */
  const CUresult r = cuCtxCreate(&c, NULL, 0, dev);
#else
  const CUresult r = cuCtxCreate(&c, 0, dev);
#endif
  if (r != CUDA_SUCCESS) return r;
  g_extra[g_n_extra++] = c;
  CUcontext popped = NULL;
  check(cuCtxPopCurrent(&popped), "cuCtxPopCurrent");
  if (popped != c) {
    fprintf(stderr, "neighbour: cuCtxPopCurrent popped another context\n");
    exit(1);
  }
  return r;
}

static void destroy_extra(void) {
  while (g_n_extra > 0) check(cuCtxDestroy(g_extra[--g_n_extra]), "cuCtxDestroy");
}

static void stdio_closed(void) {
  fflush(stdout);
  const int in = fcntl(0, F_DUPFD_CLOEXEC, 10), out = fcntl(1, F_DUPFD_CLOEXEC, 10);
  if (in < 0 || out < 0) check(CUDA_ERROR_UNKNOWN, "fcntl(F_DUPFD)");
  close(0);
  close(1);
  close(2);
  dprintf(out, "closed\n");
  long taken = 0;
  for (char c = 0; c != '\n';) {
    for (int fd = 0; fd <= 2; ++fd) taken += fcntl(fd, F_GETFD) >= 0;
    struct pollfd p = {in, POLLIN, 0};
    if (poll(&p, 1, 0) > 0 && read(in, &c, 1) <= 0) break;
  }
  const int a = open("/dev/null", O_RDONLY), b = open("/dev/null", O_WRONLY),
            e = open("/dev/null", O_WRONLY);
  dprintf(out, "reopened %d %d %d taken %ld\n", a, b, e, taken);
  dup2(in, 0);
  dup2(out, 1);
  close(in);
  close(out);
}

static int hold(size_t bytes, size_t count) {
  Blocks b = {0};
  say("allocated %zu", alloc_blocks(&b, bytes, count));
  free_all(&b);
  say("held");
  char line[256];
  while (fgets(line, sizeof line, stdin)) {
    line[strcspn(line, "\r\n")] = 0;
    unsigned long long k;
    if (strcmp(line, "exit") == 0) break;
    if (sscanf(line, "alloc %llu", &k) == 1) {
      say("allocated %zu", alloc_blocks(&b, bytes, (size_t)k));
    } else if (strcmp(line, "free") == 0) {
      free_all(&b);
      say("freed");
    } else if (sscanf(line, "infos %llu", &k) == 1) {
      infos(k);
    } else if (strcmp(line, "info") == 0) {
      info();
    } else if (strcmp(line, "ctx") == 0) {
      say("ctx %d", (int)extra_context());
    } else if (strcmp(line, "stdio") == 0) {
      stdio_closed();
    } else if (line[0]) {
      fprintf(stderr, "neighbour: unknown command '%s'\n", line);
    }
  }
  free_all(&b);
  free(b.p);
  destroy_extra();
  return 0;
}

static int grab(size_t bytes, long interval_ms, size_t max_blocks) {
  Blocks b = {0};
  CUresult err = CUDA_SUCCESS;
  while (b.n < max_blocks) {
    if (b.n > 0) sleep_ms(interval_ms);
    CUdeviceptr p;
    const double t0 = now_us();
    err = alloc_one(&p, bytes);
    const double t1 = now_us();
    if (err != CUDA_SUCCESS) break;
    push(&b, p);
    say("block %zu %.0f", b.n - 1, t1 - t0);
  }
  say("got %zu blocks %zu bytes err %d", b.n, b.n * bytes, (int)err);
  free_all(&b);
  free(b.p);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: neighbour hold BLOCK_MIB COUNT [host|async]\n"
          "       neighbour grab BLOCK_MIB [INTERVAL_MS [MAX_BLOCKS]] [host|async]\n"
          "       neighbour info\n");
  exit(2);
}

int main(int argc, char** argv) {
  if (argc < 2) usage();
  check(cuInit(0), "cuInit");
  CUdevice dev;
  const char* ordinal = getenv("NEIGHBOUR_DEVICE");
  check(cuDeviceGet(&dev, ordinal && *ordinal ? atoi(ordinal) : 0), "cuDeviceGet");
  CUcontext ctx;
  check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
  const char* delay = getenv("NEIGHBOUR_START_DELAY_MS");
  if (delay && *delay) sleep_ms(strtol(delay, NULL, 0));

  const char* cmd = argv[1];
  if (argc > 3 && strcmp(cmd, "info") != 0 &&
      (strcmp(argv[argc - 1], "host") == 0 || strcmp(argv[argc - 1], "async") == 0)) {
    g_host = strcmp(argv[argc - 1], "host") == 0;
    g_async = !g_host;
    --argc;
  }
  if (strcmp(cmd, "info") == 0 && argc == 2) {
    info();
    return 0;
  }
  if (argc < 3) usage();
  const size_t bytes = (size_t)strtoull(argv[2], NULL, 0) << 20;
  if (bytes == 0) usage();
  if (strcmp(cmd, "hold") == 0 && argc == 4) return hold(bytes, (size_t)strtoull(argv[3], NULL, 0));
  if (strcmp(cmd, "grab") == 0 && argc <= 5) {
    const long interval = argc > 3 ? strtol(argv[3], NULL, 0) : 0;
    const size_t max = argc > 4 ? (size_t)strtoull(argv[4], NULL, 0) : (size_t)-1;
    return grab(bytes, interval, max);
  }
  usage();
  return 2;
}
