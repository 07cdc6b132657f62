/* An unmodified GPU program that does what real programs do to the process
 * around them: close descriptors it did not open, fork, exit with a full
 * stderr, create and destroy contexts by the thousand, start children
 * without gpupool. It knows nothing of gpupool; run_host.py runs it with and
 * without it and checks what the program (and the files around it) saw.
 *
 *   host_program API SCENARIO [ARGS]      API: opencl (PoCL) or cuda (the
 *                                         stand-in libcuda.so.1, by dlopen)
 *   closefrom FILE   close every descriptor from 3 up, make a pipe and a
 *                    file of its own, say "ready", wait for a line on
 *                    stdin, then check both still hold what it put there
 *   stdio OUT ERR    close 0, 1 and 2 first, ask for a stats dump; 0-2 stay
 *                    free while closed, its next three opens get them back,
 *                    and the dump happens once they are open
 *   stdio-kept-closed  close 0, 1 and 2, ask for a stats dump, which must
 *                    still come
 *   stdio-race SECONDS  for that long, close 0, 1 and 2 and reopen them
 *                    (stderr: the original one, a pipe, reopened), checking
 *                    that the opens got exactly 0, 1 and 2 while gpupool
 *                    dumps and logs around it; print "rounds N wrong W"
 *   serve            say "ready PID", wait for stdin to close
 *   fork-busy N      fork N children (each allocates, then exit()s) while
 *                    a thread allocates; a child not gone in 20 s is hung
 *   fork-signal N    allocate and free while SIGALRM comes every 500 us;
 *                    its handler forks a child that _exit()s, N times
 *                    (crash handlers fork from a handler that may have
 *                    interrupted any call), but not where it interrupted
 *                    malloc (known where malloc_guard.c is preloaded)
 *   cancel-state N   the program cancels a thread once; then N calls of a
 *                    gpupool function while a signal handler calls one
 *                    too (SIGUSR1, sent without pause): after each call
 *                    the thread's cancel state must be what it was
 *   cancel N         N rounds: two threads allocate and free, calling
 *                    pthread_testcancel() between calls, until the main
 *                    thread cancels and joins them
 *   fork-alloc       fork a child that creates buffers in the parent's
 *                    context, releases one the parent made and keeps one
 *                    of 5 MiB (a leak: reports must show it)
 *   fork-unseen      (OpenCL) create a context through the loader's own
 *                    clCreateContext (dlsym on libOpenCL.so.1, past the
 *                    preloaded export), make no buffer, fork: the child
 *                    makes a queue and buffers in that context (its only
 *                    device work on PoCL: the parent's device threads are
 *                    not in a child) and checks their size; then the
 *                    parent writes and reads back buffers there; print
 *                    "child status S" and "parent data ok|bad"
 *   fork-own looked|looked-past|fresh  (OpenCL) the parent looks up the
 *                    platform and device (looked; looked-past: through the
 *                    loader's own functions, dlsym on libOpenCL.so.1, past
 *                    the preloaded exports) or makes no OpenCL call at all
 *                    (fresh), then forks: the child looks them up if the parent did
 *                    not, creates a context of its own and makes and
 *                    releases 20 buffers there (every other one
 *                    COPY_HOST_PTR), checking their size; a fresh child,
 *                    whose device is its own, also reads its data back.
 *                    Print "child PID status S"
 *   fork-trace       allocate/free 150 times, keep one block across a fork
 *                    of a child that does 10
 *   exit             allocate for 1.5 s, then exit()
 *   quick-exit       allocate/free 20 times, keep 5 MiB, then _exit(0)
 *                    (no exit handler runs)
 *   family           allocate/free 30 times, then start two children that
 *                    do the same: a fork (CUDA: in a context of its own)
 *                    doing 10, and a fork+exec of `host_program API churn
 *                    20`; print "family PARENT FORKED EXECED"
 *   churn N          allocate/free N times
 *   idle             load the API's library, call nothing (no GPU call)
 *   contexts N       create, use and destroy N contexts; print RSS and the
 *                    size of one stats dump at N/3 and at the end
 *   spawn            start `host_program API probe` without LD_PRELOAD
 *   probe            allocate; print whether libgpupool is mapped here
 *   environ          print OPENCL_LAYERS as environ has it
 *   fds-list         allocate, then print "fds" and what each of its open
 *                    descriptors refers to; a forked child does the same
 *                    ("child-fds") after allocating itself
 */
#define _GNU_SOURCE
#include <CL/cl.h>
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char** environ;

static int g_cuda;

/* ---- the GPU, either API ---------------------------------------------- */

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef int CUdevice;
static CUresult (*cu_init)(unsigned);
static CUresult (*cu_device_get)(CUdevice*, int);
static CUresult (*cu_ctx_create)(CUcontext*, unsigned, CUdevice);
static CUresult (*cu_ctx_destroy)(CUcontext);
static CUresult (*cu_ctx_set_current)(CUcontext);
static CUresult (*cu_mem_alloc)(CUdeviceptr*, size_t);
static CUresult (*cu_mem_free)(CUdeviceptr);
static CUcontext g_cu_ctx;

static cl_platform_id g_platform;
static cl_device_id g_device;
static cl_context g_ctx;
static cl_command_queue g_queue;

static void die(const char* what, long code) {
  fprintf(stderr, "host_program: %s failed: %ld\n", what, code);
  exit(3);
}

static void* sym(void* h, const char* name) {
  void* p = dlsym(h, name);
  if (!p) die(name, 0);
  return p;
}

static void* new_context(void) {
  if (g_cuda) {
    CUcontext c = NULL;
    CUdevice d = 0;
    CUresult r = cu_device_get(&d, 0);
    if (r) die("cuDeviceGet", r);
    r = cu_ctx_create(&c, 0, d);
    if (r) die("cuCtxCreate", r);
    return c;
  }
  cl_int err;
  cl_context c = clCreateContext(NULL, 1, &g_device, NULL, NULL, &err);
  if (!c) die("clCreateContext", err);
  return c;
}

static void drop_context(void* c) {
  if (g_cuda) {
    CUresult r = cu_ctx_destroy((CUcontext)c);
    if (r) die("cuCtxDestroy", r);
  } else {
    clReleaseContext((cl_context)c);
  }
}

static void gpu_init(const char* api) {
  g_cuda = !strcmp(api, "cuda");
  if (g_cuda) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) die("dlopen libcuda.so.1", 0);
    cu_init = (CUresult(*)(unsigned))sym(h, "cuInit");
    cu_device_get = (CUresult(*)(CUdevice*, int))sym(h, "cuDeviceGet");
    cu_ctx_create = (CUresult(*)(CUcontext*, unsigned, CUdevice))sym(h, "cuCtxCreate_v2");
    cu_ctx_destroy = (CUresult(*)(CUcontext))sym(h, "cuCtxDestroy_v2");
    cu_ctx_set_current = (CUresult(*)(CUcontext))sym(h, "cuCtxSetCurrent");
    cu_mem_alloc = (CUresult(*)(CUdeviceptr*, size_t))sym(h, "cuMemAlloc_v2");
    cu_mem_free = (CUresult(*)(CUdeviceptr))sym(h, "cuMemFree_v2");
    CUresult r = cu_init(0);
    if (r) die("cuInit", r);
    g_cu_ctx = new_context();
    return;
  }
  cl_int err = clGetPlatformIDs(1, &g_platform, NULL);
  if (err) die("clGetPlatformIDs", err);
  err = clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 1, &g_device, NULL);
  if (err) die("clGetDeviceIDs", err);
  g_ctx = new_context();
  g_queue = clCreateCommandQueue(g_ctx, g_device, 0, &err);
  if (!g_queue) die("clCreateCommandQueue", err);
}

static uintptr_t gpu_alloc_in(void* ctx, size_t n) {
  if (g_cuda) {
    CUdeviceptr p = 0;
    CUresult r = cu_mem_alloc(&p, n);
    if (r) die("cuMemAlloc", r);
    return (uintptr_t)p;
  }
  cl_int err;
  cl_mem m = clCreateBuffer((cl_context)ctx, CL_MEM_READ_WRITE, n, NULL, &err);
  if (!m) die("clCreateBuffer", err);
  return (uintptr_t)m;
}

static uintptr_t gpu_alloc(size_t n) { return gpu_alloc_in(g_cuda ? (void*)g_cu_ctx : g_ctx, n); }

static void gpu_free(uintptr_t h) {
  if (g_cuda) {
    CUresult r = cu_mem_free((CUdeviceptr)h);
    if (r) die("cuMemFree", r);
  } else {
    cl_int err = clReleaseMemObject((cl_mem)h);
    if (err) die("clReleaseMemObject", err);
  }
}

/* Allocate and free `n` times over a few sizes: pool hits and misses. */
static void churn(int n) {
  static const size_t sizes[] = {256, 4096, 65536, 100000};
  for (int i = 0; i < n; ++i) gpu_free(gpu_alloc(sizes[i % 4] + (size_t)(i % 7)));
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static double cpu_s(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (double)r.ru_utime.tv_sec + (double)r.ru_utime.tv_usec / 1e6 + (double)r.ru_stime.tv_sec +
         (double)r.ru_stime.tv_usec / 1e6;
}

/* Waits for a line on stdin, or for it to close. In poll(), where signal
   handlers run even under ThreadSanitizer (it holds them back during
   stdio's internal reads). */
static void wait_line(int until_eof) {
  char c;
  for (;;) {
    struct pollfd p = {0, POLLIN, 0};
    if (poll(&p, 1, -1) < 0 && errno == EINTR) continue;
    ssize_t n = read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || (!until_eof && c == '\n')) return;
  }
}

/* ---- scenarios ---------------------------------------------------------- */

static int closefrom_scenario(const char* path) {
  churn(50); /* gpupool is running now, its descriptors open */
  for (int fd = 3; fd < 1024; ++fd) close(fd);
  /* The program's own descriptors get the lowest numbers: gpupool's old ones. */
  int p[2];
  if (pipe(p) != 0) die("pipe", errno);
  int f = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (f < 0) die("open", errno);
  char line[64];
  size_t written = 0;
  for (int i = 0; i < 200; ++i) {
    int n = snprintf(line, sizeof line, "program line %04d\n", i);
    if (write(f, line, (size_t)n) != n) die("write", errno);
    written += (size_t)n;
  }
  if (lseek(f, 0, SEEK_SET) != 0) die("lseek", errno);
  static const char msg[] = "pipe data\n";
  if (write(p[1], msg, sizeof msg - 1) != (ssize_t)sizeof msg - 1) die("write pipe", errno);
  printf("ready %d fds %d %d %d\n", (int)getpid(), p[0], p[1], f);
  fflush(stdout);
  wait_line(0); /* meanwhile: signals, `gpupool stats`, a log line */
  churn(50);
  /* A control thread spinning on descriptors closed under it shows here. */
  const double c0 = cpu_s(), t0 = now_s();
  while (now_s() - t0 < 1.5) usleep(100000);
  const double cpu = cpu_s() - c0;
  /* The pipe holds exactly what the program put in. */
  char got[64] = {0};
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  ssize_t n = read(p[0], got, sizeof got - 1);
  const int pipe_ok = n == (ssize_t)sizeof msg - 1 && !memcmp(got, msg, sizeof msg - 1);
  /* The file reads back from where the program left its offset. */
  char* back = calloc(1, written + 64);
  size_t total = 0;
  for (;;) {
    ssize_t r = read(f, back + total, written + 64 - total);
    if (r <= 0) break;
    total += (size_t)r;
  }
  int file_ok = total == written;
  for (int i = 0; file_ok && i < 200; ++i) {
    snprintf(line, sizeof line, "program line %04d\n", i);
    file_ok = !memcmp(back + (size_t)i * 18, line, 18);
  }
  free(back);
  printf("cpu %.3f pipe %s file %s\n", cpu, pipe_ok ? "ok" : "bad", file_ok ? "ok" : "bad");
  fflush(stdout);
  return pipe_ok && file_ok ? 0 : 1;
}

/* The program closed 0, 1 and 2. gpupool was asked for a stats dump (a
   file to create): while 0-2 stay closed, nothing may take those numbers,
   not even for a moment, so the dump must wait. Then the program's next
   three opens get 0, 1 and 2, and the dump happens after all. */
static int stdio_scenario(const char* out, const char* err) {
  churn(50);
  const int pooled = dlsym(RTLD_DEFAULT, "gpupool_active") != NULL;
  const char* stats = getenv("GPUPOOL_STATS_FILE");
  if (pooled) raise(SIGUSR1);
  long taken = 0;
  for (const double until = now_s() + 0.3; now_s() < until;)
    for (int fd = 0; fd <= 2; ++fd) taken += fcntl(fd, F_GETFD) >= 0;
  const int dumped_meanwhile = pooled && stats && access(stats, F_OK) == 0;
  const int in = open("/dev/null", O_RDONLY);
  const int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  const int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  /* Daemons rely on getting 0, 1 and 2 back this way. */
  char msg[160];
  int n = 0;
  if (in != 0 || o != 1 || e != 2)
    n = snprintf(msg, sizeof msg, "opens got %d %d %d, not 0 1 2\n", in, o, e);
  else if (taken)
    n = snprintf(msg, sizeof msg,
                 "0, 1 or 2 was open %ld times while the program had them closed\n", taken);
  else if (dumped_meanwhile)
    n = snprintf(msg, sizeof msg, "the stats file was created while 0, 1 and 2 were closed\n");
  if (n) {
    if (o >= 0) (void)!write(o, msg, (size_t)n);
    return 10;
  }
  for (const double until = now_s() + 20; pooled && stats && access(stats, F_OK) != 0;) {
    if (now_s() > until) {
      (void)!write(1, "no stats dump once 0-2 were open again\n", 39);
      return 11;
    }
    usleep(10000);
  }
  churn(50);
  (void)!write(1, "program out\n", 12);
  return 0;
}

/* A program that keeps 0, 1 and 2 closed: the dump it asked for waits a
   bounded time, then happens. */
static int stdio_kept_closed_scenario(void) {
  churn(50);
  const char* stats = getenv("GPUPOOL_STATS_FILE");
  if (!dlsym(RTLD_DEFAULT, "gpupool_active") || !stats) return 0;
  raise(SIGUSR1);
  for (const double until = now_s() + 20; access(stats, F_OK) != 0; usleep(10000))
    if (now_s() > until) return 11;
  return 0;
}

/* Daemons and shells close 0-2 and reopen them while other threads run:
   whatever gpupool's threads open meanwhile must never take those numbers,
   not even for a moment (issue 28, item 7). stderr stays the same pipe (its
   reopening goes through /proc), so gpupool's log lines to it keep coming;
   SIGUSR2 every few rounds asks for a release, which logs one. */
static int high(int fd) {
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, 100);
  close(fd);
  return moved;
}

static int stdio_race_scenario(double seconds) {
  churn(20);
  const int pooled = dlsym(RTLD_DEFAULT, "gpupool_active") != NULL;
  const int saved = fcntl(2, F_DUPFD_CLOEXEC, 100);
  const int null_in = high(open("/dev/null", O_RDONLY));
  const int null_out = high(open("/dev/null", O_WRONLY));
  if (saved < 0 || null_in < 0 || null_out < 0) die("dup stderr", errno);
  char err_path[64];
  snprintf(err_path, sizeof err_path, "/proc/self/fd/%d", saved);
  long rounds = 0, wrong = 0;
  int first[3] = {-1, -1, -1};
  for (const double until = now_s() + seconds; now_s() < until; ++rounds) {
    if (pooled && rounds % 16 == 0) raise(SIGUSR2);
    close(0);
    close(1);
    close(2);
    const int in = open("/dev/null", O_RDONLY);
    const int out = open("/dev/null", O_WRONLY);
    const int err = open(err_path, O_WRONLY);
    if (in != 0 || out != 1 || err != 2) {
      if (!wrong) first[0] = in, first[1] = out, first[2] = err;
      ++wrong;
      /* Put 0-2 back in place for the next round (dup2 takes no free number). */
      const int got[3] = {in, out, err};
      for (int i = 0; i < 3; ++i)
        if (got[i] > 2) close(got[i]);
      dup2(null_in, 0);
      dup2(null_out, 1);
      dup2(saved, 2);
    }
    /* A little time with 0-2 open, for gpupool's threads to run. */
    if (rounds % 4 == 0) usleep(50);
  }
  char line[160];
  const int n = snprintf(line, sizeof line, "rounds %ld wrong %ld first %d %d %d\n", rounds, wrong,
                         first[0], first[1], first[2]);
  (void)!write(saved, line, (size_t)n);
  churn(20);
  return wrong ? 1 : 0;
}

static volatile int g_stop;

static void* churner(void* arg) {
  (void)arg;
  if (g_cuda) cu_ctx_set_current(g_cu_ctx);
  while (!g_stop) churn(4);
  return NULL;
}

/* Waits for pid at most `seconds`; kills it and returns -1 if it hangs. */
static int wait_or_kill(pid_t pid, double seconds, int* status) {
  const double t0 = now_s();
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return 0;
    if (now_s() - t0 > seconds) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return -1;
    }
    usleep(2000);
  }
}

/* A forked child waited for (20 s at most), and what became of it said:
 * "child hung" (-1, killed) or "child PID status N" (0). */
static int wait_child_said(pid_t pid, int* status) {
  if (wait_or_kill(pid, 20, status) < 0) {
    printf("child hung\n");
    return -1;
  }
  printf("child %d status %d\n", (int)pid,
         WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status));
  return 0;
}

static int fork_busy_scenario(int n) {
  churn(20);
  pthread_t t;
  pthread_create(&t, NULL, churner, NULL);
  int hung = 0, failed = 0;
  for (int i = 0; i < n; ++i) {
    usleep(1000 + (unsigned)(i % 5) * 700);
    pid_t pid = fork();
    if (pid < 0) die("fork", errno);
    if (pid == 0) {
      churn(20);
      exit(0); /* atexit handlers run: gpupool's among them */
    }
    int status = 0;
    if (wait_or_kill(pid, 20, &status) < 0) ++hung;
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  g_stop = 1;
  pthread_join(t, NULL);
  printf("children %d hung %d failed %d\n", n, hung, failed);
  return hung || failed ? 1 : 0;
}

static int fork_alloc_scenario(void) {
  churn(20);
  const uintptr_t kept = gpu_alloc(5000);
  pid_t pid = fork();
  if (pid < 0) die("fork", errno);
  if (pid == 0) {
    /* In the parent's context, as programs do before they exec or exit. */
    for (int i = 0; i < 20; ++i) gpu_free(gpu_alloc(1000 + (size_t)i));
    gpu_free(kept);
    (void)gpu_alloc(5 << 20);
    exit(0);
  }
  int status = 0;
  if (wait_or_kill(pid, 20, &status) < 0) {
    printf("child hung\n");
    return 1;
  }
  gpu_free(kept);
  churn(20);
  printf("child %d status %d\n", (int)pid,
         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

typedef cl_context(CL_API_CALL* create_context_fn)(
    const cl_context_properties*, cl_uint, const cl_device_id*,
    void(CL_CALLBACK*)(const char*, const void*, size_t, void*), void*, cl_int*);

static int fork_unseen_scenario(void) {
  cl_int err = clGetPlatformIDs(1, &g_platform, NULL);
  if (err) die("clGetPlatformIDs", err);
  err = clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 1, &g_device, NULL);
  if (err) die("clGetDeviceIDs", err);
  void* loader = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!loader) die("dlopen libOpenCL.so.1", 0);
  create_context_fn create = (create_context_fn)sym(loader, "clCreateContext");
  cl_context ctx = create(NULL, 1, &g_device, NULL, NULL, &err);
  if (!ctx) die("the loader's clCreateContext", err);
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", errno);
  if (pid == 0) {
    cl_command_queue q = clCreateCommandQueue(ctx, g_device, 0, &err);
    if (!q) die("clCreateCommandQueue in the child", err);
    static int data[4096];
    for (int i = 0; i < 20; ++i) {
      const size_t n = 1000 + (size_t)i * 700;
      const cl_mem_flags flags = CL_MEM_READ_WRITE | (i % 2 ? CL_MEM_COPY_HOST_PTR : 0);
      cl_mem m = clCreateBuffer(ctx, flags, n, i % 2 ? data : NULL, &err);
      if (!m) die("clCreateBuffer in the child", err);
      size_t size = 0;
      err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
      if (err || size != n) die("CL_MEM_SIZE in the child", err ? err : (long)size);
      err = clReleaseMemObject(m);
      if (err) die("clReleaseMemObject in the child", err);
    }
    clReleaseCommandQueue(q);
    exit(0);
  }
  int status = 0;
  if (wait_child_said(pid, &status) < 0) return 1;
  /* The parent's device still works in that context. */
  g_queue = clCreateCommandQueue(ctx, g_device, 0, &err);
  if (!g_queue) die("clCreateCommandQueue", err);
  int ok = 1;
  for (int i = 0; i < 10; ++i) {
    int in[256], out[256];
    for (int k = 0; k < 256; ++k) in[k] = i * 1000 + k;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, sizeof in, in, &err);
    if (!m) die("clCreateBuffer", err);
    err = clEnqueueReadBuffer(g_queue, m, CL_TRUE, 0, sizeof out, out, 0, NULL, NULL);
    if (err) die("clEnqueueReadBuffer", err);
    ok &= !memcmp(in, out, sizeof out);
    clReleaseMemObject(m);
  }
  printf("parent data %s\n", ok ? "ok" : "bad");
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 && ok ? 0 : 1;
}

/* On PoCL the device's threads start where the platform was first looked
 * up: a child of a parent that looked does no device work of its own (its
 * first wait would hang, with or without gpupool) and only makes buffers. */
static int fork_own_scenario(int looked, int past) {
  cl_int err;
  if (looked) {
    cl_int(CL_API_CALL * platform_ids)(cl_uint, cl_platform_id*, cl_uint*) = clGetPlatformIDs;
    cl_int(CL_API_CALL * device_ids)(cl_platform_id, cl_device_type, cl_uint, cl_device_id*,
                                     cl_uint*) = clGetDeviceIDs;
    if (past) {
      void* loader = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
      if (!loader) die("dlopen libOpenCL.so.1", 0);
      platform_ids = sym(loader, "clGetPlatformIDs");
      device_ids = sym(loader, "clGetDeviceIDs");
    }
    err = platform_ids(1, &g_platform, NULL);
    if (err) die("clGetPlatformIDs", err);
    err = device_ids(g_platform, CL_DEVICE_TYPE_ALL, 1, &g_device, NULL);
    if (err) die("clGetDeviceIDs", err);
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", errno);
  if (pid == 0) {
    if (!looked) {
      err = clGetPlatformIDs(1, &g_platform, NULL);
      if (err) die("clGetPlatformIDs in the child", err);
      err = clGetDeviceIDs(g_platform, CL_DEVICE_TYPE_ALL, 1, &g_device, NULL);
      if (err) die("clGetDeviceIDs in the child", err);
    }
    cl_context ctx = clCreateContext(NULL, 1, &g_device, NULL, NULL, &err);
    if (!ctx) die("clCreateContext in the child", err);
    cl_command_queue q = NULL;
    if (!looked) {
      q = clCreateCommandQueue(ctx, g_device, 0, &err);
      if (!q) die("clCreateCommandQueue in the child", err);
    }
    static int data[1024], back[1024];
    for (int i = 0; i < 20; ++i) {
      const int copy = i % 2;
      const size_t n = copy ? sizeof data : 3000;
      for (int k = 0; k < 1024; ++k) data[k] = i * 1000 + k;
      cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | (copy ? CL_MEM_COPY_HOST_PTR : 0), n,
                                copy ? data : NULL, &err);
      if (!m) die("clCreateBuffer in the child", err);
      size_t size = 0;
      err = clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
      if (err || size != n) die("CL_MEM_SIZE in the child", err ? err : (long)size);
      if (q && copy) {
        err = clEnqueueReadBuffer(q, m, CL_TRUE, 0, n, back, 0, NULL, NULL);
        if (err) die("clEnqueueReadBuffer in the child", err);
        if (memcmp(data, back, n)) die("the child's data read back", i);
      }
      err = clReleaseMemObject(m);
      if (err) die("clReleaseMemObject in the child", err);
    }
    if (q) clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    exit(0);
  }
  int status = 0;
  if (wait_child_said(pid, &status) < 0) return 1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static void* cancelled_worker(void* arg) {
  (void)arg;
  if (g_cuda) cu_ctx_set_current(g_cu_ctx);
  static const size_t sizes[] = {1000, 70000, 300000, 4096};
  for (unsigned i = 0;; ++i) {
    const uintptr_t h = gpu_alloc(sizes[i % 4] + i % 7);
    pthread_testcancel();
    gpu_free(h);
    pthread_testcancel();
  }
  return NULL;
}

static int cancel_scenario(int rounds) {
  churn(20);
  for (int r = 0; r < rounds; ++r) {
    pthread_t t[2];
    for (int k = 0; k < 2; ++k) pthread_create(&t[k], NULL, cancelled_worker, NULL);
    usleep(200 + (unsigned)(r % 7) * 150);
    for (int k = 0; k < 2; ++k) {
      void* res = NULL;
      pthread_cancel(t[k]);
      pthread_join(t[k], &res);
      if (res != PTHREAD_CANCELED) die("a worker was not cancelled", 0);
    }
  }
  churn(20);
  printf("rounds %d\n", rounds);
  return 0;
}

typedef size_t (*stats_json_fn)(char*, size_t);
static stats_json_fn g_stats_json;
static atomic_int g_stop_signals;
static pthread_t g_signalled;

static void call_gpupool_in_handler(int sig) {
  (void)sig;
  char b[1];
  g_stats_json(b, sizeof b);
}

static void* signal_without_pause(void* arg) {
  (void)arg;
  while (!atomic_load(&g_stop_signals)) pthread_kill(g_signalled, SIGUSR1);
  return NULL;
}

static void* wait_to_be_cancelled(void* arg) {
  (void)arg;
  for (;;) pause();
  return NULL;
}

static int cancel_state_scenario(long n) {
  g_stats_json = (stats_json_fn)dlsym(RTLD_DEFAULT, "gpupool_stats_json");
  if (!g_stats_json) die("gpupool_stats_json not found", 0);
  char b[1];
  g_stats_json(b, sizeof b);
  pthread_t victim, sender;
  pthread_create(&victim, NULL, wait_to_be_cancelled, NULL);
  pthread_cancel(victim); /* from now on hooks hold cancellation off */
  pthread_join(victim, NULL);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = call_gpupool_in_handler;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
  g_signalled = pthread_self();
  pthread_create(&sender, NULL, signal_without_pause, NULL);
  long disabled = 0;
  for (long i = 0; i < n; ++i) {
    g_stats_json(b, sizeof b);
    int old = 0;
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
    if (old != PTHREAD_CANCEL_ENABLE) ++disabled;
  }
  atomic_store(&g_stop_signals, 1);
  pthread_join(sender, NULL);
  signal(SIGUSR1, SIG_IGN);
  printf("calls %ld, cancellation left disabled after %ld\n", n, disabled);
  return disabled ? 1 : 0;
}

static volatile sig_atomic_t g_signal_forks, g_in_malloc;
static int g_handlers_running; /* SIGALRM reaches any thread, PoCL's too */
/* tests/host/malloc_guard.c, where preloaded: whether this thread is inside
 * malloc, where glibc's fork() would wait for ever on the lock it holds. */
static int (*g_malloc_depth)(void);

/* No fork before then (now_s() in nanoseconds: clock_gettime is
 * async-signal-safe): a fork that outlasts the timer's period (under
 * AddressSanitizer a fork takes milliseconds) would otherwise leave the next
 * signal pending as the handler returns, and the interrupted thread would
 * never run again (with or without gpupool). */
static long long g_next_fork_ns;

static void fork_in_handler(int sig) {
  (void)sig;
  if (g_malloc_depth && g_malloc_depth()) {
    g_in_malloc = g_in_malloc + 1;
    return;
  }
  if (now_s() * 1e9 < (double)__atomic_load_n(&g_next_fork_ns, __ATOMIC_RELAXED)) return;
  __atomic_add_fetch(&g_handlers_running, 1, __ATOMIC_SEQ_CST);
  const int saved = errno;
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  if (pid > 0 && waitpid(pid, NULL, 0) == pid) g_signal_forks = g_signal_forks + 1;
  __atomic_store_n(&g_next_fork_ns, (long long)(now_s() * 1e9) + 1000000, __ATOMIC_RELAXED);
  errno = saved;
  __atomic_sub_fetch(&g_handlers_running, 1, __ATOMIC_SEQ_CST);
}

static int fork_signal_scenario(int n) {
  churn(20);
  g_malloc_depth = (int (*)(void))dlsym(RTLD_DEFAULT, "malloc_guard_depth");
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fork_in_handler;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGALRM, &sa, NULL);
  struct itimerval every = {{0, 500}, {0, 500}};
  setitimer(ITIMER_REAL, &every, NULL);
  static const size_t sizes[] = {1000, 70000, 300000, 4096};
  for (unsigned i = 0; g_signal_forks < n; ++i) gpu_free(gpu_alloc(sizes[i % 4] + i % 7));
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  signal(SIGALRM, SIG_IGN);
  /* Another thread's handler may still be forking: exit() meanwhile makes
   * glibc's fork abort ("array index 0 not less than array length 0": the
   * exit takes the fork handlers away under it). A handler that hangs hangs
   * the program here, which the check sees. */
  for (int quiet = 0; quiet < 10; ++quiet) {
    if (__atomic_load_n(&g_handlers_running, __ATOMIC_SEQ_CST)) quiet = 0;
    usleep(1000);
  }
  churn(20);
  printf("forks %d (not in malloc: %d signals skipped)\n", (int)g_signal_forks, (int)g_in_malloc);
  return 0;
}

static int fork_trace_scenario(void) {
  churn(150); /* 300 records, still buffered when the child is made */
  /* Active across the fork: the child's start drops the parent's blocks
   * (CUDA), which must not show in either process's trace. */
  const uintptr_t kept = gpu_alloc(8192);
  pid_t pid = fork();
  if (pid < 0) die("fork", errno);
  if (pid == 0) {
    if (g_cuda) {
      /* CUDA gives a child no context of its parent's: it makes its own. */
      g_cu_ctx = new_context();
    }
    churn(10);
    exit(0);
  }
  int status = 0;
  if (wait_or_kill(pid, 20, &status) < 0) return 1;
  gpu_free(kept);
  printf("child %d\n", (int)pid);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static int family_scenario(const char* self, const char* api) {
  churn(30);
  fflush(stdout);
  const pid_t forked = fork();
  if (forked < 0) die("fork", errno);
  if (forked == 0) {
    if (g_cuda) g_cu_ctx = new_context();
    churn(10);
    exit(0);
  }
  const pid_t execed = fork();
  if (execed < 0) die("fork", errno);
  if (execed == 0) {
    char* argv[] = {(char*)self, (char*)api, "churn", "20", NULL};
    execv(self, argv);
    _exit(127);
  }
  int a = 0, b = 0;
  if (wait_or_kill(forked, 20, &a) < 0 || wait_or_kill(execed, 20, &b) < 0) return 1;
  printf("family %d %d %d\n", (int)getpid(), (int)forked, (int)execed);
  return WIFEXITED(a) && !WEXITSTATUS(a) && WIFEXITED(b) && !WEXITSTATUS(b) ? 0 : 1;
}

static int exit_scenario(void) {
  const double t0 = now_s();
  while (now_s() - t0 < 1.5) churn(10);
  exit(0);
}

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (!f || fscanf(f, "%ld %ld", &size, &resident) != 2) die("statm", 0);
  fclose(f);
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

// Bytes the process has from malloc and still uses (every malloc arena,
// mmapped chunks too): what a leak grows, whatever the allocator keeps
// resident for later (RSS moves with that, and with load on the machine).
static long heap_kib(void) {
  const struct mallinfo2 m = mallinfo2();
  return (long)((m.uordblks + m.hblkhd) / 1024);
}

static size_t stats_size(void) {
  size_t (*stats_json)(char*, size_t) =
      (size_t(*)(char*, size_t))dlsym(RTLD_DEFAULT, "gpupool_stats_json");
  return stats_json ? stats_json(NULL, 0) : 0;
}

static int contexts_scenario(int n) {
  long rss_third = 0, heap_third = 0;
  size_t dump_third = 0;
  for (int i = 0; i < n; ++i) {
    void* c = new_context();
    if (g_cuda) cu_ctx_set_current((CUcontext)c);
    uintptr_t a = gpu_alloc_in(c, 4096), b = gpu_alloc_in(c, 100000 + (size_t)(i % 64) * 4096);
    gpu_free(a);
    gpu_free(b);
    gpu_free(gpu_alloc_in(c, 4000));
    drop_context(c);
    if (g_cuda) cu_ctx_set_current(g_cu_ctx);
    if (i + 1 == n / 3) {
      rss_third = rss_kib();
      heap_third = heap_kib();
      dump_third = stats_size();
    }
  }
  printf("rss_kib %ld %ld heap_kib %ld %ld dump_bytes %zu %zu\n", rss_third, rss_kib(), heap_third,
         heap_kib(), dump_third, stats_size());
  return 0;
}

static int mapped_gpupool(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[4096];
  int found = 0;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, "libgpupool")) found = 1;
  if (f) fclose(f);
  return found;
}

static int spawn_scenario(const char* self, const char* api) {
  churn(20);
  /* A child started without gpupool: LD_PRELOAD left out of its environment. */
  int n = 0;
  for (char** e = environ; *e; ++e) ++n;
  char** env = calloc((size_t)n + 1, sizeof *env);
  int k = 0;
  for (char** e = environ; *e; ++e)
    if (strncmp(*e, "LD_PRELOAD=", 11)) env[k++] = *e;
  pid_t pid = fork();
  if (pid == 0) {
    char* argv[] = {(char*)self, (char*)api, "probe", NULL};
    execve(self, argv, env);
    _exit(127);
  }
  int status = 0;
  if (wait_or_kill(pid, 20, &status) < 0) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

static int probe_scenario(void) {
  churn(20);
  printf("gpupool mapped: %s\n", mapped_gpupool() ? "yes" : "no");
  fflush(stdout);
  return 0;
}

static int environ_scenario(void) {
  churn(5);
  const char* value = NULL;
  for (char** e = environ; *e; ++e)
    if (!strncmp(*e, "OPENCL_LAYERS=", 14)) value = *e + 14;
  printf("OPENCL_LAYERS in environ: %s%s%s\n", value ? "'" : "", value ? value : "none",
         value ? "'" : "");
  return 0;
}

/* "WHAT target target ...": every open descriptor but the listing's own. */
static void print_fds(const char* what) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) die("opendir", errno);
  printf("%s", what);
  for (struct dirent* e; (e = readdir(d));) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
    char path[64], target[4096];
    snprintf(path, sizeof path, "/proc/self/fd/%d", atoi(e->d_name));
    ssize_t n = readlink(path, target, sizeof target - 1);
    if (n < 0) continue;
    target[n] = 0;
    printf(" %s", target);
  }
  closedir(d);
  printf("\n");
  fflush(stdout);
}

/* What gpupool leaves in the program's table once it runs (its threads
   started, its files open), in the process and in a forked child. */
/* Whether NVML is loaded (gpupool's watch starts it, on its own time). */
static int nvml_loaded(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[4096];
  int found = 0;
  while (!found && fgets(line, sizeof line, f)) found = strstr(line, "libnvidia-ml") != NULL;
  fclose(f);
  return found;
}

static int fds_list_scenario(void) {
  churn(20);
  usleep(300000);
  /* On CUDA the pressure watch loads NVML, which opens files of its own. */
  for (int i = 0; g_cuda && i < 300 && !nvml_loaded(); ++i) usleep(10000);
  print_fds("fds");
  pid_t pid = fork();
  if (pid == 0) {
    churn(20);
    usleep(300000);
    print_fds("child-fds");
    exit(0);
  }
  int status = 0;
  if (wait_or_kill(pid, 20, &status) < 0) return 1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: host_program opencl|cuda SCENARIO [ARGS]\n");
    return 2;
  }
  const char* s = argv[2];
  /* stdio closes 0-2 before the first GPU call gpupool sees. */
  if (!strcmp(s, "stdio") && argc == 5) {
    g_cuda = !strcmp(argv[1], "cuda");
    close(0);
    close(1);
    close(2);
    gpu_init(argv[1]);
    return stdio_scenario(argv[3], argv[4]);
  }
  if (!strcmp(s, "stdio-kept-closed")) {
    g_cuda = !strcmp(argv[1], "cuda");
    close(0);
    close(1);
    close(2);
    gpu_init(argv[1]);
    return stdio_kept_closed_scenario();
  }
  if (!strcmp(s, "fork-unseen") && !strcmp(argv[1], "opencl"))
    return fork_unseen_scenario(); /* its own context */
  if (!strcmp(s, "fork-own") && argc == 4 && !strcmp(argv[1], "opencl"))
    return fork_own_scenario(strncmp(argv[3], "looked", 6) == 0, /* no OpenCL call before */
                             !strcmp(argv[3], "looked-past"));
  if (!strcmp(s, "idle")) {
    /* Linked with libOpenCL; CUDA's driver loaded but never called. */
    if (!strcmp(argv[1], "cuda") && !dlopen("libcuda.so.1", RTLD_NOW))
      die("dlopen libcuda.so.1", 0);
    return 0;
  }
  gpu_init(argv[1]);
  if (!strcmp(s, "family")) return family_scenario(argv[0], argv[1]);
  if (!strcmp(s, "churn") && argc == 4) {
    churn(atoi(argv[3]));
    return 0;
  }
  if (!strcmp(s, "stdio-race") && argc == 4) return stdio_race_scenario(atof(argv[3]));
  if (!strcmp(s, "closefrom") && argc == 4) return closefrom_scenario(argv[3]);
  if (!strcmp(s, "serve")) {
    churn(50);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    wait_line(1);
    return 0;
  }
  if (!strcmp(s, "fork-busy") && argc == 4) return fork_busy_scenario(atoi(argv[3]));
  if (!strcmp(s, "fork-alloc")) return fork_alloc_scenario();
  if (!strcmp(s, "fork-signal") && argc == 4) return fork_signal_scenario(atoi(argv[3]));
  if (!strcmp(s, "cancel") && argc == 4) return cancel_scenario(atoi(argv[3]));
  if (!strcmp(s, "cancel-state") && argc == 4) return cancel_state_scenario(atol(argv[3]));
  if (!strcmp(s, "fork-trace")) return fork_trace_scenario();
  if (!strcmp(s, "exit")) return exit_scenario();
  if (!strcmp(s, "quick-exit")) {
    churn(20);
    gpu_alloc((size_t)5 << 20);
    _exit(0);
  }
  if (!strcmp(s, "contexts") && argc == 4) return contexts_scenario(atoi(argv[3]));
  if (!strcmp(s, "spawn")) return spawn_scenario(argv[0], argv[1]);
  if (!strcmp(s, "probe")) return probe_scenario();
  if (!strcmp(s, "environ")) return environ_scenario();
  if (!strcmp(s, "fds-list")) return fds_list_scenario();
  fprintf(stderr, "host_program: unknown scenario %s\n", s);
  return 2;
}
