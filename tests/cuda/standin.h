/* The stand-in libcuda.so.1's test interface: what it counts, what it can be
   told to fail. The driver entry points themselves are cuda.h's. */
#pragma once

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct StandinCounters {
  uint64_t mem_alloc;       /* successful cuMemAlloc_v2 and cuMemAllocPitch_v2 */
  uint64_t mem_alloc_calls; /* all cuMemAlloc_v2 calls */
  uint64_t mem_free;        /* successful cuMemFree_v2 */
  uint64_t host_alloc;      /* successful cuMemHostAlloc / cuMemAllocHost_v2 */
  uint64_t host_alloc_calls;
  uint64_t host_free;        /* successful cuMemFreeHost */
  uint64_t ctx_sync;         /* cuCtxSynchronize / _v2 calls that succeeded */
  uint64_t get_proc_address; /* cuGetProcAddress / _v2 calls */
  uint64_t dead_ptr_calls;   /* calls naming memory freed by a context teardown */
  uint64_t ipc_handles;
  uint64_t last_alloc_size;       /* size of the last successful cuMemAlloc_v2 */
  uint64_t ops_executed;          /* async operations run at a synchronization */
  uint64_t mem_alloc_pitch_calls; /* all cuMemAllocPitch_v2 calls */
  uint64_t dead_writes;           /* allocations that died with their context and were
                                     written afterwards (seen when their addresses are
                                     reused, or at standin_dead_writes()) */
  uint64_t streams_created;       /* successful cuStreamCreate / WithPriority */
  /* The virtual memory API (cuMemCreate ...). */
  uint64_t vmm_create_calls;       /* all cuMemCreate calls */
  uint64_t vmm_created;            /* physical allocations made */
  uint64_t vmm_freed;              /* physical allocations gone (released and unmapped) */
  uint64_t vmm_reserve_calls;      /* cuMemAddressReserve calls */
  uint64_t vmm_address_free_calls; /* cuMemAddressFree calls */
  uint64_t vmm_map_calls;          /* cuMemMap calls */
  uint64_t vmm_mapped;             /* successful cuMemMap */
  uint64_t vmm_unmap_calls;        /* cuMemUnmap calls */
  uint64_t vmm_set_access_calls;   /* cuMemSetAccess calls */
  uint64_t stream_sync;            /* cuStreamSynchronize / _ptsz calls that succeeded */
  uint64_t async_allocs;           /* cuMemAllocAsync / FromPoolAsync calls that reached a pool */
  uint64_t pool_creations;         /* physical memory a memory pool created (one per chunk) */
  uint64_t pool_releases;          /* chunks a memory pool gave back to the device */
  uint64_t trim_calls;             /* cuMemPoolTrimTo calls on a valid pool */
  uint64_t trims_refused;          /* of them, refused while a stream captured (global mode) */
  uint64_t vmm_imported;           /* physical allocations imported from a descriptor */
  uint64_t ipc_opens_refused;      /* cuIpcOpenMemHandle calls (none can succeed here) */
  uint64_t dead_pool_calls;        /* calls naming a memory pool after its cuMemPoolDestroy */
  uint64_t ctx_events;             /* cuCtxRecordEvent calls that recorded */
  uint64_t ctx_events_in_capture;  /* cuCtxRecordEvent calls while a stream captured (global) */
  uint64_t event_sync;             /* cuEventSynchronize calls on a context's event */
  uint64_t stream_waits;           /* cuStreamWaitEvent calls that succeeded */
  uint64_t sync_memops_set;        /* cuPointerSetAttribute(SYNC_MEMOPS) that succeeded */
  uint64_t dma_buf_exports;        /* cuMemGetHandleForAddressRange that succeeded */
} StandinCounters;

/* Live counters (the struct is updated in place). */
StandinCounters* standin_counters(void);

/* The next `count` calls of `function` ("cuMemAlloc_v2", "cuMemHostAlloc")
   fail with `error` (CUDA_ERROR_OUT_OF_MEMORY gives a real OOM). */
void standin_fail_next(const char* function, int count, CUresult error);

/* Device memory capacity per device (bytes); also STANDIN_CAPACITY. */
void standin_set_capacity(size_t bytes);

/* Bytes of device memory in use on `dev` by this process: driver
   allocations, plus STANDIN_CONTEXT_BYTES (default 0) for each live context
   on it (created, or a primary context while retained), which is what a
   context takes on a real GPU outside any allocator. A context that does not
   fit fails to be created (or retained) with CUDA_ERROR_OUT_OF_MEMORY. */
size_t standin_used(int dev);

/* Several processes on one GPU: with STANDIN_SHARED=<file> every process
   naming the same file shares each device's STANDIN_CAPACITY (accounted in
   that file; a process stops counting when it exits or is killed), and sees
   the same device UUIDs; cuMemGetInfo_v2's free is what all of them leave.
   Without it each process has devices of its own, as before.
   Pinned host memory (cuMemHostAlloc, cuMemAllocHost_v2) is limited to
   STANDIN_HOST_CAPACITY bytes (default 1 GiB) per process; with
   STANDIN_SHARED and STANDIN_HOST_CAPACITY both set, that limit is shared
   the same way by every process on the file (a host account in the file
   that no device, NVML list or standin_used* includes). Out of it:
   CUDA_ERROR_OUT_OF_MEMORY, nothing changed. */

/* Bytes in use on `dev` by all live processes sharing the file (this
   process's alone without STANDIN_SHARED). */
size_t standin_used_all(int dev);

/* nvmlDeviceGetMemoryInfo(_v2) calls counted in the shared file (all
   processes; the stand-in libnvidia-ml.so.1 counts them); 0 without
   STANDIN_SHARED. */
uint64_t standin_nvml_memory_info_calls(void);

/* Checks every allocation that died with its context and is still kept
   aside (the last 64 MiB of them) for writes after its death; returns
   dead_writes. */
uint64_t standin_dead_writes(void);

/* The stand-in's own address of an export, to tell it from a hook. */
void* standin_own(const char* name);

/* Asynchronous operations (cuMemsetD8Async) not yet run that write
   [p, p + n). They run at the next synchronization of their context (or a
   cuMemFree/cuMemFreeHost there, which waits for the context like the real
   driver). */
int standin_pending_ops(CUdeviceptr p, size_t n);

/* While `hold` is set, cuCtxSynchronize and cuCtxSynchronize_v2 wait on
   entry, before they look at anything (a synchronization in flight, as one
   of a busy device); standin_syncs_held() says how many wait so. */
void standin_hold_syncs(int hold);
int standin_syncs_held(void);

#ifdef __cplusplus
}
#endif
