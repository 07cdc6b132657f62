/* A stand-in libnvidia-ml.so.1 for machines without a GPU: the few NVML
 * calls a process uses to find its GPU (by UUID) and watch the device's free
 * memory. It lives next to the stand-in libcuda.so.1, so LD_LIBRARY_PATH and
 * dlopen("libnvidia-ml.so.1") find it.
 *
 * Like the real NVML it needs no CUDA context: with STANDIN_SHARED it reads
 * the device usage of every process straight from the shared file
 * (shared_budget.h); without it the device is this process's alone, and the
 * usage is the stand-in libcuda's if that is loaded (0 otherwise). The
 * device UUIDs are the 16 bytes cuDeviceGetUuid gives, in NVML's text form.
 *
 * nvmlDeviceGetComputeRunningProcesses (the v1 ABI, the unversioned symbol)
 * lists each live process using the device and its usage, from the same
 * slots, so a process can tell its own use (a CUDA context, memory outside
 * any pool) from its neighbours'.
 *
 * Like the real NVML, which opens the driver's device files at nvmlInit and
 * works through them, it opens a descriptor at its first nvmlInit (its own
 * file, read-only; the real one's are /dev/nvidiactl and /dev/nvidiaN) and
 * every later call fails (NVML_ERROR_UNINITIALIZED) on a thread whose
 * descriptor table no longer has that file at that number.
 *
 * STANDIN_NVML_FAIL=1: nvmlInit fails with NVML_ERROR_UNKNOWN (a machine
 * where NVML is missing or broken).
 *
 * No nvml.h on the build machines: the types below are NVML's ABI. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shared_budget.h"

typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st* nvmlDevice_t;

typedef struct nvmlMemory_st {
  unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

/* nvmlDeviceGetComputeRunningProcesses' element: the first layout, which
   the unversioned symbol keeps (_v2/_v3 take larger structs). */
typedef struct nvmlProcessInfo_v1_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

#define EXPORT __attribute__((visibility("default")))

/* The handles: one per device, for the life of the process (as NVML's). */
struct nvmlDevice_st {
  unsigned index;
};
static struct nvmlDevice_st g_devs[SB_MAX_DEVICES] = {{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}};
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned g_inits; /* nvmlInit minus nvmlShutdown */
static int g_fd = -1;    /* the "device file", open while initialized */
static struct stat g_fd_stat;

/* Opens this library's own file as the device file. Caller holds g_mu. */
static int open_device_file(void) {
  Dl_info info;
  if (!dladdr((void*)&open_device_file, &info) || !info.dli_fname) return -1;
  const int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  if (fstat(fd, &g_fd_stat) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int fail_init(void) {
  const char* v = getenv("STANDIN_NVML_FAIL");
  return v && *v && strcmp(v, "0") != 0;
}

static nvmlReturn_t init(void) {
  if (fail_init()) return NVML_ERROR_UNKNOWN;
  pthread_mutex_lock(&g_mu);
  if (g_inits == 0) {
    g_fd = open_device_file();
    if (g_fd < 0) {
      pthread_mutex_unlock(&g_mu);
      return NVML_ERROR_UNKNOWN;
    }
  }
  ++g_inits;
  if (sb_path()) sb_attach(0);
  pthread_mutex_unlock(&g_mu);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
  (void)flags;
  return init();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
  pthread_mutex_lock(&g_mu);
  const nvmlReturn_t r = g_inits ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
  if (g_inits && --g_inits == 0) {
    close(g_fd);
    g_fd = -1;
  }
  pthread_mutex_unlock(&g_mu);
  return r;
}

EXPORT const char* nvmlErrorString(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND:
      return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
      return "Argument version mismatch";
    case NVML_ERROR_UNKNOWN:
      return "Unknown Error";
    default:
      return "Unknown Error";
  }
}

/* Initialized, and the device file is where it was opened, in the calling
   thread's descriptor table. */
static int initialized(void) {
  pthread_mutex_lock(&g_mu);
  struct stat st;
  const int r = g_inits > 0 && fstat(g_fd, &st) == 0 && st.st_dev == g_fd_stat.st_dev &&
                st.st_ino == g_fd_stat.st_ino;
  pthread_mutex_unlock(&g_mu);
  return r;
}

/* The handle's index, or -1 if it is not one of ours. */
static int index_of(nvmlDevice_t d) {
  for (int i = 0; i < sb_devices(); ++i)
    if (d == &g_devs[i]) return i;
  return -1;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* count) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!count) return NVML_ERROR_INVALID_ARGUMENT;
  *count = (unsigned)sb_devices();
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int* count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!device || index >= (unsigned)sb_devices()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &g_devs[index];
  return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int* index) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  const int i = index_of(device);
  if (i < 0 || !index) return NVML_ERROR_INVALID_ARGUMENT;
  *index = (unsigned)i;
  return NVML_SUCCESS;
}

/* "GPU-" + the 16 bytes as lowercase hex, grouped 8-4-4-4-12: 40 chars. */
static void uuid_text(int dev, char out[41]) {
  unsigned char b[16];
  pthread_mutex_lock(&g_mu);
  sb_uuid(dev, b);
  pthread_mutex_unlock(&g_mu);
  char* p = out + sprintf(out, "GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    p += sprintf(p, "%02x", b[i]);
  }
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  const int i = index_of(device);
  if (i < 0 || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
  char text[41];
  uuid_text(i, text);
  if (length < sizeof text) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(uuid, text, sizeof text);
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
  for (int i = 0; i < sb_devices(); ++i) {
    char text[41];
    uuid_text(i, text);
    if (strcmp(text, uuid) == 0) {
      *device = &g_devs[i];
      return NVML_SUCCESS;
    }
  }
  return NVML_ERROR_NOT_FOUND;
}

/* Without a shared file the device is this process's: its stand-in
   libcuda's count if loaded (looked up, never loaded from here). Once found,
   the library's reference and standin_used are kept for good (as the real
   NVML keeps its own): gpupool asks on every control round, and GCC 12's
   ThreadSanitizer leaks 1.1 MiB of accounted memory on each dlopen and
   dlclose (its module list, rebuilt and never unmapped), so a dlopen per
   call grew the fork scenario's client by 0.3 GiB/s until fork() failed. */
typedef size_t (*used_fn)(int);
static _Atomic(used_fn) g_standin_used;

static unsigned long long private_used(int dev) {
  used_fn used = atomic_load_explicit(&g_standin_used, memory_order_acquire);
  if (!used) {
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!h) return 0;
    used = (used_fn)dlsym(h, "standin_used");
    if (!used) {
      dlclose(h);
      return 0;
    }
    /* (Two threads at once: both keep a reference, the same function.) */
    atomic_store_explicit(&g_standin_used, used, memory_order_release);
  }
  return used(dev);
}

static nvmlReturn_t memory(nvmlDevice_t device, unsigned long long* total,
                           unsigned long long* used) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  const int i = index_of(device);
  if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
  *total = sb_capacity();
  if (sb_path()) {
    pthread_mutex_lock(&g_mu);
    sb_count_nvml_call();
    *used = sb_used_all(i);
    pthread_mutex_unlock(&g_mu);
  } else {
    *used = private_used(i);
  }
  if (*used > *total) *used = *total;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* mem) {
  if (!mem) return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  unsigned long long total, used;
  const nvmlReturn_t r = memory(device, &total, &used);
  if (r != NVML_SUCCESS) return r;
  mem->total = total;
  mem->used = used;
  mem->free = total - used;
  return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* mem) {
  if (!mem) return initialized() ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  if (mem->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  unsigned long long total, used;
  const nvmlReturn_t r = memory(device, &total, &used);
  if (r != NVML_SUCCESS) return r;
  mem->total = total;
  mem->reserved = 0;
  mem->used = used;
  mem->free = total - used;
  return NVML_SUCCESS;
}

/* The processes using the device (nonzero usage), NVML's way: a too-small
   or absent buffer gets the count needed and INSUFFICIENT_SIZE, so callers
   can size it; none at all is SUCCESS with 0. */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                         unsigned int* infoCount,
                                                         nvmlProcessInfo_v1_t* infos) {
  if (!initialized()) return NVML_ERROR_UNINITIALIZED;
  const int i = index_of(device);
  if (i < 0 || !infoCount) return NVML_ERROR_INVALID_ARGUMENT;
  SbProcUsage procs[SB_SLOTS];
  unsigned n = 0;
  if (sb_path()) {
    pthread_mutex_lock(&g_mu);
    n = (unsigned)sb_list(i, procs, SB_SLOTS);
    pthread_mutex_unlock(&g_mu);
  } else {
    /* The device is this process's alone: listed if it uses it. */
    const unsigned long long used = private_used(i);
    if (used) {
      procs[0].pid = (int32_t)getpid();
      procs[0].used = used;
      n = 1;
    }
  }
  if (n == 0) {
    *infoCount = 0;
    return NVML_SUCCESS;
  }
  if (!infos || *infoCount < n) {
    *infoCount = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (unsigned k = 0; k < n; ++k) {
    infos[k].pid = (unsigned)procs[k].pid;
    infos[k].usedGpuMemory = procs[k].used;
  }
  *infoCount = n;
  return NVML_SUCCESS;
}
