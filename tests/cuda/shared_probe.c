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
 *   shared_probe errors       error codes of the new entry points
 *   shared_probe nvmlfail     STANDIN_NVML_FAIL=1: nvmlInit fails */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;

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
} nvml;

static int g_failed;
#define EXPECT(cond)                                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      fprintf(stderr, "shared_probe:%d: %s\n", __LINE__, #cond);     \
      g_failed = 1;                                                  \
    }                                                                \
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
    CUresult (*v1)(CUuuid*, CUdevice) = (CUresult(*)(CUuuid*, CUdevice))standin_own("cuDeviceGetUuid");
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

static int probe_mem(unsigned long long mib) {
  OK(cuInit(0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, 0));
  OK(cuCtxSetCurrent(ctx));
  CUdeviceptr p = 0;
  if (mib) OK(cuMemAlloc_v2(&p, (size_t)mib << 20));
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

static int probe_errors(void) {
  CUuuid u;
  nvmlDevice_t h = NULL;
  char text[96];
  nvmlMemory_t m;
  /* Before initialisation. */
  EXPECT(cuDeviceGetUuid(&u, 0) == CUDA_ERROR_NOT_INITIALIZED);
  EXPECT(nvml.count((unsigned[1]){0}) == 1);       /* NVML_ERROR_UNINITIALIZED */
  EXPECT(nvml.by_index(0, &h) == 1);
  EXPECT(nvml.shutdown() == 1);
  OK(cuInit(0));
  OK(nvml.init_v2());
  EXPECT(cuDeviceGetUuid(NULL, 0) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(cuDeviceGetUuid(&u, 99) == CUDA_ERROR_INVALID_DEVICE);
  EXPECT(cuDeviceGetUuid(&u, -1) == CUDA_ERROR_INVALID_DEVICE);
  CUresult (*v1)(CUuuid*, CUdevice) = (CUresult(*)(CUuuid*, CUdevice))standin_own("cuDeviceGetUuid");
  EXPECT(v1(NULL, 0) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(v1(&u, 99) == CUDA_ERROR_INVALID_DEVICE);
  void* f = NULL;
  CUdriverProcAddressQueryResult status;
  EXPECT(cuGetProcAddress_v2("cuDeviceGetUuid", &f, 9000, 0, &status) == CUDA_ERROR_NOT_FOUND);
  EXPECT(status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT(nvml.by_index(99, &h) == 2);                /* INVALID_ARGUMENT */
  EXPECT(nvml.by_index(0, NULL) == 2);
  EXPECT(nvml.by_uuid("GPU-nope", &h) == 6);         /* NOT_FOUND */
  EXPECT(nvml.by_uuid(NULL, &h) == 2);
  OK(nvml.by_index(0, &h));
  EXPECT(nvml.uuid(h, text, 10) == 7);               /* INSUFFICIENT_SIZE */
  EXPECT(nvml.uuid(h, text, 41) == 0 && strlen(text) == 40);
  EXPECT(nvml.uuid((nvmlDevice_t)&m, text, sizeof text) == 2);
  EXPECT(nvml.memory(h, NULL) == 2);
  EXPECT(nvml.memory((nvmlDevice_t)&m, &m) == 2);
  EXPECT(strcmp(nvml.error_string(999), "Unknown Error") == 0);
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
  if (!g_failed) printf("ok\n");
  return g_failed;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: shared_probe uuid|mem [MIB]|errors|nvmlfail\n");
    return 2;
  }
  load_nvml();
  const char* cmd = argv[1];
  if (strcmp(cmd, "uuid") == 0) return probe_uuid();
  if (strcmp(cmd, "mem") == 0) return probe_mem(argc > 2 ? strtoull(argv[2], NULL, 0) : 0);
  if (strcmp(cmd, "errors") == 0) return probe_errors();
  if (strcmp(cmd, "nvmlfail") == 0) return probe_nvmlfail();
  fprintf(stderr, "shared_probe: unknown command %s\n", cmd);
  return 2;
}
