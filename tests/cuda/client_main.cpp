// The stand-in CUDA test client's entry: the driver's entry points found
// the mode's way, the run's expectations, the shared helpers, and the
// dispatch on client.hpp's list of scenarios.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "client.hpp"

namespace client {

Api api;
std::string g_mode;
bool g_pooled = false;
bool g_immediate = false;
bool g_ordered = false;
bool g_growth = false;
bool g_expandable = false;
void* g_handle = nullptr;

StandinCounters snap() { return *api.counters(); }

void free_held() {
  using Fn = int (*)();  // docs/c-api.md
  if (auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpupool_free_held"))) fn();
}

namespace {

#ifdef CLIENT_LINKED
void load_api() {
  CHECK(g_mode == "linked");
  api.init = &cuInit;
  api.device_get = &cuDeviceGet;
  api.ctx_create = &cuCtxCreate_v4;
  api.ctx_destroy = &cuCtxDestroy_v2;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  api.ctx_attach = &cuCtxAttach;
  api.ctx_detach = &cuCtxDetach;
#pragma GCC diagnostic pop
  api.ctx_get_current = &cuCtxGetCurrent;
  api.ctx_set_current = &cuCtxSetCurrent;
  api.ctx_push = &cuCtxPushCurrent_v2;
  api.ctx_pop = &cuCtxPopCurrent_v2;
  api.ctx_sync = &cuCtxSynchronize;
  api.primary_retain = &cuDevicePrimaryCtxRetain;
  api.primary_release = &cuDevicePrimaryCtxRelease_v2;
  api.primary_reset = &cuDevicePrimaryCtxReset_v2;
  api.mem_alloc = &cuMemAlloc_v2;
  api.mem_alloc_pitch = &cuMemAllocPitch_v2;
  api.mem_free = &cuMemFree_v2;
  api.mem_alloc_host = &cuMemAllocHost_v2;
  api.host_alloc = &cuMemHostAlloc;
  api.free_host = &cuMemFreeHost;
  api.get_info = &cuMemGetInfo_v2;
  api.address_range = &cuMemGetAddressRange_v2;
  api.ptr_attr = &cuPointerGetAttribute;
  api.ptr_attrs = &cuPointerGetAttributes;
  api.host_get_flags = &cuMemHostGetFlags;
  api.ipc_get = &cuIpcGetMemHandle;
  api.ipc_open = &cuIpcOpenMemHandle;
  api.ipc_close = &cuIpcCloseMemHandle;
  api.memset_async = &cuMemsetD8Async;
  api.mem_alloc_async = &cuMemAllocAsync;
  api.mem_free_async = &cuMemFreeAsync;
  api.mem_alloc_managed = &cuMemAllocManaged;
  api.stream_create = &cuStreamCreate;
  api.stream_destroy = &cuStreamDestroy_v2;
  api.ptr_set_attr = &cuPointerSetAttribute;
  api.dma_buf_export = &cuMemGetHandleForAddressRange;
  api.enable_peer = &cuCtxEnablePeerAccess;
  api.get_proc = &cuGetProcAddress_v2;
  api.counters = &standin_counters;
  api.fail_next = &standin_fail_next;
  api.used = &standin_used;
  api.own = &standin_own;
  api.pending_ops = &standin_pending_ops;
  api.dead_writes = &standin_dead_writes;
  api.hold_syncs = &standin_hold_syncs;
  api.syncs_held = &standin_syncs_held;
}
#else
template <class T>
void sym(T& out, const char* name) {
  out = reinterpret_cast<T>(dlsym(g_handle, name));
  if (!out) {
    fprintf(stderr, "dlsym(%s): %s\n", name, dlerror());
    exit(1);
  }
}

GetProcV2 g_gpa = nullptr;

template <class T>
void proc(T& out, const char* name, int version, cuuint64_t flags = 0) {
  void* p = nullptr;
  // cudart passes symbolStatus = NULL.
  const CUresult r = g_gpa(name, &p, version, flags, nullptr);
  if (r != CUDA_SUCCESS || !p) {
    fprintf(stderr, "cuGetProcAddress_v2(%s, %d): %d\n", name, version, int(r));
    exit(1);
  }
  out = reinterpret_cast<T>(p);
}

void load_api() {
  const bool local = g_mode != "dlsym-global";
  g_handle = dlopen("libcuda.so.1", RTLD_NOW | (local ? RTLD_LOCAL : RTLD_GLOBAL));
  if (!g_handle) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    exit(1);
  }
  sym(api.counters, "standin_counters");
  sym(api.fail_next, "standin_fail_next");
  sym(api.used, "standin_used");
  sym(api.own, "standin_own");
  sym(api.pending_ops, "standin_pending_ops");
  sym(api.dead_writes, "standin_dead_writes");
  sym(api.hold_syncs, "standin_hold_syncs");
  sym(api.syncs_held, "standin_syncs_held");
  if (g_mode == "dlsym-local" || g_mode == "dlsym-global") {
    sym(api.init, "cuInit");
    sym(api.device_get, "cuDeviceGet");
    sym(api.ctx_create, "cuCtxCreate_v4");
    sym(api.ctx_destroy, "cuCtxDestroy_v2");
    sym(api.ctx_attach, "cuCtxAttach");
    sym(api.ctx_detach, "cuCtxDetach");
    sym(api.ctx_get_current, "cuCtxGetCurrent");
    sym(api.ctx_set_current, "cuCtxSetCurrent");
    sym(api.ctx_push, "cuCtxPushCurrent_v2");
    sym(api.ctx_pop, "cuCtxPopCurrent_v2");
    sym(api.ctx_sync, "cuCtxSynchronize");
    sym(api.primary_retain, "cuDevicePrimaryCtxRetain");
    sym(api.primary_release, "cuDevicePrimaryCtxRelease_v2");
    sym(api.primary_reset, "cuDevicePrimaryCtxReset_v2");
    sym(api.mem_alloc, "cuMemAlloc_v2");
    sym(api.mem_alloc_pitch, "cuMemAllocPitch_v2");
    sym(api.mem_free, "cuMemFree_v2");
    sym(api.mem_alloc_host, "cuMemAllocHost_v2");
    sym(api.host_alloc, "cuMemHostAlloc");
    sym(api.free_host, "cuMemFreeHost");
    sym(api.get_info, "cuMemGetInfo_v2");
    sym(api.address_range, "cuMemGetAddressRange_v2");
    sym(api.ptr_attr, "cuPointerGetAttribute");
    sym(api.ptr_attrs, "cuPointerGetAttributes");
    sym(api.host_get_flags, "cuMemHostGetFlags");
    sym(api.ipc_get, "cuIpcGetMemHandle");
    sym(api.ipc_open, "cuIpcOpenMemHandle_v2");
    sym(api.ipc_close, "cuIpcCloseMemHandle");
    sym(api.memset_async, "cuMemsetD8Async");
    sym(api.mem_alloc_async, "cuMemAllocAsync");
    sym(api.mem_free_async, "cuMemFreeAsync");
    sym(api.mem_alloc_managed, "cuMemAllocManaged");
    sym(api.stream_create, "cuStreamCreate");
    sym(api.stream_destroy, "cuStreamDestroy_v2");
    sym(api.ptr_set_attr, "cuPointerSetAttribute");
    sym(api.dma_buf_export, "cuMemGetHandleForAddressRange");
    sym(api.enable_peer, "cuCtxEnablePeerAccess");
    sym(api.get_proc, "cuGetProcAddress_v2");
    return;
  }
  CHECK(g_mode == "procaddr");
  // The cudart way: one dlsym, then everything through cuGetProcAddress,
  // including cuGetProcAddress itself (cudart asks twice: 11030 and 12000).
  sym(g_gpa, "cuGetProcAddress_v2");
  proc(g_gpa, "cuGetProcAddress", 12000);
  proc(api.init, "cuInit", 2000);
  proc(api.device_get, "cuDeviceGet", 2000);
  proc(api.ctx_create, "cuCtxCreate", 13000);
  proc(api.ctx_destroy, "cuCtxDestroy", 4000);
  proc(api.ctx_attach, "cuCtxAttach", 2000);
  proc(api.ctx_detach, "cuCtxDetach", 2000);
  proc(api.ctx_get_current, "cuCtxGetCurrent", 4000);
  proc(api.ctx_set_current, "cuCtxSetCurrent", 4000);
  proc(api.ctx_push, "cuCtxPushCurrent", 4000);
  proc(api.ctx_pop, "cuCtxPopCurrent", 4000);
  proc(api.ctx_sync, "cuCtxSynchronize", 2000);
  proc(api.primary_retain, "cuDevicePrimaryCtxRetain", 7000);
  // cudart asks for the v1 primary-context calls.
  proc(api.primary_release, "cuDevicePrimaryCtxRelease", 7000);
  proc(api.primary_reset, "cuDevicePrimaryCtxReset", 7000);
  proc(api.mem_alloc, "cuMemAlloc", 3020);
  proc(api.mem_alloc_pitch, "cuMemAllocPitch", 3020);
  proc(api.mem_free, "cuMemFree", 3020);
  proc(api.mem_alloc_host, "cuMemAllocHost", 3020);
  proc(api.host_alloc, "cuMemHostAlloc", 2020);
  proc(api.free_host, "cuMemFreeHost", 2000);
  proc(api.get_info, "cuMemGetInfo", 3020);
  proc(api.address_range, "cuMemGetAddressRange", 3020);
  proc(api.ptr_attr, "cuPointerGetAttribute", 4000);
  proc(api.ptr_attrs, "cuPointerGetAttributes", 7000);
  proc(api.host_get_flags, "cuMemHostGetFlags", 2030);
  proc(api.ipc_get, "cuIpcGetMemHandle", 4010);
  proc(api.ipc_open, "cuIpcOpenMemHandle", 11000);
  proc(api.ipc_close, "cuIpcCloseMemHandle", 4010);
  proc(api.memset_async, "cuMemsetD8Async", 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  proc(api.mem_alloc_async, "cuMemAllocAsync", 11020,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  proc(api.mem_free_async, "cuMemFreeAsync", 11020);
  proc(api.mem_alloc_managed, "cuMemAllocManaged", 6000);
  proc(api.stream_create, "cuStreamCreate", 2000);
  proc(api.stream_destroy, "cuStreamDestroy", 4000);
  proc(api.ptr_set_attr, "cuPointerSetAttribute", 6000);
  proc(api.dma_buf_export, "cuMemGetHandleForAddressRange", 11070);
  proc(api.enable_peer, "cuCtxEnablePeerAccess", 4000);
  api.get_proc = g_gpa;
}
#endif

}  // namespace

CUcontext setup() {
  OK(api.init(0));
  CUdevice dev;
  OK(api.device_get(&dev, 0));
  CUcontext ctx = nullptr;
  if (g_mode == "procaddr") {
    OK(api.primary_retain(&ctx, dev));
    OK(api.ctx_set_current(ctx));
  } else {
    OK(api.ctx_create(&ctx, nullptr, 0, dev));
  }
  return ctx;
}

CUcontext create_ctx(int ordinal) {
  CUdevice dev;
  OK(api.device_get(&dev, ordinal));
  CUcontext ctx = nullptr;
  OK(api.ctx_create(&ctx, nullptr, 0, dev));
  return ctx;
}

void fill(CUdeviceptr p, size_t n, unsigned char v) { memset(reinterpret_cast<void*>(p), v, n); }

bool all_equal(CUdeviceptr p, size_t n, unsigned char v) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != v) return false;
  return true;
}

void check_no_overlap(const std::vector<Live>& live, const Live& b) {
  for (const Live& o : live)
    if (o.host == b.host && o.p < b.p + b.n && b.p < o.p + o.n) {
      fprintf(stderr, "overlap: [%#lx,+%zu) and [%#lx,+%zu)\n", (unsigned long)o.p, o.n,
              (unsigned long)b.p, b.n);
      exit(1);
    }
}

}  // namespace client

using namespace client;

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s MODE SCENARIO\n", argv[0]);
    return 2;
  }
  g_mode = argv[1];
  const char* pooled = getenv("CLIENT_POOLED");
  g_pooled = pooled && atoi(pooled) != 0;
  const char* reuse = getenv("GPUPOOL_REUSE");
  g_immediate = reuse && strcmp(reuse, "immediate") == 0;
  g_ordered = g_pooled && reuse && strcmp(reuse, "ordered") == 0;
  const char* growth = getenv("GPUPOOL_PENDING_GROWTH");
  g_growth = g_pooled && !g_immediate && !(growth && strcmp(growth, "0") == 0);
  const char* segments = getenv("GPUPOOL_SEGMENTS");
  g_expandable = g_pooled && segments && strcmp(segments, "expandable") == 0;
  load_api();
  const std::string s = argv[2];
  struct Scenario {
    const char* name;
    void (*run)();
  };
#define CLIENT_SCENARIO_ENTRY(name) {#name, scenario_##name},
  static const Scenario kScenarios[] = {CLIENT_SCENARIOS(CLIENT_SCENARIO_ENTRY)};
#undef CLIENT_SCENARIO_ENTRY
  const Scenario* found = nullptr;
  for (const Scenario& sc : kScenarios)
    if (s == sc.name) found = &sc;
  if (!found) {
    fprintf(stderr, "unknown scenario %s\n", s.c_str());
    return 2;
  }
  found->run();
  // Nothing the scenario wrote landed in memory that had died with its
  // context.
  CHECK_EQ(api.dead_writes(), 0u);
  fprintf(stderr, "%s %s: ok\n", argv[1], argv[2]);
  return 0;
}
