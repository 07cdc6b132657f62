// The stand-in CUDA test client's shared parts: the driver entry points the
// scenarios call (however the mode found them), what the run expects of
// gpupool, the helpers the scenario groups share, and the one list of
// scenarios (client_main.cpp dispatches on it).
//
// A CUDA driver-API program run against the stand-in libcuda, with and
// without gpupool preloaded. The same scenarios run through the three ways
// programs reach the driver:
//   linked    - cuda_client_linked, linked with -lcuda: calls the exports;
//   dlsym     - dlopen("libcuda.so.1", RTLD_LOCAL or RTLD_GLOBAL) + dlsym;
//   procaddr  - dlopen + dlsym("cuGetProcAddress_v2") only, every other entry
//               point from it with the old ABI versions cudart asks for.
//
// usage: cuda_client_{linked,dl} MODE SCENARIO
// CLIENT_POOLED=1 says gpupool is expected to pool (counters then show the
// calls it saved); GPUPOOL_REUSE=immediate is read to know the fence policy.
// Every check prints what failed and exits 1.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <string>
#include <vector>

#include "check.h"
#include "standin.h"

// Every scenario, by its name on the command line; each is defined as
// scenario_NAME() in the file of its group:
//   client_alloc.cpp     reuse overlap pitch threads  (blocks served and reused)
//   client_errors.cpp    errors ptrattr oom           (what the driver answers)
//   client_fences.cpp    fence solo ordered           (when a freed block is reused)
//   client_contexts.cpp  context lifetime             (blocks of contexts that end)
//   client_process.cpp   fork exit lookup             (the process around the pool)
//   client_split.cpp     split ipc peer               (pieces of driver allocations)
#define CLIENT_SCENARIOS(X) \
  X(reuse)                  \
  X(overlap)                \
  X(pitch)                  \
  X(threads)                \
  X(errors)                 \
  X(ptrattr)                \
  X(oom)                    \
  X(fence)                  \
  X(solo)                   \
  X(ordered)                \
  X(context)                \
  X(fork)                   \
  X(lifetime)               \
  X(exit)                   \
  X(lookup)                 \
  X(split)                  \
  X(ipc)                    \
  X(peer)

namespace client {

using GetProcV2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                               CUdriverProcAddressQueryResult*);
using GetProcV1 = CUresult (*)(const char*, void**, int, cuuint64_t);

struct Api {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuCtxCreate_v4) ctx_create;
  decltype(&cuCtxDestroy_v2) ctx_destroy;
  CUresult (*ctx_attach)(CUcontext*, unsigned);  // deprecated, still exported
  CUresult (*ctx_detach)(CUcontext);
  decltype(&cuCtxGetCurrent) ctx_get_current;
  decltype(&cuCtxSetCurrent) ctx_set_current;
  decltype(&cuCtxPushCurrent_v2) ctx_push;
  decltype(&cuCtxPopCurrent_v2) ctx_pop;
  decltype(&cuCtxSynchronize) ctx_sync;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain;
  CUresult (*primary_release)(CUdevice);
  CUresult (*primary_reset)(CUdevice);
  decltype(&cuMemAlloc_v2) mem_alloc;
  decltype(&cuMemAllocPitch_v2) mem_alloc_pitch;
  decltype(&cuMemFree_v2) mem_free;
  decltype(&cuMemAllocHost_v2) mem_alloc_host;
  decltype(&cuMemHostAlloc) host_alloc;
  decltype(&cuMemFreeHost) free_host;
  decltype(&cuMemGetInfo_v2) get_info;
  decltype(&cuMemGetAddressRange_v2) address_range;
  decltype(&cuPointerGetAttribute) ptr_attr;
  decltype(&cuPointerGetAttributes) ptr_attrs;
  decltype(&cuMemHostGetFlags) host_get_flags;
  decltype(&cuIpcGetMemHandle) ipc_get;
  decltype(&cuIpcOpenMemHandle) ipc_open;
  decltype(&cuIpcCloseMemHandle) ipc_close;
  CUresult (*memset_async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  decltype(&cuMemAllocManaged) mem_alloc_managed;
  decltype(&cuStreamCreate) stream_create;
  decltype(&cuStreamDestroy_v2) stream_destroy;
  decltype(&cuPointerSetAttribute) ptr_set_attr;
  decltype(&cuMemGetHandleForAddressRange) dma_buf_export;
  decltype(&cuCtxEnablePeerAccess) enable_peer;
  GetProcV2 get_proc;

  // The stand-in's test interface.
  decltype(&standin_counters) counters;
  decltype(&standin_fail_next) fail_next;
  decltype(&standin_used) used;
  decltype(&standin_own) own;
  decltype(&standin_pending_ops) pending_ops;
  decltype(&standin_dead_writes) dead_writes;
  decltype(&standin_hold_syncs) hold_syncs;
  decltype(&standin_syncs_held) syncs_held;
};

extern Api api;
extern std::string g_mode;
extern bool g_pooled;
extern bool g_immediate;
// GPUPOOL_REUSE=ordered, pooled: device blocks the device may still use are
// handed out at once, the streams made to wait for their old work.
extern bool g_ordered;
// Safe reuse may allocate fresh blocks instead of waiting (GPUPOOL_PENDING_GROWTH).
extern bool g_growth;
extern bool g_expandable;  // GPUPOOL_SEGMENTS=expandable, pooled
extern void* g_handle;     // dlopen'ed libcuda (dl modes)

StandinCounters snap();

// gpupool's C API when it is preloaded (free_held, to make it release
// everything it holds).
void free_held();

// cuInit, device 0, and a context: a created one, or the primary context the
// way cudart uses it (procaddr mode).
CUcontext setup();
CUcontext create_ctx(int ordinal);

void fill(CUdeviceptr p, size_t n, unsigned char v);
bool all_equal(CUdeviceptr p, size_t n, unsigned char v);

// A block the program holds: address, size, the byte it was filled with,
// pinned or device.
struct Live {
  uintptr_t p;
  size_t n;
  unsigned char tag;
  bool host;
};

// b overlaps none of `live` of its kind (exits 1 if it does).
void check_no_overlap(const std::vector<Live>& live, const Live& b);

#define CLIENT_DECLARE_SCENARIO(name) void scenario_##name();
CLIENT_SCENARIOS(CLIENT_DECLARE_SCENARIO)
#undef CLIENT_DECLARE_SCENARIO

}  // namespace client
