// The real CUDA driver, found at run time (the shim never links libcuda), and
// the table that maps the driver's own entry points to gpupool's hooks.
//
// Substitution is by address: whatever path handed a program a driver
// function (dlsym on a libcuda handle, cuGetProcAddress with any ABI version
// or per-thread flag), if that address is one of the exports we hook, the
// program gets our hook for exactly that export; every other address is
// left alone.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>

namespace gpupool::cuda {

// Signatures of exports that cuda.h hides behind its _v2 macros.
using PFN_cuGetProcAddress_v1 = CUresult (*)(const char*, void**, int, cuuint64_t);
using PFN_cuGetProcAddress_v2 = CUresult (*)(const char*, void**, int, cuuint64_t,
                                             CUdriverProcAddressQueryResult*);
using PFN_dev = CUresult (*)(CUdevice);
using PFN_ctx = CUresult (*)(CUcontext);
using PFN_alloc_async = CUresult (*)(CUdeviceptr*, size_t, CUstream);
using PFN_alloc_from_pool = CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream);
using PFN_free_async = CUresult (*)(CUdeviceptr, CUstream);
using PFN_begin_capture_v1 = CUresult (*)(CUstream);
using PFN_begin_capture = CUresult (*)(CUstream, CUstreamCaptureMode);
using PFN_begin_capture_to_graph = CUresult (*)(CUstream, CUgraph, const CUgraphNode*,
                                                const CUgraphEdgeData*, size_t,
                                                CUstreamCaptureMode);
using PFN_end_capture = CUresult (*)(CUstream, CUgraph*);
using PFN_is_capturing = CUresult (*)(CUstream, CUstreamCaptureStatus*);
using PFN_stream = CUresult (*)(CUstream);
using PFN_ipc_open = CUresult (*)(CUdeviceptr*, CUipcMemHandle, unsigned int);

// Every export we hook: X(export name, Driver field). The hook for export N
// is the hidden function gpupool_hook_N (hooks.cpp), exported as N.
#define GPUPOOL_CUDA_HOOKS(X)                                                                  \
  X(cuMemAlloc_v2, mem_alloc, decltype(&::cuMemAlloc_v2))                                      \
  X(cuMemAllocPitch_v2, mem_alloc_pitch, decltype(&::cuMemAllocPitch_v2))                      \
  X(cuMemFree_v2, mem_free, decltype(&::cuMemFree_v2))                                         \
  X(cuMemAllocHost_v2, mem_alloc_host, decltype(&::cuMemAllocHost_v2))                         \
  X(cuMemHostAlloc, mem_host_alloc, decltype(&::cuMemHostAlloc))                               \
  X(cuMemFreeHost, mem_free_host, decltype(&::cuMemFreeHost))                                  \
  X(cuMemGetInfo_v2, mem_get_info, decltype(&::cuMemGetInfo_v2))                               \
  X(cuMemGetAddressRange_v2, mem_get_address_range, decltype(&::cuMemGetAddressRange_v2))      \
  X(cuPointerGetAttribute, pointer_get_attribute, decltype(&::cuPointerGetAttribute))          \
  X(cuPointerGetAttributes, pointer_get_attributes, decltype(&::cuPointerGetAttributes))       \
  X(cuMemHostGetFlags, mem_host_get_flags, decltype(&::cuMemHostGetFlags))                     \
  X(cuIpcGetMemHandle, ipc_get_mem_handle, decltype(&::cuIpcGetMemHandle))                     \
  X(cuIpcOpenMemHandle, ipc_open_v1, PFN_ipc_open)                                             \
  X(cuIpcOpenMemHandle_v2, ipc_open, PFN_ipc_open)                                             \
  X(cuIpcCloseMemHandle, ipc_close, decltype(&::cuIpcCloseMemHandle))                          \
  X(cuMemAllocAsync, mem_alloc_async, PFN_alloc_async)                                         \
  X(cuMemAllocAsync_ptsz, mem_alloc_async_ptsz, PFN_alloc_async)                               \
  X(cuMemAllocFromPoolAsync, mem_alloc_from_pool, PFN_alloc_from_pool)                         \
  X(cuMemAllocFromPoolAsync_ptsz, mem_alloc_from_pool_ptsz, PFN_alloc_from_pool)               \
  X(cuMemFreeAsync, mem_free_async, PFN_free_async)                                            \
  X(cuMemFreeAsync_ptsz, mem_free_async_ptsz, PFN_free_async)                                  \
  X(cuMemPoolSetAttribute, mem_pool_set_attribute, decltype(&::cuMemPoolSetAttribute))         \
  X(cuMemPoolGetAttribute, mem_pool_get_attribute, decltype(&::cuMemPoolGetAttribute))         \
  X(cuMemPoolDestroy, mem_pool_destroy, decltype(&::cuMemPoolDestroy))                         \
  X(cuDeviceSetMemPool, device_set_mem_pool, decltype(&::cuDeviceSetMemPool))                  \
  X(cuStreamBeginCapture, begin_capture_v1, PFN_begin_capture_v1)                              \
  X(cuStreamBeginCapture_ptsz, begin_capture_v1_ptsz, PFN_begin_capture_v1)                    \
  X(cuStreamBeginCapture_v2, begin_capture, PFN_begin_capture)                                 \
  X(cuStreamBeginCapture_v2_ptsz, begin_capture_ptsz, PFN_begin_capture)                       \
  X(cuStreamBeginCaptureToGraph, begin_capture_to_graph, PFN_begin_capture_to_graph)           \
  X(cuStreamBeginCaptureToGraph_ptsz, begin_capture_to_graph_ptsz, PFN_begin_capture_to_graph) \
  X(cuStreamEndCapture, end_capture, PFN_end_capture)                                          \
  X(cuStreamEndCapture_ptsz, end_capture_ptsz, PFN_end_capture)                                \
  X(cuStreamDestroy, stream_destroy_v1, PFN_stream)                                            \
  X(cuStreamDestroy_v2, stream_destroy, PFN_stream)                                            \
  X(cuMemCreate, mem_create, decltype(&::cuMemCreate))                                         \
  X(cuMemRelease, mem_release, decltype(&::cuMemRelease))                                      \
  X(cuMemAddressReserve, mem_address_reserve, decltype(&::cuMemAddressReserve))                \
  X(cuMemAddressFree, mem_address_free, decltype(&::cuMemAddressFree))                         \
  X(cuMemMap, mem_map, decltype(&::cuMemMap))                                                  \
  X(cuMemUnmap, mem_unmap, decltype(&::cuMemUnmap))                                            \
  X(cuMemSetAccess, mem_set_access, decltype(&::cuMemSetAccess))                               \
  X(cuMemRetainAllocationHandle, mem_retain_handle, decltype(&::cuMemRetainAllocationHandle))  \
  X(cuMemExportToShareableHandle, mem_export, decltype(&::cuMemExportToShareableHandle))       \
  X(cuMemAllocManaged, mem_alloc_managed, decltype(&::cuMemAllocManaged))                      \
  X(cuCtxDestroy, ctx_destroy_v1, PFN_ctx)                                                     \
  X(cuCtxDestroy_v2, ctx_destroy, PFN_ctx)                                                     \
  X(cuCtxDetach, ctx_detach, PFN_ctx)                                                          \
  X(cuDevicePrimaryCtxRelease, primary_release_v1, PFN_dev)                                    \
  X(cuDevicePrimaryCtxRelease_v2, primary_release, PFN_dev)                                    \
  X(cuDevicePrimaryCtxReset, primary_reset_v1, PFN_dev)                                        \
  X(cuDevicePrimaryCtxReset_v2, primary_reset, PFN_dev)                                        \
  X(cuDevicePrimaryCtxRetain, primary_retain, decltype(&::cuDevicePrimaryCtxRetain))           \
  X(cuStreamCreate, stream_create, decltype(&::cuStreamCreate))                                \
  X(cuStreamCreateWithPriority, stream_create_prio, decltype(&::cuStreamCreateWithPriority))   \
  X(cuGreenCtxStreamCreate, green_stream_create, decltype(&::cuGreenCtxStreamCreate))          \
  X(cuCtxEnablePeerAccess, ctx_enable_peer_access, decltype(&::cuCtxEnablePeerAccess))         \
  X(cuPointerSetAttribute, pointer_set_attribute, decltype(&::cuPointerSetAttribute))          \
  X(cuMemGetHandleForAddressRange, mem_get_handle_for_range,                                   \
    decltype(&::cuMemGetHandleForAddressRange))                                                \
  X(cuCtxSynchronize, ctx_synchronize, decltype(&::cuCtxSynchronize))                          \
  X(cuCtxSynchronize_v2, ctx_synchronize_v2, decltype(&::cuCtxSynchronize_v2))                 \
  X(cuGetProcAddress, get_proc_address_v1, PFN_cuGetProcAddress_v1)                            \
  X(cuGetProcAddress_v2, get_proc_address, PFN_cuGetProcAddress_v2)

// Exports we call but do not hook.
#define GPUPOOL_CUDA_USED(X)                                                                 \
  X(cuCtxGetCurrent, ctx_get_current, decltype(&::cuCtxGetCurrent))                          \
  X(cuCtxGetId, ctx_get_id, decltype(&::cuCtxGetId))                                         \
  X(cuCtxGetApiVersion, ctx_get_api_version, decltype(&::cuCtxGetApiVersion))                \
  X(cuCtxGetDevice, ctx_get_device, decltype(&::cuCtxGetDevice))                             \
  X(cuCtxPushCurrent_v2, ctx_push, decltype(&::cuCtxPushCurrent_v2))                         \
  X(cuCtxPopCurrent_v2, ctx_pop, decltype(&::cuCtxPopCurrent_v2))                            \
  X(cuDeviceTotalMem_v2, device_total_mem, decltype(&::cuDeviceTotalMem_v2))                 \
  X(cuDevicePrimaryCtxGetState, primary_get_state, decltype(&::cuDevicePrimaryCtxGetState))  \
  X(cuDeviceGetUuid_v2, device_get_uuid_v2, decltype(&::cuDeviceGetUuid_v2))                 \
  X(cuDeviceGetUuid, device_get_uuid, decltype(&::cuDeviceGetUuid_v2))                       \
  X(cuMemGetAllocationGranularity, mem_get_granularity,                                      \
    decltype(&::cuMemGetAllocationGranularity))                                              \
  X(cuMemPoolTrimTo, mem_pool_trim_to, decltype(&::cuMemPoolTrimTo))                         \
  X(cuDeviceGetMemPool, device_get_mem_pool, decltype(&::cuDeviceGetMemPool))                \
  X(cuDeviceGetDefaultMemPool, device_get_default_mem_pool,                                  \
    decltype(&::cuDeviceGetDefaultMemPool))                                                  \
  X(cuMemImportFromShareableHandle, mem_import, decltype(&::cuMemImportFromShareableHandle)) \
  X(cuMemGetAllocationPropertiesFromHandle, mem_get_properties,                              \
    decltype(&::cuMemGetAllocationPropertiesFromHandle))                                     \
  X(cuDeviceGetAttribute, device_get_attribute, decltype(&::cuDeviceGetAttribute))           \
  X(cuStreamIsCapturing, stream_is_capturing, PFN_is_capturing)                              \
  X(cuStreamIsCapturing_ptsz, stream_is_capturing_ptsz, PFN_is_capturing)                    \
  X(cuCtxRecordEvent, ctx_record_event, decltype(&::cuCtxRecordEvent))                       \
  X(cuEventCreate, event_create, decltype(&::cuEventCreate))                                 \
  X(cuEventQuery, event_query, decltype(&::cuEventQuery))                                    \
  X(cuEventSynchronize, event_synchronize, decltype(&::cuEventSynchronize))                  \
  X(cuStreamWaitEvent, stream_wait_event, decltype(&::cuStreamWaitEvent))

// Real driver entry points. Any of them may be null (an older driver).
struct Driver {
  void* handle = nullptr;
#define GPUPOOL_CUDA_FIELD(name, field, type) type field = nullptr;
  GPUPOOL_CUDA_HOOKS(GPUPOOL_CUDA_FIELD)
  GPUPOOL_CUDA_USED(GPUPOOL_CUDA_FIELD)
#undef GPUPOOL_CUDA_FIELD
};

namespace detail {
extern std::atomic<const Driver*> g_driver;  // once resolved
const Driver* resolve_driver();
}  // namespace detail

// The driver, resolved once: libcuda.so.1 as already loaded by the program
// (also when it was loaded RTLD_LOCAL), else loaded privately. nullptr when
// there is no libcuda at all. Loads and resolves symbols only: never
// initialises CUDA. Inline: every hook asks.
inline const Driver* driver() {
  if (const Driver* d = detail::g_driver.load(std::memory_order_acquire)) return d;
  return detail::resolve_driver();
}

// Like driver(), but never loads libcuda: for the dlsym hook, which must not
// drag the driver into a process that only asked about some other library.
const Driver* driver_if_loaded();

// Our hook for a real driver function address, or nullptr if we do not hook
// it. Cheap (a short linear scan); safe inside the dlsym hook.
void* hook_for(void* real_function);

// Our hooks, in GPUPOOL_CUDA_HOOKS order (hooks.cpp).
extern const void* const kHookAddresses[];

// The real libc dlsym (dlsym.cpp).
using DlsymFn = void* (*)(void*, const char*);
DlsymFn real_dlsym();

}  // namespace gpupool::cuda
