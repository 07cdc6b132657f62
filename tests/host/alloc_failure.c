/* A program whose host memory runs out under gpupool's feet: its own malloc
 * fails every request that comes from libgpupool while armed (the program's
 * own requests and the driver's still succeed). gpupool must answer each
 * call as the driver alone would, never let an exception reach the
 * program, and say so once.
 *
 *   alloc_failure cuda|opencl   prints "ok N" after N armed calls, all
 *                               served, then connects to gpupool's control
 *                               socket while armed; exit 0
 * Not for sanitizer builds: they replace malloc themselves.
 */
#define _GNU_SOURCE
#include <CL/cl.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

extern void* __libc_malloc(size_t);

static volatile int g_armed;
static volatile int g_failed;

/* Fails requests made from libgpupool.so while armed. */
void* malloc(size_t n) {
  if (g_armed) {
    Dl_info info;
    void* caller = __builtin_return_address(0);
    if (dladdr(caller, &info) && info.dli_fname && strstr(info.dli_fname, "libgpupool")) {
      ++g_failed;
      errno = ENOMEM;
      return NULL;
    }
  }
  return __libc_malloc(n);
}

static void die(const char* what, long code) {
  fprintf(stderr, "alloc_failure: %s: %ld\n", what, code);
  exit(3);
}

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static int cuda(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) die("dlopen libcuda.so.1", 0);
  CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
  CUresult (*dev_get)(int*, int) = (CUresult(*)(int*, int))dlsym(h, "cuDeviceGet");
  CUresult (*ctx_create)(void**, unsigned, int) =
      (CUresult(*)(void**, unsigned, int))dlsym(h, "cuCtxCreate_v2");
  CUresult (*alloc)(CUdeviceptr*, size_t) =
      (CUresult(*)(CUdeviceptr*, size_t))dlsym(h, "cuMemAlloc_v2");
  CUresult (*mfree)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
  void* ctx;
  int dev;
  if (init(0) || dev_get(&dev, 0) || ctx_create(&ctx, 0, dev)) die("CUDA set-up", 0);
  CUdeviceptr p;
  if (alloc(&p, 1000) || mfree(p)) die("warm-up", 0); /* gpupool is running */
  int served = 0;
  for (size_t size = 5000; size < 5000 + 8 * 100000; size += 100000) {
    g_armed = 1; /* every size new: each one reaches the driver through gpupool */
    CUresult r = alloc(&p, size);
    g_armed = 0;
    if (r) die("cuMemAlloc while gpupool is out of memory", r);
    memset(&r, 0, sizeof r);
    if ((r = mfree(p))) die("cuMemFree of that block", r);
    ++served;
  }
  if (alloc(&p, 1000) || mfree(p)) die("after the failures", 0);
  return served;
}

static int opencl(void) {
  cl_platform_id pl;
  cl_device_id d;
  cl_int err;
  if (clGetPlatformIDs(1, &pl, NULL) || clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &d, NULL))
    die("OpenCL set-up", 0);
  cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &err);
  if (!c) die("clCreateContext", err);
  cl_mem m = clCreateBuffer(c, CL_MEM_READ_WRITE, 1000, NULL, &err);
  if (!m) die("warm-up", err);
  clReleaseMemObject(m);
  int served = 0;
  for (size_t size = 5000; size < 5000 + 8 * 100000; size += 100000) {
    g_armed = 1;
    m = clCreateBuffer(c, CL_MEM_READ_WRITE, size, NULL, &err);
    g_armed = 0;
    if (!m || err) die("clCreateBuffer while gpupool is out of memory", err);
    size_t got = 0;
    if (clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof got, &got, NULL) || got != size)
      die("CL_MEM_SIZE of that buffer", (long)got);
    if ((err = clReleaseMemObject(m))) die("clReleaseMemObject of that buffer", err);
    ++served;
  }
  m = clCreateBuffer(c, CL_MEM_READ_WRITE, 1000, NULL, &err);
  if (!m) die("after the failures", err);
  clReleaseMemObject(m);
  /* The last buffer of a context the program released already: its release
     finishes the context inside gpupool, which needs memory. It is still
     one release of the buffer, answered CL_SUCCESS. */
  m = clCreateBuffer(c, CL_MEM_READ_WRITE, 1000, NULL, &err);
  if (!m) die("a last buffer", err);
  if ((err = clReleaseContext(c))) die("clReleaseContext", err);
  g_armed = 1;
  err = clReleaseMemObject(m);
  g_armed = 0;
  if (err) die("clReleaseMemObject of a released context's last buffer", err);
  ++served;
  return served;
}

/* A client of gpupool's control socket arrives while gpupool's allocations
   fail: its thread accepts it and asks for memory to track it (and more to
   read its request). Returns whether one was connected. */
static int client_while_armed(void) {
  /* The socket's file (wire/socket.hpp). */
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  if (geteuid() == 0)
    snprintf(a.sun_path, sizeof a.sun_path, "/run/gpupool/control.%ld", (long)getpid());
  else
    snprintf(a.sun_path, sizeof a.sun_path, "/dev/shm/gpupool-%u/control.%ld", (unsigned)geteuid(),
             (long)getpid());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  g_armed = 1;
  const int ok = connect(fd, (struct sockaddr*)&a, sizeof a) == 0;
  if (ok) (void)!send(fd, "stats\n", 6, MSG_NOSIGNAL); /* gpupool may drop it */
  const struct timespec wait = {0, 300 * 1000 * 1000};
  nanosleep(&wait, NULL);
  g_armed = 0;
  close(fd);
  return ok;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int served = !strcmp(argv[1], "cuda") ? cuda() : opencl();
  const int client = client_while_armed();
  printf("ok %d failed-mallocs %d client %d\n", served, g_failed, client);
  return 0;
}
