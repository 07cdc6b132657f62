/* One simulated GPU shared by several processes (STANDIN_SHARED=<file>).
 *
 * Compiled into both the stand-in libcuda.so.1 and the stand-in
 * libnvidia-ml.so.1 (each gets its own hidden copy, with its own state), so
 * NVML reads the device's usage straight from the file, as the real NVML
 * asks the kernel driver, whether or not libcuda is loaded.
 *
 * The file holds one slot per process: its pid and its device usage (and its
 * pinned host memory, under the pseudo-device SB_HOST). A slot
 * counts only while its owner holds an OFD write lock on the slot's byte
 * (fcntl F_OFD_SETLK). The kernel drops that lock when the process exits,
 * SIGKILL included, before it is reaped, as the real driver frees a process's
 * memory when its device files close; kill(pid, 0) would still see a zombie,
 * and a reused pid. Allocation is check-and-add under an OFD lock on byte 0
 * of the file, which no dead process can leave held either.
 *
 * Not thread-safe: each library serializes its calls (libcuda with its big
 * lock, NVML with its own). After fork() a claiming user gets a fresh open
 * file description and a new slot on its next call. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SB_HIDDEN __attribute__((visibility("hidden")))

#define SB_MAX_DEVICES 8
/* Pinned host memory (STANDIN_HOST_CAPACITY with STANDIN_SHARED) is charged
   to one more account after the devices', so it gets the same check-and-add
   and the same liveness as device memory. It is no device: NVML and
   standin_used* only ever ask for indices below sb_devices() (<= 8). */
#define SB_HOST SB_MAX_DEVICES
#define SB_ACCOUNTS (SB_MAX_DEVICES + 1)
#define SB_SLOTS 128
#define SB_MAGIC 0x53424731u /* "SBG1" */
#define SB_VERSION 2u        /* 2: SB_HOST added to each slot */

typedef struct SbSlot {
  int32_t pid; /* last owner; the slot counts only while its byte is locked */
  uint32_t pad;
  uint64_t used[SB_ACCOUNTS]; /* bytes that process holds, per device + SB_HOST */
} SbSlot;

/* The file's layout (tests may read it; all fields little-endian). */
typedef struct SbFile {
  uint32_t magic;
  uint32_t version;
  uint64_t nvml_memory_info_calls; /* nvmlDeviceGetMemoryInfo(_v2), all processes */
  uint64_t reserved[6];
  SbSlot slots[SB_SLOTS];
} SbFile;

/* STANDIN_SHARED, or NULL when unset or empty. */
SB_HIDDEN const char* sb_path(void);

/* Opens (creating it 0600) and maps the file; with `claim`, takes a slot for
   this process (libcuda does, NVML only reads). Exits the process with a
   message on failure: silently falling back to a private budget would make
   a test pass for the wrong reason. Later calls are cheap. */
SB_HIDDEN void sb_attach(int claim);

/* In the calls below `dev` is a device ordinal or SB_HOST. */

/* Bytes used on `dev` by all live processes (this one included). */
SB_HIDDEN uint64_t sb_used_all(int dev);

/* Atomically across processes: if everyone else's usage + mine + add fits in
   capacity, publish mine + add as this process's usage and return 1;
   otherwise change nothing and return 0. */
SB_HIDDEN int sb_try_charge(int dev, uint64_t mine, uint64_t add, uint64_t capacity);

/* Publish this process's usage of `dev` (after a free). */
SB_HIDDEN void sb_set_mine(int dev, uint64_t mine);

/* One live process's usage of a device, for NVML's per-process query. */
typedef struct SbProcUsage {
  int32_t pid;
  uint64_t used;
} SbProcUsage;

/* The live processes (this one included) with a nonzero usage of `dev`, in
   slot order: fills up to `max` entries of `out` and returns how many there
   are. One snapshot under the allocation lock, so no charge is half seen and
   NVML can size and fill its answer from a single call. */
SB_HIDDEN int sb_list(int dev, SbProcUsage* out, int max);

SB_HIDDEN void sb_count_nvml_call(void);
SB_HIDDEN uint64_t sb_nvml_calls(void);

/* The device's 16-byte UUID: a hash of the shared file's real path and the
   ordinal with STANDIN_SHARED (every process on the file sees one GPU),
   else of the pid and the ordinal (every process has a GPU of its own). */
SB_HIDDEN void sb_uuid(int dev, unsigned char out[16]);

/* Environment sizes shared by both libraries. */
SB_HIDDEN uint64_t sb_env_u64(const char* name, uint64_t def);
SB_HIDDEN uint64_t sb_capacity(void); /* STANDIN_CAPACITY, default 1 GiB */
SB_HIDDEN int sb_devices(void);       /* STANDIN_DEVICES, default 2, at most 8 */

#ifdef __cplusplus
}
#endif
