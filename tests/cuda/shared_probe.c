/* Checks the stand-in's two views of a device agree: libcuda (linked) and
 * libnvidia-ml.so.1 (dlopen'ed by name, as a library would). Driven by
 * run_shared.py, which compares what several processes print.
 *
 *   shared_probe uuid         "uuid <dev> GPU-..." per device; exits 1 unless
 *                             cuDeviceGetUuid, _v2, cuGetProcAddress's and
 *                             NVML's (by index and by UUID) agree
 *   shared_probe mem [MIB]    allocates MIB MiB on device 0, then prints
 *                             "cuda free F total T", "nvml free F used U
 *                             total T", "all U" (standin_used_all), "nvml_calls
 *                             N"; exits 1 unless the views agree
 *   shared_probe procs [MIB]  allocates MIB MiB on device 0, then prints
 *                             "proc <pid> <bytes>" per process NVML lists on
 *                             it and "self <pid>"; exits 1 unless the
 *                             sizing protocol works, the list adds up to
 *                             NVML's used memory and lists this process
 *                             with its own usage (or not, if it has none)
 *   shared_probe ctx          with STANDIN_CONTEXT_BYTES=n (a multiple of
 *                             512): each live context holds n bytes, seen by
 *                             cuMemGetInfo and NVML; destroy, release to
 *                             zero and reset give them back; a context that
 *                             does not fit fails with out of memory; prints
 *                             "ok contexts <how many fitted>"
 *   shared_probe errors       error codes of the new entry points
 *   shared_probe nvmlfail     STANDIN_NVML_FAIL=1: nvmlInit fails */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "standin.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
#define NVML_ERROR_INSUFFICIENT_SIZE 7

static struct {
  nvmlReturn_t (*init_v2)(void);
  nvmlReturn_t (*init)(void);
  nvmlReturn_t (*shutdown)(void);
  const char* (*error_string)(nvmlReturn_t);
  nvmlReturn_t (*count)(unsigned*);
  nvmlReturn_t (*by_index)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*);
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*);
} nvml;

static int g_failed;
#define EXPECT(cond)                                             \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "shared_probe:%d: %s\n", __LINE__, #cond); \
      g_failed = 1;                                              \
    }                                                            \
  } while (0)
#define OK(call) EXPECT((call) == 0)

static void* need(void* lib, const char* name) {
  void* f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "shared_probe: no %s in libnvidia-ml.so.1\n", name);
    exit(1);
  }
  return f;
}

static void load_nvml(void) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "shared_probe: %s\n", dlerror());
    exit(1);
  }
  *(void**)&nvml.init_v2 = need(lib, "nvmlInit_v2");
  *(void**)&nvml.init = need(lib, "nvmlInit");
  *(void**)&nvml.shutdown = need(lib, "nvmlShutdown");
  *(void**)&nvml.error_string = need(lib, "nvmlErrorString");
  *(void**)&nvml.count = need(lib, "nvmlDeviceGetCount_v2");
  *(void**)&nvml.by_index = need(lib, "nvmlDeviceGetHandleByIndex_v2");
  *(void**)&nvml.by_uuid = need(lib, "nvmlDeviceGetHandleByUUID");
  *(void**)&nvml.uuid = need(lib, "nvmlDeviceGetUUID");
  *(void**)&nvml.memory = need(lib, "nvmlDeviceGetMemoryInfo");
  *(void**)&nvml.processes = need(lib, "nvmlDeviceGetComputeRunningProcesses");
}

/* NVML's text form of CUDA's 16 bytes. */
static void text_of(const CUuuid* u, char out[41]) {
  char* p = out + sprintf(out, "GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    p += sprintf(p, "%02x", (unsigned char)u->bytes[i]);
  }
}

static int probe_uuid(void) {
  OK(cuInit(0));
  OK(nvml.init_v2());
  int n = 0;
  unsigned nn = 0;
  OK(cuDeviceGetCount(&n));
  OK(nvml.count(&nn));
  EXPECT((unsigned)n == nn);
  CUresult (*by_proc)(CUuuid*, CUdevice) = NULL;
  CUresult (*by_proc_old)(CUuuid*, CUdevice) = NULL;
  OK(cuGetProcAddress_v2("cuDeviceGetUuid", (void**)&by_proc, 12000, 0, NULL));
  OK(cuGetProcAddress_v2("cuDeviceGetUuid", (void**)&by_proc_old, 10000, 0, NULL));
  EXPECT(by_proc == standin_own("cuDeviceGetUuid_v2"));
  EXPECT(by_proc_old == standin_own("cuDeviceGetUuid"));
  char first[41] = "";
  for (int d = 0; d < n; ++d) {
    CUuuid a, b, c, e;
    OK(cuDeviceGetUuid(&a, d)); /* cuda.h maps it to _v2 */
    CUresult (*v1)(CUuuid*, CUdevice) =
        (CUresult(*)(CUuuid*, CUdevice))standin_own("cuDeviceGetUuid");
    OK(v1(&b, d));
    OK(by_proc(&c, d));
    OK(by_proc_old(&e, d));
    EXPECT(memcmp(&a, &b, 16) == 0 && memcmp(&a, &c, 16) == 0 && memcmp(&a, &e, 16) == 0);
    char cuda_text[41], nvml_text[96];
    text_of(&a, cuda_text);
    nvmlDevice_t h = NULL, h2 = NULL;
    OK(nvml.by_index((unsigned)d, &h));
    OK(nvml.uuid(h, nvml_text, sizeof nvml_text));
    EXPECT(strcmp(cuda_text, nvml_text) == 0);
    OK(nvml.by_uuid(cuda_text, &h2));
    EXPECT(h == h2);
    if (d == 0) strcpy(first, cuda_text);
    else EXPECT(strcmp(first, cuda_text) != 0); /* devices differ */
    printf("uuid %d %s\n", d, cuda_text);
  }
  OK(nvml.shutdown());
  return g_failed;
}

/* Device 0's primary context made current, and `mib` MiB allocated on it
   (none for 0): the usage the probes compare. */
static CUdeviceptr use_device(unsigned long long mib) {
  OK(cuInit(0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  OK(cuCtxSetCurrent(ctx));
  CUdeviceptr p = 0;
  if (mib) OK(cuMemAlloc_v2(&p, (size_t)mib << 20));
  return p;
}

static int probe_mem(unsigned long long mib) {
  CUdeviceptr p = use_device(mib);
  size_t cuda_free = 0, cuda_total = 0;
  OK(cuMemGetInfo_v2(&cuda_free, &cuda_total));
  OK(nvml.init());
  CUuuid u;
  char text[41];
  OK(cuDeviceGetUuid(&u, 0));
  text_of(&u, text);
  nvmlDevice_t h = NULL;
  OK(nvml.by_uuid(text, &h));
  nvmlMemory_t m = {0, 0, 0};
  OK(nvml.memory(h, &m));
  const size_t all = standin_used_all(0);
  printf("cuda free %zu total %zu\n", cuda_free, cuda_total);
  printf("nvml free %llu used %llu total %llu\n", m.free, m.used, m.total);
  printf("all %zu\n", all);
  printf("nvml_calls %llu\n", (unsigned long long)standin_nvml_memory_info_calls());
  EXPECT(m.total == cuda_total);
  EXPECT(m.free == cuda_free);
  EXPECT(m.used + m.free == m.total);
  EXPECT(m.used == all);
  EXPECT(all >= standin_used(0));
  EXPECT(standin_used(0) == (size_t)mib << 20);
  if (p) OK(cuMemFree_v2(p));
  OK(nvml.shutdown());
  return g_failed;
}

/* NVML's handle of CUDA's device `d` (by UUID, as a library finds it). */
static nvmlDevice_t nvml_device(CUdevice d) {
  CUuuid u;
  char text[41];
  OK(cuDeviceGetUuid(&u, d));
  text_of(&u, text);
  nvmlDevice_t h = NULL;
  OK(nvml.by_uuid(text, &h));
  return h;
}

/* NVML's process list, asked the documented way (count, then fill), checked
   against NVML's used memory. Returns the count; `self` gets this process's
   usage (0 if not listed). Prints the list when `print`. */
static unsigned list_processes(nvmlDevice_t h, unsigned long long* self, int print) {
  nvmlProcessInfo_v1_t infos[130];
  unsigned n = 0;
  nvmlReturn_t r = nvml.processes(h, &n, NULL);
  EXPECT(r == 0 || r == NVML_ERROR_INSUFFICIENT_SIZE);
  EXPECT((r == 0) == (n == 0));
  EXPECT(n <= 128);
  if (n > 128) n = 128;
  if (n > 0) {
    unsigned small = n - 1;
    EXPECT(nvml.processes(h, &small, infos) == NVML_ERROR_INSUFFICIENT_SIZE && small == n);
  }
  unsigned got = 130; /* room to spare: the count comes back exact */
  OK(nvml.processes(h, &got, infos));
  EXPECT(got == n);
  nvmlMemory_t m = {0, 0, 0};
  OK(nvml.memory(h, &m));
  unsigned long long sum = 0;
  *self = 0;
  for (unsigned i = 0; i < got && i < 130; ++i) {
    EXPECT(infos[i].usedGpuMemory > 0);
    sum += infos[i].usedGpuMemory;
    if (infos[i].pid == (unsigned)getpid()) *self = infos[i].usedGpuMemory;
    if (print) printf("proc %u %llu\n", infos[i].pid, infos[i].usedGpuMemory);
  }
  EXPECT(sum == m.used);
  return got;
}

static int probe_procs(unsigned long long mib) {
  CUdeviceptr p = use_device(mib);
  OK(nvml.init());
  unsigned long long self = 0;
  list_processes(nvml_device(0), &self, 1);
  printf("self %d\n", (int)getpid());
  EXPECT(self == standin_used(0));
  if (p) OK(cuMemFree_v2(p));
  OK(nvml.shutdown());
  return g_failed;
}

/* This process's usage of device 0 as NVML lists it, checked against
   libcuda's count and, where a context is current, cuMemGetInfo. */
static size_t ctx_used(nvmlDevice_t h) {
  unsigned long long self = 0;
  list_processes(h, &self, 0);
  EXPECT(self == standin_used(0));
  CUcontext cur = NULL;
  OK(cuCtxGetCurrent(&cur));
  if (cur) {
    size_t free_bytes = 0, total = 0;
    OK(cuMemGetInfo_v2(&free_bytes, &total));
    nvmlMemory_t m = {0, 0, 0};
    OK(nvml.memory(h, &m));
    EXPECT(m.free == free_bytes && m.total == total);
  }
  return standin_used(0);
}

static CUresult create(CUcontext* c, CUdevice d) {
  return cuCtxCreate(c, NULL, 0, d); /* cuda.h: cuCtxCreate_v4 */
}

static int probe_ctx(void) {
  const char* v = getenv("STANDIN_CONTEXT_BYTES");
  const size_t n = v ? (size_t)strtoull(v, NULL, 0) : 0;
  if (n == 0 || n % 512) {
    fprintf(stderr, "shared_probe ctx: STANDIN_CONTEXT_BYTES must be a nonzero multiple of 512\n");
    return 1;
  }
  OK(cuInit(0));
  OK(nvml.init());
  nvmlDevice_t h = nvml_device(0);
  EXPECT(ctx_used(h) == 0);
  /* The primary context holds n while retained, once however often. */
  CUcontext prim = NULL, again = NULL;
  OK(cuDevicePrimaryCtxRetain(&prim, 0));
  OK(cuCtxSetCurrent(prim));
  EXPECT(ctx_used(h) == n);
  OK(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT(again == prim && ctx_used(h) == n);
  OK(cuDevicePrimaryCtxRelease(0));
  EXPECT(ctx_used(h) == n);
  /* Created contexts: n each on their own device, back at destroy. */
  CUcontext c = NULL, d1 = NULL, top = NULL;
  OK(create(&c, 0));
  EXPECT(ctx_used(h) == 2 * n);
  OK(create(&d1, 1));
  EXPECT(standin_used(1) == n && standin_used(0) == 2 * n);
  OK(cuCtxDestroy(d1));
  EXPECT(standin_used(1) == 0);
  OK(cuCtxDestroy(c));
  OK(cuCtxGetCurrent(&top));
  EXPECT(top == prim);
  EXPECT(ctx_used(h) == n);
  /* As many as fit (besides whatever the neighbours hold), then out of
     memory with nothing created or pushed. */
  size_t free_bytes = 0, total = 0;
  OK(cuMemGetInfo_v2(&free_bytes, &total));
  const size_t fits = free_bytes / n;
  CUcontext made[4096];
  size_t k = 0;
  CUresult r = CUDA_SUCCESS;
  while (k < 4096) {
    r = create(&made[k], 0);
    if (r != CUDA_SUCCESS) break;
    OK(cuCtxPopCurrent(&top));
    EXPECT(top == made[k]);
    ++k;
  }
  EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY);
  EXPECT(k == fits);
  OK(cuCtxGetCurrent(&top));
  EXPECT(top == prim);
  EXPECT(ctx_used(h) == n + k * n);
  while (k > 0) OK(cuCtxDestroy(made[--k]));
  EXPECT(ctx_used(h) == n);
  /* Released to zero: the primary gives its n back. */
  OK(cuDevicePrimaryCtxRelease(0));
  OK(cuCtxSetCurrent(NULL));
  EXPECT(ctx_used(h) == 0);
  /* Leave less than n free: then neither a retain (the primary stays
     inactive) nor a create fits. */
  OK(create(&c, 0));
  OK(cuMemGetInfo_v2(&free_bytes, &total));
  EXPECT(free_bytes >= n);
  CUdeviceptr p = 0;
  OK(cuMemAlloc_v2(&p, free_bytes - n + 512));
  OK(cuMemGetInfo_v2(&free_bytes, &total));
  EXPECT(free_bytes == n - 512);
  const size_t before = ctx_used(h);
  unsigned flags = 0;
  int active = 1;
  EXPECT(cuDevicePrimaryCtxRetain(&again, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuDevicePrimaryCtxGetState(0, &flags, &active));
  EXPECT(active == 0);
  CUcontext none = NULL;
  EXPECT(create(&none, 0) == CUDA_ERROR_OUT_OF_MEMORY);
  OK(cuCtxGetCurrent(&top));
  EXPECT(top == c);
  EXPECT(ctx_used(h) == before);
  /* Room again: a retain activates it (n), a reset gives them back. */
  OK(cuMemFree_v2(p));
  OK(cuDevicePrimaryCtxRetain(&again, 0));
  EXPECT(again == prim && ctx_used(h) == 2 * n);
  OK(cuDevicePrimaryCtxReset(0));
  EXPECT(ctx_used(h) == n);
  OK(cuCtxDestroy(c));
  EXPECT(ctx_used(h) == 0);
  OK(nvml.shutdown());
  if (!g_failed) printf("ok contexts %zu\n", fits);
  return g_failed;
}

static int probe_errors(void) {
  CUuuid u;
  nvmlDevice_t h = NULL;
  char text[96];
  nvmlMemory_t m;
  /* Before initialisation. */
  EXPECT(cuDeviceGetUuid(&u, 0) == CUDA_ERROR_NOT_INITIALIZED);
  EXPECT(nvml.count((unsigned[1]){0}) == 1); /* NVML_ERROR_UNINITIALIZED */
  EXPECT(nvml.by_index(0, &h) == 1);
  EXPECT(nvml.shutdown() == 1);
  unsigned count = 0;
  EXPECT(nvml.processes(h, &count, NULL) == 1);
  OK(cuInit(0));
  OK(nvml.init_v2());
  EXPECT(cuDeviceGetUuid(NULL, 0) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuDeviceGetUuid(&u, 99) == CUDA_ERROR_INVALID_DEVICE);
  EXPECT(cuDeviceGetUuid(&u, -1) == CUDA_ERROR_INVALID_DEVICE);
  CUresult (*v1)(CUuuid*, CUdevice) =
      (CUresult(*)(CUuuid*, CUdevice))standin_own("cuDeviceGetUuid");
  EXPECT(v1(NULL, 0) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(v1(&u, 99) == CUDA_ERROR_INVALID_DEVICE);
  void* f = NULL;
  CUdriverProcAddressQueryResult status;
  EXPECT(cuGetProcAddress_v2("cuDeviceGetUuid", &f, 9000, 0, &status) == CUDA_ERROR_NOT_FOUND);
  EXPECT(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT(nvml.by_index(99, &h) == 2); /* INVALID_ARGUMENT */
  EXPECT(nvml.by_index(0, NULL) == 2);
  EXPECT(nvml.by_uuid("GPU-nope", &h) == 6); /* NOT_FOUND */
  EXPECT(nvml.by_uuid(NULL, &h) == 2);
  OK(nvml.by_index(0, &h));
  EXPECT(nvml.uuid(h, text, 10) == 7); /* INSUFFICIENT_SIZE */
  EXPECT(nvml.uuid(h, text, 41) == 0 && strlen(text) == 40);
  EXPECT(nvml.uuid((nvmlDevice_t)&m, text, sizeof text) == 2);
  EXPECT(nvml.memory(h, NULL) == 2);
  EXPECT(nvml.memory((nvmlDevice_t)&m, &m) == 2);
  EXPECT(strcmp(nvml.error_string(999), "Unknown Error") == 0);
  /* The process list: no usage yet (no STANDIN_SHARED: a device of our own),
     then ours alone. */
  nvmlProcessInfo_v1_t infos[2];
  EXPECT(nvml.processes((nvmlDevice_t)&m, &count, infos) == 2);
  EXPECT(nvml.processes(h, NULL, infos) == 2);
  count = 0;
  OK(nvml.processes(h, &count, NULL));
  EXPECT(count == 0);
  count = 2;
  OK(nvml.processes(h, &count, infos));
  EXPECT(count == 0);
  CUcontext ctx;
  CUdeviceptr p;
  OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  OK(cuCtxSetCurrent(ctx));
  OK(cuMemAlloc_v2(&p, 1000));
  count = 0;
  EXPECT(nvml.processes(h, &count, NULL) == NVML_ERROR_INSUFFICIENT_SIZE && count == 1);
  count = 0;
  EXPECT(nvml.processes(h, &count, infos) == NVML_ERROR_INSUFFICIENT_SIZE && count == 1);
  count = 1;
  EXPECT(nvml.processes(h, &count, NULL) == NVML_ERROR_INSUFFICIENT_SIZE && count == 1);
  count = 2;
  OK(nvml.processes(h, &count, infos));
  EXPECT(count == 1 && infos[0].pid == (unsigned)getpid() && infos[0].usedGpuMemory == 1024);
  nvmlDevice_t h1 = NULL;
  OK(nvml.by_index(1, &h1));
  count = 2;
  OK(nvml.processes(h1, &count, infos)); /* nothing on device 1 */
  EXPECT(count == 0);
  OK(cuMemFree_v2(p));
  OK(cuDevicePrimaryCtxRelease(0));
  /* Reference counted, as NVML's. */
  OK(nvml.init());
  OK(nvml.shutdown());
  OK(nvml.count((unsigned[1]){0}));
  OK(nvml.shutdown());
  EXPECT(nvml.count((unsigned[1]){0}) == 1);
  if (!g_failed) printf("ok\n");
  return g_failed;
}

static int probe_nvmlfail(void) {
  EXPECT(nvml.init_v2() == 999);
  EXPECT(nvml.init() == 999);
  nvmlDevice_t h;
  EXPECT(nvml.by_index(0, &h) == 1);
  unsigned count = 0;
  EXPECT(nvml.processes(NULL, &count, NULL) == 1);
  if (!g_failed) printf("ok\n");
  return g_failed;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: shared_probe uuid|mem [MIB]|procs [MIB]|ctx|errors|nvmlfail\n");
    return 2;
  }
  load_nvml();
  const char* cmd = argv[1];
  if (strcmp(cmd, "uuid") == 0) return probe_uuid();
  if (strcmp(cmd, "mem") == 0) return probe_mem(argc > 2 ? strtoull(argv[2], NULL, 0) : 0);
  if (strcmp(cmd, "procs") == 0) return probe_procs(argc > 2 ? strtoull(argv[2], NULL, 0) : 0);
  if (strcmp(cmd, "ctx") == 0) return probe_ctx();
  if (strcmp(cmd, "errors") == 0) return probe_errors();
  if (strcmp(cmd, "nvmlfail") == 0) return probe_nvmlfail();
  fprintf(stderr, "shared_probe: unknown command %s\n", cmd);
  return 2;
}
