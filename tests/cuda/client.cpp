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
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "standin.h"

#ifdef CLIENT_LINKED
extern "C" int client_call_next(void);  // next_a.c
#endif

#include "check.h"

namespace {

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
  CUresult (*memset_async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*mem_alloc_async)(CUdeviceptr*, size_t, CUstream);
  CUresult (*mem_free_async)(CUdeviceptr, CUstream);
  decltype(&cuMemAllocManaged) mem_alloc_managed;
  decltype(&cuStreamCreate) stream_create;
  decltype(&cuCtxEnablePeerAccess) enable_peer;
  GetProcV2 get_proc;

  // The stand-in's test interface.
  decltype(&standin_counters) counters;
  decltype(&standin_fail_next) fail_next;
  decltype(&standin_used) used;
  decltype(&standin_own) own;
  decltype(&standin_pending_ops) pending_ops;
  decltype(&standin_dead_writes) dead_writes;
};

Api api;
std::string g_mode;
bool g_pooled = false;
bool g_immediate = false;
// Safe reuse may allocate fresh blocks instead of waiting (GPUPOOL_PENDING_GROWTH).
bool g_growth = false;
bool g_expandable = false;                  // GPUPOOL_SEGMENTS=expandable, pooled
[[maybe_unused]] void* g_handle = nullptr;  // dlopen'ed libcuda (dl modes)

StandinCounters snap() { return *api.counters(); }

// gpupool's C API when it is preloaded (free_held, to make it release
// everything it holds).
void free_held() {
  using Fn = int (*)();  // docs/c-api.md
  if (auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpupool_free_held"))) fn();
}

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
  api.memset_async = &cuMemsetD8Async;
  api.mem_alloc_async = &cuMemAllocAsync;
  api.mem_free_async = &cuMemFreeAsync;
  api.mem_alloc_managed = &cuMemAllocManaged;
  api.stream_create = &cuStreamCreate;
  api.enable_peer = &cuCtxEnablePeerAccess;
  api.get_proc = &cuGetProcAddress_v2;
  api.counters = &standin_counters;
  api.fail_next = &standin_fail_next;
  api.used = &standin_used;
  api.own = &standin_own;
  api.pending_ops = &standin_pending_ops;
  api.dead_writes = &standin_dead_writes;
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
    sym(api.memset_async, "cuMemsetD8Async");
    sym(api.mem_alloc_async, "cuMemAllocAsync");
    sym(api.mem_free_async, "cuMemFreeAsync");
    sym(api.mem_alloc_managed, "cuMemAllocManaged");
    sym(api.stream_create, "cuStreamCreate");
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
  proc(api.memset_async, "cuMemsetD8Async", 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  proc(api.mem_alloc_async, "cuMemAllocAsync", 11020,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  proc(api.mem_free_async, "cuMemFreeAsync", 11020);
  proc(api.mem_alloc_managed, "cuMemAllocManaged", 6000);
  proc(api.stream_create, "cuStreamCreate", 2000);
  proc(api.enable_peer, "cuCtxEnablePeerAccess", 4000);
  api.get_proc = g_gpa;
}
#endif

// cuInit, device 0, and a context: a created one, or the primary context the
// way cudart uses it (procaddr mode).
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

// ---- scenarios -------------------------------------------------------------

// Repeated alloc+free pairs: the driver sees one allocation when pooled.
void scenario_reuse() {
  setup();
  // A stream of the program's own: fences decide every reuse (no solo rule,
  // scenario_solo).
  CUstream stream = nullptr;
  OK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
  StandinCounters c0 = snap();
  for (int i = 0; i < 100; ++i) {
    CUdeviceptr p = 0;
    OK(api.mem_alloc(&p, 1000));
    fill(p, 1000, static_cast<unsigned char>(i));
    OK(api.mem_free(p));
    OK(api.ctx_sync());
  }
  StandinCounters c1 = snap();
  CHECK_EQ(c1.mem_alloc - c0.mem_alloc, g_pooled ? 1u : 100u);
  CHECK_EQ(c1.mem_free - c0.mem_free, g_pooled ? 0u : 100u);
  // The program synchronized before every reuse: no fence wait of our own.
  CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 100u);

  // Without the program's synchronizations (and a new size): safe mode
  // waits once per reuse of a block freed since the last synchronization,
  // immediate never. With growth, the first pair that finds its block
  // pending gets a fresh one; later ones only as the waits' time pays for
  // them (timing-dependent). Each pair grows, waits or hits, and every wait
  // frees all the size's blocks (two or more).
  for (int i = 0; i < 50; ++i) {
    CUdeviceptr p = 0;
    OK(api.mem_alloc(&p, 3000));
    OK(api.mem_free(p));
  }
  StandinCounters c2 = snap();
  const unsigned long long grown = c2.mem_alloc - c1.mem_alloc, waits = c2.ctx_sync - c1.ctx_sync;
  fprintf(stderr, "50 pairs: %llu allocations, %llu waits\n", grown, waits);
  if (g_growth) {
    CHECK(grown >= 2);  // the size's miss and its first growth
    CHECK(grown + waits <= 50 && waits <= 25);
  } else {
    CHECK_EQ(grown, (!g_pooled ? 50u : 1u));
    CHECK_EQ(waits, (!g_pooled || g_immediate ? 0u : 49u));
  }

  // Pinned memory: flags 0, cuMemAllocHost and DEVICEMAP are one family (the
  // driver reports DEVICEMAP for all of them); PORTABLE is another.
  for (int i = 0; i < 20; ++i) {
    void* h = nullptr;
    OK(api.host_alloc(&h, 5000, 0));
    CHECK(h != nullptr);
    OK(api.ctx_sync());
    OK(api.free_host(h));
  }
  void* h = nullptr;
  OK(api.mem_alloc_host(&h, 5000));
  unsigned flags = 0;
  OK(api.host_get_flags(&flags, h));
  CHECK_EQ(flags, 2u);
  OK(api.ctx_sync());
  OK(api.free_host(h));
  OK(api.host_alloc(&h, 5000, CU_MEMHOSTALLOC_DEVICEMAP));
  OK(api.ctx_sync());
  OK(api.free_host(h));
  StandinCounters c3 = snap();
  // Each block is freed after the program's synchronization, so it is
  // pending at the next allocation: the family grows once at once, then
  // only as its waits pay for it (timing-dependent, as above).
  const unsigned long long host_allocs = c3.host_alloc - c2.host_alloc;
  const unsigned long long host_waits = c3.ctx_sync - c2.ctx_sync - 22;  // less the program's
  fprintf(stderr, "22 pinned pairs: %llu allocations, %llu waits\n", host_allocs, host_waits);
  if (g_growth) CHECK(host_allocs >= 2 && host_allocs + host_waits <= 22);
  else CHECK_EQ(host_allocs, (g_pooled ? 1u : 22u));
  OK(api.host_alloc(&h, 5000, CU_MEMHOSTALLOC_PORTABLE));
  OK(api.host_get_flags(&flags, h));
  CHECK_EQ(flags, 3u);
  OK(api.free_host(h));
  CHECK_EQ(snap().host_alloc - c3.host_alloc, 1u);

  // Large blocks: up to a quarter of the device's memory (GPUPOOL_MAX_POOLED's
  // default) a freed block is held for reuse; a larger one goes back to the
  // driver at every free.
  size_t free_bytes = 0, total = 0;
  OK(api.get_info(&free_bytes, &total));
  for (size_t bytes : {total / 4 - total / 64, total / 4 + total / 64}) {
    StandinCounters before = snap();
    for (int i = 0; i < 2; ++i) {
      CUdeviceptr p = 0;
      OK(api.mem_alloc(&p, bytes));
      OK(api.mem_free(p));
      OK(api.ctx_sync());
    }
    const bool held = g_pooled && bytes <= total / 4;
    CHECK_EQ(snap().mem_alloc - before.mem_alloc, held ? 1u : 2u);
    CHECK_EQ(snap().mem_free - before.mem_free, held ? 0u : 2u);
  }
}

struct Live {
  uintptr_t p;
  size_t n;
  unsigned char tag;
  bool host;
};

void check_no_overlap(const std::vector<Live>& live, const Live& b) {
  for (const Live& o : live)
    if (o.host == b.host && o.p < b.p + b.n && b.p < o.p + o.n) {
      fprintf(stderr, "overlap: [%#lx,+%zu) and [%#lx,+%zu)\n", (unsigned long)o.p, o.n,
              (unsigned long)b.p, b.n);
      exit(1);
    }
}

// Random alloc/free of device and pinned blocks: live blocks never overlap
// and keep their contents.
void random_ops(std::mt19937_64& rng, int ops, std::vector<Live>& live, std::mutex* shared_mu,
                std::vector<Live>* shared) {
  static const size_t kSizes[] = {1, 255, 512, 1000, 4096, 5000, 65536, 100000, 1 << 20, 3 << 20};
  for (int i = 0; i < ops; ++i) {
    const bool do_free = !live.empty() && (live.size() >= 48 || rng() % 2);
    if (do_free) {
      const size_t k = rng() % live.size();
      Live b = live[k];
      live.erase(live.begin() + k);
      CHECK(all_equal(b.p, b.n, b.tag));
      if (shared) {
        std::lock_guard lock(*shared_mu);
        auto it = std::find_if(shared->begin(), shared->end(),
                               [&](const Live& o) { return o.p == b.p && o.host == b.host; });
        CHECK(it != shared->end());
        shared->erase(it);
      }
      if (b.host) OK(api.free_host(reinterpret_cast<void*>(b.p)));
      else OK(api.mem_free(b.p));
    } else {
      Live b{};
      b.n = kSizes[rng() % (sizeof kSizes / sizeof kSizes[0])] + (rng() % 3 == 0 ? rng() % 777 : 0);
      b.host = rng() % 4 == 0;
      b.tag = static_cast<unsigned char>(rng());
      if (b.host) {
        void* h = nullptr;
        OK(api.host_alloc(&h, b.n, static_cast<unsigned>(rng() % 8)));
        b.p = reinterpret_cast<uintptr_t>(h);
      } else {
        CUdeviceptr p = 0;
        OK(api.mem_alloc(&p, b.n));
        b.p = p;
      }
      CHECK(b.p != 0);
      check_no_overlap(live, b);
      if (shared) {
        std::lock_guard lock(*shared_mu);
        check_no_overlap(*shared, b);
        shared->push_back(b);
      }
      fill(b.p, b.n, b.tag);
      live.push_back(b);
    }
    if (rng() % 16 == 0) OK(api.ctx_sync());
  }
  for (const Live& b : live) {
    CHECK(all_equal(b.p, b.n, b.tag));
    if (shared) {
      std::lock_guard lock(*shared_mu);
      shared->erase(std::find_if(shared->begin(), shared->end(),
                                 [&](const Live& o) { return o.p == b.p && o.host == b.host; }));
    }
    if (b.host) OK(api.free_host(reinterpret_cast<void*>(b.p)));
    else OK(api.mem_free(b.p));
  }
  live.clear();
}

// Pitched allocations (cudaMallocPitch, cudaMalloc3D): the driver's pitch
// and errors, the block served and reused by the pool like any device
// allocation.
void scenario_pitch() {
  setup();
  const StandinCounters c0 = snap();
  CUdeviceptr p = 0;
  size_t pitch = 0;
  OK(api.mem_alloc_pitch(&p, &pitch, 1000, 7, 4));
  CHECK_EQ(pitch, 1024u);  // the stand-in's rows: multiples of 512 bytes
  CHECK(p != 0 && p % 512 == 0);
  fill(p, pitch * 7, 0x5a);
  CHECK(all_equal(p, pitch * 7, 0x5a));
  CUdeviceptr base = 0;
  size_t range = 0;
  OK(api.address_range(&base, &range, p + pitch * 7 - 1));
  CHECK_EQ(base, p);
  CHECK_EQ(range, pitch * 7);
  OK(api.mem_free(p));
  OK(api.ctx_sync());
  // The same request again, then a plain allocation of the freed block's
  // size: from the pool, with no new driver call.
  OK(api.mem_alloc_pitch(&p, &pitch, 1000, 7, 4));
  CHECK_EQ(pitch, 1024u);
  OK(api.mem_free(p));
  OK(api.ctx_sync());
  CUdeviceptr q = 0;
  OK(api.mem_alloc(&q, 1024 * 7));
  OK(api.mem_free(q));
  // Another height of a known row: its pitch is not asked again.
  OK(api.mem_alloc_pitch(&p, &pitch, 1000, 5, 4));
  CHECK_EQ(pitch, 1024u);
  OK(api.mem_free(p));
  OK(api.ctx_sync());
  const StandinCounters c1 = snap();
  // Pooled: one row to learn the pitch, one block of 7 rows, one of 5.
  CHECK_EQ(c1.mem_alloc - c0.mem_alloc, g_pooled ? 3u : 4u);
  CHECK_EQ(c1.mem_alloc_pitch_calls - c0.mem_alloc_pitch_calls, g_pooled ? 1u : 3u);

  // The driver's errors, unchanged.
  CHECK_EQ(api.mem_alloc_pitch(&p, &pitch, 1000, 7, 3), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.mem_alloc_pitch(&p, &pitch, 0, 7, 4), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.mem_alloc_pitch(&p, &pitch, 1000, 0, 4), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.mem_alloc_pitch(&p, nullptr, 1000, 7, 4), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.mem_alloc_pitch(&p, &pitch, SIZE_MAX / 2, 3, 16), CUDA_ERROR_INVALID_VALUE);
  // Learning a new row's pitch when the GPU is full: what the pool holds is
  // given back first (the program would have had that memory without us).
  if (g_pooled) {
    const StandinCounters c2 = snap();
    api.fail_next("cuMemAllocPitch_v2", 1, CUDA_ERROR_OUT_OF_MEMORY);
    OK(api.mem_alloc_pitch(&p, &pitch, 3000, 11, 8));
    CHECK_EQ(pitch, 3072u);
    CHECK(snap().mem_free > c2.mem_free);  // the held blocks
    OK(api.mem_free(p));
  }
  // Out of memory: the driver's code.
  CHECK_EQ(api.mem_alloc_pitch(&p, &pitch, 1000, size_t(1) << 40, 4), CUDA_ERROR_OUT_OF_MEMORY);
}

void scenario_overlap() {
  setup();
  StandinCounters c0 = snap();
  std::mt19937_64 rng(12345);
  std::vector<Live> live;
  random_ops(rng, 4000, live, nullptr, nullptr);
  StandinCounters c1 = snap();
  const uint64_t allocs = (c1.mem_alloc - c0.mem_alloc) + (c1.host_alloc - c0.host_alloc);
  fprintf(stderr, "overlap: %llu driver allocations for ~2000 program allocations\n",
          (unsigned long long)allocs);
  if (g_pooled) CHECK(allocs < 400);
  else CHECK(allocs > 1500);
}

void scenario_threads() {
  CUcontext ctx = setup();
  std::mutex mu;
  std::vector<Live> shared;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      OK(api.ctx_set_current(ctx));
      std::mt19937_64 rng(1000 + t);
      std::vector<Live> live;
      random_ops(rng, 3000, live, &mu, &shared);
    });
  for (auto& th : threads) th.join();
  CHECK(shared.empty());
}

// The driver's error codes, pooled or not.
void scenario_errors() {
  CUdeviceptr p = 0;
  CHECK_EQ(api.mem_alloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
  CUcontext ctx = setup();

  p = 0xdead;
  CHECK_EQ(api.mem_alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(p, 0u);
  CHECK_EQ(api.mem_alloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  p = 0xdead;
  CHECK_EQ(api.mem_alloc(&p, size_t{1} << 50), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.mem_alloc(&p, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.mem_free(0), CUDA_SUCCESS);
  CHECK_EQ(api.mem_free(0x1000), CUDA_ERROR_INVALID_VALUE);

  OK(api.mem_alloc(&p, 1000));
  CHECK_EQ(api.mem_free(p + 8), CUDA_ERROR_INVALID_VALUE);     // interior
  CHECK_EQ(api.mem_free(p + 1000), CUDA_ERROR_INVALID_VALUE);  // past the end (padding)
  OK(api.mem_free(p));
  CHECK_EQ(api.mem_free(p), CUDA_ERROR_INVALID_VALUE);  // double free (held block)
  CHECK_EQ(api.mem_free(p), CUDA_ERROR_INVALID_VALUE);

  void* h = reinterpret_cast<void*>(0xdead);
  CHECK_EQ(api.mem_alloc_host(&h, 0), CUDA_SUCCESS);
  CHECK(h == nullptr);
  h = reinterpret_cast<void*>(0xdead);
  CHECK_EQ(api.host_alloc(&h, 0, 0), CUDA_SUCCESS);
  CHECK(h == nullptr);
  CHECK_EQ(api.host_alloc(&h, 4096, 0x80), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.host_alloc(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.host_alloc(&h, size_t{1} << 50, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.free_host(nullptr), CUDA_SUCCESS);
  void* m = malloc(64);
  CHECK_EQ(api.free_host(m), CUDA_ERROR_INVALID_VALUE);
  free(m);

  OK(api.host_alloc(&h, 4096, 0));
  OK(api.mem_alloc(&p, 4096));
  CHECK_EQ(api.mem_free(reinterpret_cast<CUdeviceptr>(h)), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(reinterpret_cast<void*>(p)), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(static_cast<char*>(h) + 16), CUDA_ERROR_INVALID_VALUE);
  OK(api.free_host(h));
  CHECK_EQ(api.free_host(h), CUDA_ERROR_INVALID_VALUE);  // double free (held block)
  OK(api.mem_free(p));

  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_EQ(api.address_range(&base, &size, 0x1000), CUDA_ERROR_NOT_FOUND);
  int ord = 0;
  CHECK_EQ(api.ptr_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 0x1000),
           CUDA_ERROR_INVALID_VALUE);

  // No current context.
  CUcontext popped = nullptr;
  OK(api.ctx_pop(&popped));
  CHECK(popped == ctx);
  CHECK_EQ(api.mem_alloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(api.host_alloc(&h, 4096, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(api.mem_alloc_host(&h, 4096), CUDA_ERROR_INVALID_CONTEXT);
  size_t fr = 0, tot = 0;
  CHECK_EQ(api.get_info(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  OK(api.ctx_push(ctx));
  // Freeing a valid pointer needs no current context (measured).
  CUdeviceptr keep = 0;
  void* keep_host = nullptr;
  OK(api.mem_alloc(&keep, 6000));
  OK(api.host_alloc(&keep_host, 6000, 0));
  OK(api.ctx_pop(&popped));
  OK(api.mem_free(keep));
  OK(api.free_host(keep_host));
  OK(api.ctx_push(ctx));
  OK(api.ctx_sync());
  OK(api.mem_alloc(&keep, 6000));  // and the block is usable again
  fill(keep, 6000, 1);
  OK(api.mem_free(keep));

  // Any other driver error comes back unchanged.
  api.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_UNKNOWN);
  CHECK_EQ(api.mem_alloc(&p, 12345), CUDA_ERROR_UNKNOWN);
  api.fail_next("cuMemHostAlloc", 1, CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(api.host_alloc(&h, 12345, 0), CUDA_ERROR_INVALID_DEVICE);
}

// What pointer queries report for pooled blocks: the requested size, a new
// buffer id per allocation, and "unallocated" for free blocks and padding.
void scenario_ptrattr() {
  CUcontext ctx = setup();
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, 1000));
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(api.address_range(&base, &size, p + 10));
  CHECK_EQ(base, p);
  CHECK_EQ(size, 1000u);
  OK(api.address_range(nullptr, &size, p));
  CHECK_EQ(size, 1000u);
  CHECK_EQ(api.address_range(&base, &size, p + 1000), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.address_range(&base, &size, p + 1001), CUDA_ERROR_NOT_FOUND);

  size_t range = 0;
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 5));
  CHECK_EQ(range, 1000u);
  CUdeviceptr start = 0;
  OK(api.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5));
  CHECK_EQ(start, p);
  unsigned long long id1 = 0;
  OK(api.ptr_attr(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  CUcontext owner = nullptr;
  OK(api.ptr_attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p));
  CHECK(owner == ctx);
  CHECK_EQ(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 1000),
           CUDA_ERROR_INVALID_VALUE);

  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_CONTEXT,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  size_t a_size = 0;
  unsigned long long a_id = 0;
  CUcontext a_ctx = nullptr;
  int a_ord = 7;
  void* data[4] = {&a_size, &a_id, &a_ctx, &a_ord};
  OK(api.ptr_attrs(4, attrs, data, p));
  CHECK_EQ(a_size, 1000u);
  CHECK_EQ(a_id, id1);
  CHECK(a_ctx == ctx);
  CHECK_EQ(a_ord, 0);

  OK(api.mem_free(p));
  // Freed (held by the pool): unallocated as far as the program can tell.
  CHECK_EQ(api.address_range(&base, &size, p), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p), CUDA_ERROR_INVALID_VALUE);
  OK(api.ptr_attrs(4, attrs, data, p));
  CHECK_EQ(a_size, 0u);
  CHECK_EQ(a_id, 0u);
  CHECK(a_ctx == nullptr);
  CHECK_EQ(a_ord, -2);

  OK(api.ctx_sync());
  CUdeviceptr q = 0;
  OK(api.mem_alloc(&q, 1010));  // same bin
  if (g_pooled) CHECK_EQ(q, p);
  unsigned long long id2 = 0;
  OK(api.ptr_attr(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK(id2 != id1);
  OK(api.address_range(&base, &size, q));
  CHECK_EQ(size, 1010u);
  OK(api.mem_free(q));

  // Pinned.
  void* h = nullptr;
  OK(api.host_alloc(&h, 1000, CU_MEMHOSTALLOC_PORTABLE));
  unsigned flags = 0;
  OK(api.host_get_flags(&flags, h));
  CHECK_EQ(flags, 3u);
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, reinterpret_cast<CUdeviceptr>(h)));
  CHECK_EQ(range, 1000u);
  CHECK_EQ(api.host_get_flags(&flags, static_cast<char*>(h) + 1000), CUDA_ERROR_INVALID_VALUE);
  OK(api.free_host(h));
  CHECK_EQ(api.host_get_flags(&flags, h), CUDA_ERROR_INVALID_VALUE);

  // A block exported over IPC is never reused: its free reaches the driver.
  OK(api.ctx_sync());
  CUdeviceptr r = 0;
  OK(api.mem_alloc(&r, 2000));
  CUipcMemHandle ipc;
  OK(api.ipc_get(&ipc, r));
  StandinCounters c0 = snap();
  OK(api.mem_free(r));
  CHECK_EQ(snap().mem_free - c0.mem_free, 1u);
  OK(api.mem_alloc(&r, 2000));
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, 1u);
  OK(api.mem_free(r));
  CHECK_EQ(api.ipc_get(&ipc, r), CUDA_ERROR_INVALID_VALUE);  // freed

  // cuMemGetInfo: held memory counts as free.
  OK(api.ctx_sync());
  size_t free0 = 0, total = 0, free1 = 0;
  OK(api.get_info(&free0, &total));
  OK(api.mem_alloc(&r, 8 << 20));
  OK(api.mem_free(r));
  OK(api.get_info(&free1, &total));
  // Equal up to the driver's own rounding of what it charges.
  CHECK(free1 <= free0 && free0 - free1 < 4096);
  CHECK(free1 <= total);
}

// Out of memory: held blocks are released (this device first) and the call
// retried; a rounded size that does not fit falls back to the exact size.
// Run with STANDIN_CAPACITY=63.5 MiB.
void scenario_oom() {
  const size_t MiB = 1 << 20;
  CUcontext ctx0 = setup();
  // Device 1 holds blocks too; they must survive device 0's shortage.
  CUcontext ctx1 = create_ctx(1);
  CUdeviceptr d1[3];
  for (auto& p : d1) OK(api.mem_alloc(&p, 5 * MiB));
  for (auto& p : d1) OK(api.mem_free(p));
  const size_t used1 = api.used(1);
  OK(api.ctx_set_current(ctx0));
  (void)ctx1;

  CUdeviceptr keep = 0;
  OK(api.mem_alloc(&keep, 2 * MiB));
  CUdeviceptr b[6];
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  StandinCounters c0 = snap();
  CUdeviceptr big = 0;
  OK(api.mem_alloc(&big, 20 * MiB));
  StandinCounters c1 = snap();
  if (g_pooled) {
    CHECK(c1.mem_free - c0.mem_free >= 1);
    CHECK(c1.mem_alloc_calls - c0.mem_alloc_calls >= 2);  // failed, then retried
  }
  CHECK_EQ(api.used(1), used1);  // device 1's held blocks untouched
  OK(api.mem_free(big));

  // Exact size: 61 MiB rounds up to 62 MiB - 1; with 2 MiB (2.125 rounded)
  // in use only the exact size fits in 63.5 MiB.
  OK(api.ctx_sync());
  free_held();
  StandinCounters c2 = snap();
  CUdeviceptr exact = 0;
  const CUresult r = api.mem_alloc(&exact, 61 * MiB);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "61 MiB: %d (used %zu)\n", int(r), api.used(0));
    exit(1);
  }
  StandinCounters c3 = snap();
  CHECK_EQ(c3.last_alloc_size, 61 * MiB);
  if (g_pooled) CHECK_EQ(c3.mem_alloc_calls - c2.mem_alloc_calls, 2u);
  OK(api.mem_free(exact));
  CHECK_EQ(snap().mem_free - c3.mem_free, 1u);  // not kept: it fits no bin

  exact = 0xdead;
  CHECK_EQ(api.mem_alloc(&exact, 100 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(exact, 0u);

  // Allocations gpupool does not serve (stream-ordered, managed) get what
  // it holds: with 54 MiB held of 63.5, 40 MiB fit only once it lets go.
  OK(api.ctx_sync());
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  OK(api.ctx_sync());
  CUdeviceptr other = 0;
  OK(api.mem_alloc_async(&other, 40 * MiB, nullptr));
  OK(api.mem_free_async(other, nullptr));
  // Executed: the driver's pool gives it back (threshold 0) or, under
  // gpupool, keeps it, which the next allocations must get back.
  OK(api.ctx_sync());
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  OK(api.ctx_sync());
  OK(api.mem_alloc_managed(&other, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  OK(api.mem_free(other));
  OK(api.mem_free(keep));
}

// Fences: a freed block is not handed out again while work queued before
// its free may still write it (safe), or is (immediate).
void scenario_fence() {
  setup();
  // A stream of the program's own: fences decide every reuse (no solo rule,
  // scenario_solo).
  CUstream stream = nullptr;
  OK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
  const size_t n = 4096;
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, n));
  fill(p, n, 0x11);
  OK(api.memset_async(p, 0xEE, n, nullptr));  // queued, runs at a synchronization
  OK(api.mem_free(p));
  StandinCounters c0 = snap();
  CUdeviceptr q = 0;
  OK(api.mem_alloc(&q, n));
  StandinCounters c1 = snap();
  const int pending = api.pending_ops(q, n);
  fill(q, n, 0x22);  // the program's new data
  OK(api.ctx_sync());
  const bool corrupted = !all_equal(q, n, 0x22);
  fprintf(stderr, "fence: reused=%d pool-syncs=%llu pending-at-reuse=%d corrupted=%d\n", q == p,
          (unsigned long long)(c1.ctx_sync - c0.ctx_sync), pending, corrupted);
  if (g_pooled && g_immediate) {
    // Immediate reuse, no waiting: the detector sees the hazard.
    CHECK_EQ(q, p);
    CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
    CHECK_EQ(pending, 1);
    CHECK(corrupted);
  } else {
    CHECK_EQ(pending, 0);
    CHECK(!corrupted);
    if (g_growth) {
      CHECK(q != p);  // a fresh block rather than a wait for the busy one
      CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
      CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 1u);
    } else if (g_pooled) {
      CHECK_EQ(q, p);
      CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 1u);  // one wait covered it
      CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 0u);
    }
  }
  OK(api.mem_free(q));

  // The program's own synchronization completes the fence: no extra wait.
  CUdeviceptr r = 0;
  OK(api.mem_alloc(&r, 8192));
  OK(api.memset_async(r, 0xEE, 8192, nullptr));
  OK(api.mem_free(r));
  OK(api.ctx_sync());
  StandinCounters c2 = snap();
  CUdeviceptr s = 0;
  OK(api.mem_alloc(&s, 8192));
  StandinCounters c3 = snap();
  CHECK_EQ(c3.ctx_sync - c2.ctx_sync, 0u);
  if (g_pooled) CHECK_EQ(s, r);
  CHECK_EQ(api.pending_ops(s, 8192), 0);
  OK(api.mem_free(s));

  // Pinned blocks are fenced the same way.
  void* h = nullptr;
  OK(api.host_alloc(&h, n, 0));
  OK(api.memset_async(reinterpret_cast<CUdeviceptr>(h), 0xEE, n, nullptr));
  OK(api.free_host(h));
  void* h2 = nullptr;
  OK(api.host_alloc(&h2, n, 0));
  const int hp = api.pending_ops(reinterpret_cast<CUdeviceptr>(h2), n);
  CHECK_EQ(hp, g_pooled && g_immediate ? 1 : 0);
  OK(api.free_host(h2));
}

// The solo rule (safe reuse in stream order): one thread, one context, no
// stream of the program's own. A freed block whose old work is still queued
// on the legacy stream is handed out again at once, as PyCUDA's
// DeviceMemoryPool does (the program's next work on it is queued behind);
// pinned blocks never. CLIENT_SOLO_END names the first sign of another order,
// which ends the rule after the old work of every block it lent is done.
void scenario_solo() {
  const char* env_end = getenv("CLIENT_SOLO_END");
  CHECK(env_end != nullptr);
  const std::string end = env_end;
  CUcontext ctx = setup();
  const size_t n = 4096;
  // procaddr asks for per-thread entry points, as cudart built for them
  // does: no rule there.
  const char* reuse = getenv("GPUPOOL_REUSE");
  const bool fenced = reuse && strcmp(reuse, "fenced") == 0;
  const bool solo = g_pooled && !g_immediate && !fenced && g_mode != "procaddr";

  CUdeviceptr p = 0, q = 0;
  OK(api.mem_alloc(&p, n));
  OK(api.memset_async(p, 0xEE, n, nullptr));  // queued until a synchronization
  OK(api.mem_free(p));
  StandinCounters c0 = snap();
  OK(api.mem_alloc(&q, n));
  StandinCounters c1 = snap();
  const int pending = api.pending_ops(q, n);
  fprintf(stderr, "solo: reused=%d syncs=%llu pending=%d\n", q == p,
          (unsigned long long)(c1.ctx_sync - c0.ctx_sync), pending);
  if (solo || (g_pooled && g_immediate)) {
    CHECK_EQ(q, p);
    CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
    CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 0u);
    CHECK_EQ(pending, 1);
  } else {
    CHECK_EQ(pending, 0);
  }
  // The program's next work on it is queued behind the old: no harm.
  OK(api.memset_async(q, 0x22, n, nullptr));
  OK(api.ctx_sync());
  CHECK(all_equal(q, n, 0x22));

  // Pinned blocks wait for their fence all the same: the host writes them
  // at once.
  void* h = nullptr;
  void* h2 = nullptr;
  OK(api.host_alloc(&h, n, 0));
  OK(api.memset_async(reinterpret_cast<CUdeviceptr>(h), 0xEE, n, nullptr));
  OK(api.free_host(h));
  OK(api.host_alloc(&h2, n, 0));
  CHECK_EQ(api.pending_ops(reinterpret_cast<CUdeviceptr>(h2), n), g_pooled && g_immediate ? 1 : 0);
  OK(api.free_host(h2));
  OK(api.ctx_sync());

  // Lent again, its old work queued, and then the end.
  CUdeviceptr r = 0;
  OK(api.memset_async(q, 0xEE, n, nullptr));
  OK(api.mem_free(q));
  OK(api.mem_alloc(&r, n));
  if (solo) CHECK_EQ(api.pending_ops(r, n), 1);
  StandinCounters c2 = snap();
  CUstream ended_by = nullptr;
  if (end == "stream") {
    OK(api.stream_create(&ended_by, CU_STREAM_NON_BLOCKING));
  } else if (end == "peer") {
    CUcontext b = create_ctx(0);  // current now; never allocates
    OK(api.ctx_set_current(ctx));
    OK(api.enable_peer(b, 0));
  } else if (end == "context") {
    create_ctx(0);  // current now
    CUdeviceptr x = 0;
    OK(api.mem_alloc(&x, 2 * n));
    OK(api.mem_free(x));
    OK(api.ctx_set_current(ctx));
  } else if (end == "thread_alloc") {
    std::thread([&] {
      OK(api.ctx_set_current(ctx));
      CUdeviceptr x = 0;
      OK(api.mem_alloc(&x, 2 * n));
      OK(api.mem_free(x));
    }).join();
  } else if (end == "thread_free") {
    CUdeviceptr x = 0;
    OK(api.mem_alloc(&x, 2 * n));
    std::thread([&] { OK(api.mem_free(x)); }).join();
  } else if (end == "symbol") {
    // A per-thread default stream entry point: by name through dlsym in the
    // dlsym modes, else by cuGetProcAddress's flag.
    void* fn = nullptr;
#ifndef CLIENT_LINKED
    if (g_mode != "procaddr") fn = dlsym(g_handle, "cuMemsetD8Async_ptsz");
#endif
    if (!fn)
      OK(api.get_proc("cuMemsetD8Async", &fn, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                      nullptr));
    CHECK(fn != nullptr);
  } else {
    fprintf(stderr, "unknown CLIENT_SOLO_END %s\n", end.c_str());
    exit(2);
  }
  StandinCounters c3 = snap();
  fprintf(stderr, "solo ended by %s: syncs=%llu pending=%d\n", end.c_str(),
          (unsigned long long)(c3.ctx_sync - c2.ctx_sync), api.pending_ops(r, n));
  if (solo) {
    // One synchronization of each context, before the call returned.
    CHECK_EQ(c3.ctx_sync - c2.ctx_sync, end == "context" ? 2u : 1u);
    CHECK_EQ(api.pending_ops(r, n), 0);
  }
  // A non-blocking stream's work runs at once: had the old work still been
  // queued, it would land on top of the program's new data.
  CUstream s2 = nullptr;
  OK(api.stream_create(&s2, CU_STREAM_NON_BLOCKING));
  OK(api.memset_async(r, 0x33, n, s2));
  OK(api.ctx_sync());
  const bool corrupted = !all_equal(r, n, 0x33);
  CHECK_EQ(corrupted, g_pooled && g_immediate);
  OK(api.mem_free(r));

  // From now on freed blocks wait for the device.
  CUdeviceptr y = 0, z = 0;
  OK(api.mem_alloc(&y, n));
  OK(api.memset_async(y, 0xEE, n, nullptr));
  OK(api.mem_free(y));
  OK(api.mem_alloc(&z, n));
  CHECK_EQ(api.pending_ops(z, n), g_pooled && g_immediate ? 1 : 0);
  OK(api.mem_free(z));
  OK(api.ctx_sync());
}

// Context teardown: the pool drops the context's blocks without freeing
// them, and never touches them again.
void scenario_context() {
  const size_t sizes[] = {1000, 70000, 1 << 20};
  OK(api.init(0));
  CUcontext a = create_ctx(0);
  for (size_t n : sizes) {
    CUdeviceptr p;
    OK(api.mem_alloc(&p, n));
    OK(api.mem_free(p));
    void* h;
    OK(api.host_alloc(&h, n, 0));
    OK(api.free_host(h));
  }
  CUdeviceptr still_active = 0;
  OK(api.mem_alloc(&still_active, 3000));
  void* host_active = nullptr;
  OK(api.host_alloc(&host_active, 3000, 0));
  OK(api.ctx_destroy(a));
  // The program's own frees of blocks of the destroyed context get the
  // driver's answer, pooled or not.
  StandinCounters c0 = snap();
  CHECK_EQ(api.mem_free(still_active), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(host_active), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 2u);
  c0 = snap();

  // The stand-in hands the same context address out again.
  CUcontext b = create_ctx(0);
  CHECK(b == a);
  for (size_t n : sizes) {
    CUdeviceptr p;
    OK(api.mem_alloc(&p, n));
    OK(api.mem_free(p));
  }
  // GPUPOOL_SEGMENTS=expandable: the 1 MiB block is a piece of the
  // context's range, mapped (one granule), not allocated.
  const unsigned blocks = g_expandable ? 2u : 3u;
  StandinCounters c1 = snap();
  CHECK_EQ(c1.mem_alloc - c0.mem_alloc, blocks);  // fresh memory, not the dead context's
  CHECK_EQ(c1.vmm_created - c0.vmm_created, g_expandable ? 1u : 0u);
  free_held();
  // Only this context's three blocks went back to the driver, none of the
  // destroyed context's.
  CHECK_EQ(snap().mem_free - c0.mem_free, blocks);
  CHECK_EQ(snap().vmm_freed - c0.vmm_freed, g_expandable ? 1u : 0u);
  CHECK_EQ(snap().dead_ptr_calls, c0.dead_ptr_calls);
  OK(api.ctx_destroy(b));

  // Primary context: reset, then the last release.
  CUdevice dev;
  OK(api.device_get(&dev, 0));
  for (int round = 0; round < 2; ++round) {
    CUcontext pc = nullptr;
    OK(api.primary_retain(&pc, dev));
    OK(api.ctx_set_current(pc));
    for (size_t n : sizes) {
      CUdeviceptr p;
      OK(api.mem_alloc(&p, n));
      OK(api.mem_free(p));
    }
    CUdeviceptr act = 0;
    OK(api.mem_alloc(&act, 5000));
    // A release that is not the last keeps the context and its blocks.
    CUcontext again = nullptr;
    OK(api.primary_retain(&again, dev));
    OK(api.primary_release(dev));
    OK(api.ctx_sync());
    StandinCounters k0 = snap();
    CUdeviceptr hit = 0;
    OK(api.mem_alloc(&hit, sizes[0]));
    CHECK_EQ(snap().mem_alloc - k0.mem_alloc, g_pooled ? 0u : 1u);
    OK(api.mem_free(hit));

    // Round 1's last release: round 0's first retain outlived its reset
    // (a reset keeps the count, measured).
    if (round == 0) {
      OK(api.primary_reset(dev));
    } else {
      OK(api.primary_release(dev));
      OK(api.primary_release(dev));
    }
    StandinCounters d0 = snap();
    // The destroyed primary context is still current: 709, as measured.
    CHECK_EQ(api.mem_free(act), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CHECK_EQ(snap().dead_ptr_calls - d0.dead_ptr_calls, 1u);
    d0 = snap();
    OK(api.primary_retain(&pc, dev));
    OK(api.ctx_set_current(pc));
    for (size_t n : sizes) {
      CUdeviceptr p;
      OK(api.mem_alloc(&p, n));
      OK(api.mem_free(p));
    }
    CHECK_EQ(snap().mem_alloc - d0.mem_alloc, g_expandable ? 2u : 3u);
    CHECK_EQ(snap().vmm_created - d0.vmm_created, g_expandable ? 1u : 0u);
    free_held();
    CHECK_EQ(snap().mem_free - d0.mem_free, g_expandable ? 2u : 3u);
    CHECK_EQ(snap().vmm_freed - d0.vmm_freed, g_expandable ? 1u : 0u);
    CHECK_EQ(snap().dead_ptr_calls, d0.dead_ptr_calls);
    OK(api.primary_release(dev));
  }
}

// Contexts that die by paths gpupool may not see. `own(name)` is the
// stand-in's own entry point, which no hook stands in front of: a context
// dropped through it dies the way one dropped inside another library or
// the driver would. Whatever path, no pointer handed out is of memory that
// died with its context, the program's frees of such pointers get the
// driver's answer, and gpupool asks the driver nothing about dead memory.
template <class F>
F own(const char* name) {
  void* f = api.own(name);
  CHECK(f != nullptr);
  return reinterpret_cast<F>(f);
}

// p is live memory of `ctx`, n bytes long, as the driver sees it; then
// written and read back (only once the driver vouched for it).
void check_live(CUdeviceptr p, size_t n, CUcontext ctx, unsigned char v) {
  const uint64_t dead0 = snap().dead_ptr_calls;
  CUcontext owner = nullptr;
  CHECK_EQ(api.ptr_attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_SUCCESS);
  CHECK(owner == ctx);
  size_t range = 0;
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
  CHECK_EQ(range, n);
  CHECK_EQ(snap().dead_ptr_calls, dead0);
  fill(p, n, v);
  CHECK(all_equal(p, n, v));
}

// Fresh memory for sizes {1000, 70000, 1 MiB} since c0: three driver
// allocations; with GPUPOOL_SEGMENTS=expandable two, and one granule mapped
// in the context's range for the 1 MiB block.
void check_fresh_three(const StandinCounters& c0) {
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, g_expandable ? 2u : 3u);
  CHECK_EQ(snap().vmm_created - c0.vmm_created, g_expandable ? 1u : 0u);
}

// PyCUDA's test harness: a context per test, made current, used, popped,
// pushed again and dropped with cuCtxDetach (through the hooked export, or
// unseen), some of its pointers still held by the program.
void lifetime_detach_loop(bool unseen) {
  const size_t sizes[] = {1000, 70000, 1 << 20, 3 << 20};
  using Detach = CUresult (*)(CUcontext);
  Detach detach = unseen ? own<Detach>("cuCtxDetach") : api.ctx_detach;
  std::vector<CUdeviceptr> orphans;  // of dead contexts, still the program's
  for (int round = 0; round < 20; ++round) {
    CUcontext ctx = create_ctx(0);
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t k = 0; k < 4; ++k) {
        CUdeviceptr p = 0;
        OK(api.mem_alloc(&p, sizes[k]));
        check_live(p, sizes[k], ctx, static_cast<unsigned char>(round * 8 + k));
        if (pass == 1 && k % 2 == 1) orphans.push_back(p);
        else OK(api.mem_free(p));
      }
      OK(api.ctx_sync());  // the freed blocks are reusable in the second pass
    }
    // The orphans of earlier contexts: their frees get the driver's answer
    // (INVALID_VALUE: the current context is alive), never reach this
    // context's pool.
    const uint64_t dead0 = snap().dead_ptr_calls;
    for (size_t i = 0; i + 2 < orphans.size(); ++i)
      CHECK_EQ(api.mem_free(orphans[i]), CUDA_ERROR_INVALID_VALUE);
    const size_t freed = orphans.size() >= 2 ? orphans.size() - 2 : 0;
    if (g_expandable) {
      // The 3 MiB orphans are pieces of their context's range, virtual
      // memory that outlives the context until the pool lets the arena go
      // (its next reclaim): dead memory only from then on.
      const uint64_t dead = snap().dead_ptr_calls - dead0;
      CHECK(dead >= freed / 2 && dead <= freed);
    } else {
      CHECK_EQ(snap().dead_ptr_calls - dead0, freed);
    }
    orphans.erase(orphans.begin(), orphans.begin() + static_cast<std::ptrdiff_t>(freed));
    CUcontext popped = nullptr;
    OK(api.ctx_pop(&popped));
    CHECK(popped == ctx);
    OK(api.ctx_push(ctx));
    OK(detach(ctx));
    CUcontext cur = reinterpret_cast<CUcontext>(1);
    OK(api.ctx_get_current(&cur));
    CHECK(cur == nullptr);
  }
  // Whatever gpupool still holds goes back without a call on dead memory.
  const uint64_t dead0 = snap().dead_ptr_calls;
  CUcontext last = create_ctx(0);
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, sizes[0]));
  check_live(p, sizes[0], last, 1);
  OK(api.mem_free(p));
  free_held();
  CHECK_EQ(snap().dead_ptr_calls, dead0);
  for (CUdeviceptr o : orphans) CHECK_EQ(api.mem_free(o), CUDA_ERROR_INVALID_VALUE);
  OK(api.ctx_destroy(last));
}

// cuCtxAttach adds a user: the first detach keeps the context and its
// pooled blocks, the second destroys it.
void lifetime_attach() {
  CUcontext ctx = create_ctx(0);
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, 5000));
  OK(api.mem_free(p));
  CUcontext same = nullptr;
  OK(api.ctx_attach(&same, 0));
  CHECK(same == ctx);
  OK(api.ctx_detach(ctx));
  OK(api.ctx_sync());
  StandinCounters c0 = snap();
  OK(api.mem_alloc(&p, 5000));
  check_live(p, 5000, ctx, 3);
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, g_pooled ? 0u : 1u);  // still pooled
  OK(api.mem_free(p));
  OK(api.ctx_detach(ctx));
  CHECK_EQ(api.ctx_detach(ctx), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  CUcontext next = create_ctx(0);
  CHECK(next == ctx);  // the handle again (lowest slot)
  c0 = snap();
  OK(api.mem_alloc(&p, 5000));
  check_live(p, 5000, next, 4);
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, 1u);  // fresh memory
  OK(api.mem_free(p));
  OK(api.ctx_destroy(next));
}

// The primary context reset and released to zero by paths gpupool does not
// see: it comes back with the same handle and a new id.
void lifetime_primary_unseen() {
  CUdevice dev;
  OK(api.device_get(&dev, 0));
  using DevFn = CUresult (*)(CUdevice);
  const size_t sizes[] = {1000, 70000, 1 << 20};
  for (int round = 0; round < 2; ++round) {
    CUcontext pc = nullptr;
    OK(api.primary_retain(&pc, dev));
    OK(api.ctx_set_current(pc));
    CUdeviceptr held = 0;
    for (size_t n : sizes) {
      CUdeviceptr p = 0;
      OK(api.mem_alloc(&p, n));
      check_live(p, n, pc, 5);
      OK(api.mem_free(p));
    }
    OK(api.mem_alloc(&held, 2000));
    OK(api.ctx_sync());
    if (round == 0) {
      OK(own<DevFn>("cuDevicePrimaryCtxReset_v2")(dev));
    } else {
      // Released to zero: this round's retain and round 0's two (a reset
      // keeps the count).
      for (int k = 0; k < 3; ++k) OK(own<DevFn>("cuDevicePrimaryCtxRelease_v2")(dev));
    }
    CUcontext again = nullptr;
    OK(api.primary_retain(&again, dev));
    CHECK(again == pc);
    OK(api.ctx_set_current(again));
    StandinCounters c0 = snap();
    for (size_t n : sizes) {
      CUdeviceptr p = 0;
      OK(api.mem_alloc(&p, n));
      check_live(p, n, again, 6);
      OK(api.mem_free(p));
    }
    check_fresh_three(c0);  // fresh memory, none of the dead context's
    CHECK_EQ(api.mem_free(held), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 1u);
    free_held();
    CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 1u);
  }
  OK(api.primary_release(dev));
}

// A context destroyed on another thread while this one has it current (and
// its blocks cached), the handle then given to a new context made there.
void lifetime_other_thread(bool unseen) {
  using CtxFn = CUresult (*)(CUcontext);
  CtxFn destroy = unseen ? own<CtxFn>("cuCtxDestroy_v2") : api.ctx_destroy;
  CUcontext a = create_ctx(0);
  const size_t sizes[] = {1000, 70000, 1 << 20};
  for (size_t n : sizes) {
    CUdeviceptr p = 0;
    OK(api.mem_alloc(&p, n));
    check_live(p, n, a, 7);
    OK(api.mem_free(p));
  }
  OK(api.ctx_sync());
  CUdeviceptr kept = 0;
  OK(api.mem_alloc(&kept, 2000));
  CUcontext b = nullptr;
  std::thread([&] {
    OK(api.ctx_set_current(a));
    OK(destroy(a));
    CUdeviceptr p = 0;
    CHECK_EQ(api.mem_alloc(&p, 1000), CUDA_ERROR_INVALID_CONTEXT);  // none current there now
    b = create_ctx(0);
    CHECK(b == a);  // the handle again
    OK(api.ctx_pop(nullptr));
  }).join();
  // This thread's current context is that handle, now the new context.
  CUcontext cur = nullptr;
  OK(api.ctx_get_current(&cur));
  CHECK(cur == b);
  StandinCounters c0 = snap();
  for (size_t n : sizes) {
    CUdeviceptr p = 0;
    OK(api.mem_alloc(&p, n));
    check_live(p, n, b, 8);
    OK(api.mem_free(p));
  }
  check_fresh_three(c0);
  CHECK_EQ(api.mem_free(kept), CUDA_ERROR_INVALID_VALUE);
  free_held();
  CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 1u);
  OK(api.ctx_destroy(b));
}

// gpupool's live CUDA arenas of device 0, from its stats (-1 without
// gpupool).
int live_cuda_arenas() {
  using Fn = size_t (*)(char*, size_t);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpupool_stats_json"));
  if (!fn) return -1;
  std::string buf(1 << 20, '\0');
  buf.resize(fn(buf.data(), buf.size()));
  const std::string key = "\"kind\":\"cuda\",\"group\":\"cuda:0\",\"retired\":false";
  int n = 0;
  for (size_t at = buf.find(key); at != std::string::npos; at = buf.find(key, at + 1)) ++n;
  return n;
}

// A context ends unseen while the program goes on in another one only: its
// record goes all the same (gpupool's thread checks once a second), so a
// free of one of its pointers then gets the driver's answer.
void lifetime_unseen_elsewhere() {
  CUcontext x = create_ctx(0);
  CUdeviceptr orphan = 0;
  OK(api.mem_alloc(&orphan, 9000));
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, 70000));
  OK(api.mem_free(p));
  OK(api.ctx_pop(nullptr));
  CUcontext y = create_ctx(0);
  CHECK(y != x);
  OK(api.mem_alloc(&p, 70000));
  check_live(p, 70000, y, 9);
  OK(api.mem_free(p));
  const int before = live_cuda_arenas();
  OK(api.ctx_push(x));
  using CtxFn = CUresult (*)(CUcontext);
  OK(own<CtxFn>("cuCtxDestroy_v2")(x));
  CUcontext cur = nullptr;
  OK(api.ctx_get_current(&cur));
  CHECK(cur == y);
  if (g_pooled) {
    CHECK(before >= 2);
    // Allocations in y alone, which never name x's handle.
    int now = before;
    for (int i = 0; i < 1000 && now != before - 1; ++i) {
      OK(api.mem_alloc(&p, 70000));
      OK(api.mem_free(p));
      usleep(10000);
      now = live_cuda_arenas();
    }
    CHECK_EQ(now, before - 1);
  }
  const StandinCounters c0 = snap();
  CHECK_EQ(api.mem_free(orphan), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 1u);
  free_held();
  CHECK_EQ(snap().dead_ptr_calls - c0.dead_ptr_calls, 1u);
  OK(api.ctx_destroy(y));
}

// CLIENT_SEEN_ONLY=1: only the ends gpupool sees, for a driver without
// context ids (STANDIN_CTX_ID=0), where those are all it can tell.
void scenario_lifetime() {
  OK(api.init(0));
  const char* seen = getenv("CLIENT_SEEN_ONLY");
  const bool unseen = !(seen && atoi(seen) != 0);
  lifetime_detach_loop(false);
  lifetime_attach();
  lifetime_other_thread(false);
  if (!unseen) return;
  lifetime_detach_loop(true);
  lifetime_primary_unseen();
  lifetime_other_thread(true);
  lifetime_unseen_elsewhere();
}

// fork() while another thread is inside the pool: the child allocates and
// frees without deadlock. (A hang fails the test by its timeout.)
void scenario_fork() {
  CUcontext ctx = setup();
  CUdeviceptr warm;  // gpupool starts (and registers its fork handlers) here
  OK(api.mem_alloc(&warm, 4096));
  OK(api.mem_free(warm));
  // Large blocks the parent keeps across the forks (with GPUPOOL_SPLIT,
  // two pieces of one segment): their bytes stay the parent's.
  CUdeviceptr seg = 0, keep[2] = {};
  OK(api.mem_alloc(&seg, 8 << 20));
  OK(api.mem_free(seg));
  OK(api.ctx_sync());
  for (int i = 0; i < 2; ++i) {
    OK(api.mem_alloc(&keep[i], (3 << 20) + 100));
    fill(keep[i], (3 << 20) + 100, static_cast<unsigned char>(0x70 + i));
  }
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    OK(api.ctx_set_current(ctx));
    while (!stop.load()) {
      CUdeviceptr p;
      OK(api.mem_alloc(&p, 4096));
      OK(api.mem_free(p));
      void* h;
      OK(api.host_alloc(&h, 4096, 0));
      OK(api.free_host(h));
    }
  });
  for (int i = 0; i < 30; ++i) {
    const pid_t pid = fork();
    // (Once -1 under ThreadSanitizer in a loaded CI-like run: say why.)
    if (pid < 0) fprintf(stderr, "fork %d: %s\n", i, strerror(errno));
    CHECK(pid >= 0);
    if (pid == 0) {
      for (int k = 0; k < 50; ++k) {
        CUdeviceptr p;
        if (api.mem_alloc(&p, 4096 + k) != CUDA_SUCCESS) _exit(2);
        if (api.mem_free(p) != CUDA_SUCCESS) _exit(3);
        if (k % 10 == 0) {  // a large one too (a piece, when splitting)
          if (api.mem_alloc(&p, (2 << 20) + 512 * k) != CUDA_SUCCESS) _exit(6);
          if (api.mem_free(p) != CUDA_SUCCESS) _exit(7);
        }
        void* h;
        if (api.host_alloc(&h, 4096, 0) != CUDA_SUCCESS) _exit(4);
        if (api.free_host(h) != CUDA_SUCCESS) _exit(5);
      }
      free_held();
      _exit(0);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
  }
  stop = true;
  worker.join();
  for (int i = 0; i < 2; ++i) {
    CHECK(all_equal(keep[i], (3 << 20) + 100, static_cast<unsigned char>(0x70 + i)));
    OK(api.mem_free(keep[i]));
  }
}

// Exit: blocks alive and held at exit, atexit handlers and a static
// destructor that free memory, a thread still allocating while the process
// exits. No crash, no hang; frees keep succeeding.
CUdeviceptr g_exit_early = 0, g_exit_late = 0, g_exit_static = 0;
void* g_exit_host = nullptr;

struct StaticFreer {
  ~StaticFreer() {
    if (g_exit_static && api.mem_free(g_exit_static) != CUDA_SUCCESS) _exit(7);
  }
};

void scenario_exit() {
  static StaticFreer freer;
  // Registered before gpupool starts: runs after its exit handler.
  atexit([] {
    if (api.mem_free(g_exit_early) != CUDA_SUCCESS) _exit(5);
    if (api.free_host(g_exit_host) != CUDA_SUCCESS) _exit(6);
  });
  CUcontext ctx = setup();
  OK(api.mem_alloc(&g_exit_early, 10000));
  OK(api.host_alloc(&g_exit_host, 10000, 0));
  OK(api.mem_alloc(&g_exit_static, 20000));
  OK(api.mem_alloc(&g_exit_late, 30000));
  for (int i = 0; i < 10; ++i) {  // held blocks at exit
    CUdeviceptr p;
    OK(api.mem_alloc(&p, 1000 * (i + 1)));
    OK(api.mem_free(p));
  }
  CUdeviceptr alive;
  OK(api.mem_alloc(&alive, 40000));  // never freed
  // Registered after: runs before gpupool's exit handler.
  atexit([] {
    if (api.mem_free(g_exit_late) != CUDA_SUCCESS) _exit(4);
  });
  std::thread([ctx] {
    api.ctx_set_current(ctx);
    for (;;) {
      CUdeviceptr p;
      if (api.mem_alloc(&p, 777) == CUDA_SUCCESS) api.mem_free(p);
    }
  }).detach();
  usleep(1000);
}

// dlsym and cuGetProcAddress: only our hooks replace driver entry points,
// everything else comes back untouched.
void scenario_lookup() {
  const bool preloaded = dlsym(RTLD_DEFAULT, "gpupool_version") != nullptr;
#ifndef CLIENT_LINKED
  CHECK(dlsym(g_handle, "cuGetExportTable") == api.own("cuGetExportTable"));
  void* alloc = dlsym(g_handle, "cuMemAlloc_v2");
  CHECK(dlerror() == nullptr);  // a successful lookup leaves no error behind
  CHECK((alloc != api.own("cuMemAlloc_v2")) == preloaded);
  CHECK(dlsym(g_handle, "cuNoSuchFunction") == nullptr);
  CHECK(dlerror() != nullptr);
  CHECK(dlsym(g_handle, "standin_counters") == reinterpret_cast<void*>(api.counters));

  auto gpa = reinterpret_cast<GetProcV2>(dlsym(g_handle, "cuGetProcAddress_v2"));
  CHECK((reinterpret_cast<void*>(gpa) != api.own("cuGetProcAddress_v2")) == preloaded);
  void* f = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  OK(gpa("cuMemAlloc", &f, 3020, 0, &status));
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK((f != api.own("cuMemAlloc_v2")) == preloaded);
  OK(gpa("cuGetProcAddress", &f, 11030, 0, nullptr));
  CHECK((f != api.own("cuGetProcAddress")) == preloaded);
  auto gpa1 = reinterpret_cast<GetProcV1>(f);
  void* f1 = nullptr;
  OK(gpa1("cuMemFreeHost", &f1, 2000, 0));
  CHECK((f1 != api.own("cuMemFreeHost")) == preloaded);
  OK(gpa("cuDevicePrimaryCtxRelease", &f, 7000, 0, nullptr));
  CHECK((f != api.own("cuDevicePrimaryCtxRelease")) == preloaded);
  // Entry points we do not hook, and per-thread variants, stay the driver's.
  OK(gpa("cuMemsetD8Async", &f, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  CHECK(f == api.own("cuMemsetD8Async_ptsz"));
  OK(gpa("cuGetExportTable", &f, 3000, 0, nullptr));
  CHECK(f == api.own("cuGetExportTable"));
  f = reinterpret_cast<void*>(1);
  CHECK_EQ(gpa("cuNoSuchFunction", &f, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(f == nullptr);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_EQ(gpa("cuMemAlloc", &f, 2000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
#else
  CHECK((reinterpret_cast<void*>(&cuMemAlloc_v2) != api.own("cuMemAlloc_v2")) == preloaded);
  // RTLD_NEXT keeps the caller: libclient_next_a's lookup of its own symbol
  // must find libclient_next_b's definition, not start from libgpupool.
  CHECK_EQ(client_call_next(), 2);
  CHECK(dlsym(RTLD_DEFAULT, "client_next_probe") != nullptr);
#endif
}

// GPUPOOL_SPLIT: sizes one phase never used are served from the memory the
// phase before freed, each piece an allocation of its own to the program
// (its range, attributes, contents and errors); a piece that shares its
// driver allocation cannot be exported over IPC; whole segments go back.
// GPUPOOL_SEGMENTS=expandable: the same, the pieces cut from one reserved
// range with a physical allocation mapped per 2 MiB granule, none of them
// exported over IPC, every granule given back (free_held, and with a
// context destroyed while the program holds pieces: virtual memory is no
// context's, the driver does not free it with one).
void scenario_split() {
  setup();
  const char* env = getenv("GPUPOOL_SPLIT");
  const bool expandable = g_expandable;
  const bool split =
      expandable || (g_pooled && env && strcmp(env, "off") != 0 && strcmp(env, "0") != 0);
  const StandinCounters c0 = snap();
  constexpr size_t kBig = 8 << 20, kPiece = (3 << 20) + 100;
  CUdeviceptr a[4];
  for (int i = 0; i < 4; ++i) {
    OK(api.mem_alloc(&a[i], kBig));
    fill(a[i], kBig, static_cast<unsigned char>(i + 1));
  }
  for (CUdeviceptr p : a) OK(api.mem_free(p));
  OK(api.ctx_sync());
  std::vector<Live> live;
  CUdeviceptr b[8];
  for (int i = 0; i < 8; ++i) {
    OK(api.mem_alloc(&b[i], kPiece));
    const Live l{b[i], kPiece, static_cast<unsigned char>(0x40 + i), false};
    check_no_overlap(live, l);
    fill(b[i], kPiece, l.tag);
    live.push_back(l);
  }
  // Split: phase one's four driver allocations serve all eight. Binned
  // (or the driver alone): eight more. Expandable: no driver allocation,
  // phase one's 32 MiB mapped granule by granule (one cuMemCreate and one
  // cuMemMap each) serve all eight.
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, expandable ? 0u : split ? 4u : 12u);
  if (expandable) {
    CHECK_EQ(snap().vmm_reserve_calls - c0.vmm_reserve_calls, 1u);
    CHECK_EQ(snap().vmm_created - c0.vmm_created, 16u);
    CHECK_EQ(snap().vmm_mapped - c0.vmm_mapped, 16u);
  }
  std::vector<unsigned long long> ids;
  for (CUdeviceptr p : b) {
    CUdeviceptr base = 0;
    size_t size = 0;
    OK(api.address_range(&base, &size, p + 17));
    CHECK_EQ(base, p);
    CHECK_EQ(size, kPiece);
    CUdeviceptr start = 0;
    OK(api.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + kPiece - 1));
    CHECK_EQ(start, p);
    size_t range = 0;
    OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
    CHECK_EQ(range, kPiece);
    unsigned long long id = 0;
    OK(api.ptr_attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    CHECK(std::find(ids.begin(), ids.end(), id) == ids.end());
    ids.push_back(id);
    // As for cuMemAlloc memory (the driver says 0 for virtual memory).
    int legacy_ipc = -1;
    OK(api.ptr_attr(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p + 1));
    CHECK_EQ(legacy_ipc, 1);
  }
  // Neighbours freed (and merged): the others keep their bytes; a freed
  // piece is unallocated, and a second free of it the driver's error.
  OK(api.mem_free(b[1]));
  OK(api.mem_free(b[2]));
  CHECK(all_equal(b[0], kPiece, 0x40));
  CHECK(all_equal(b[3], kPiece, 0x43));
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_EQ(api.address_range(&base, &size, b[1] + 5), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.mem_free(b[1]), CUDA_ERROR_INVALID_VALUE);
  // IPC: refused on a piece sharing its driver allocation; a request that
  // gets a segment of its own is exported as any block, and its free
  // reaches the driver.
  CUipcMemHandle ipc;
  CHECK_EQ(api.ipc_get(&ipc, b[3]), split ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS);
  CUdeviceptr whole = 0;
  OK(api.mem_alloc(&whole, 16 << 20));
  if (expandable) {
    // Every large block is a piece of the range.
    CHECK_EQ(api.ipc_get(&ipc, whole), CUDA_ERROR_NOT_SUPPORTED);
    OK(api.mem_free(whole));
  } else {
    OK(api.ipc_get(&ipc, whole));
    StandinCounters c1 = snap();
    OK(api.mem_free(whole));
    CHECK_EQ(snap().mem_free - c1.mem_free, 1u);
  }
  for (int i : {0, 3, 4, 5, 6, 7}) OK(api.mem_free(b[i]));
  OK(api.ctx_sync());
  free_held();
  // Everything went back: as many driver frees as driver allocations.
  const StandinCounters c2 = snap();
  CHECK_EQ(c2.mem_free - c0.mem_free, c2.mem_alloc - c0.mem_alloc);
  if (expandable) {
    // Every granule unmapped and its physical memory gone; the range kept.
    CHECK(c2.vmm_created - c0.vmm_created > 16u);
    CHECK_EQ(c2.vmm_freed - c0.vmm_freed, c2.vmm_created - c0.vmm_created);
    CHECK_EQ(c2.vmm_address_free_calls, c0.vmm_address_free_calls);
  }
  // A context destroyed while the program holds pieces of one segment: the
  // driver freed them, so the program's frees get the driver's answer for
  // freed memory, and nothing of that context is handed out again.
  {
    CUdevice dev;
    OK(api.device_get(&dev, 0));
    CUcontext cur = nullptr, other = nullptr;
    OK(api.ctx_get_current(&cur));
    OK(api.ctx_create(&other, nullptr, 0, dev));
    CUdeviceptr seg = 0, p1 = 0, p2 = 0;
    OK(api.mem_alloc(&seg, kBig));
    OK(api.mem_free(seg));
    OK(api.ctx_sync());
    OK(api.mem_alloc(&p1, kPiece));
    OK(api.mem_alloc(&p2, kPiece));
    if (split) CHECK(p2 > p1 && p2 < p1 + kBig);  // one segment
    const StandinCounters d0 = snap();
    OK(api.ctx_destroy(other));
    OK(api.ctx_set_current(cur));
    if (expandable) {
      // The context's range went back whole: the granules of p1, p2 and of
      // the held rest of the 8 MiB unmapped and freed, the range free.
      CHECK_EQ(snap().vmm_freed - d0.vmm_freed, 4u);
      CHECK_EQ(snap().vmm_address_free_calls - d0.vmm_address_free_calls, 1u);
    }
    CHECK_EQ(api.mem_free(p2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(api.mem_free(p1), CUDA_ERROR_INVALID_VALUE);
    // Memory that died with its context (virtual memory does not).
    CHECK_EQ(snap().dead_ptr_calls - d0.dead_ptr_calls, expandable ? 0u : 2u);
    CUdeviceptr q = 0;
    OK(api.mem_alloc(&q, kPiece));
    CHECK(q < p1 || q >= p1 + kBig || snap().mem_alloc > d0.mem_alloc);
    OK(api.mem_free(q));
    OK(api.ctx_sync());
  }
}

}  // namespace

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
  const char* growth = getenv("GPUPOOL_PENDING_GROWTH");
  g_growth = g_pooled && !g_immediate && !(growth && strcmp(growth, "0") == 0);
  const char* segments = getenv("GPUPOOL_SEGMENTS");
  g_expandable = g_pooled && segments && strcmp(segments, "expandable") == 0;
  load_api();
  const std::string s = argv[2];
  if (s == "reuse") scenario_reuse();
  else if (s == "overlap") scenario_overlap();
  else if (s == "pitch") scenario_pitch();
  else if (s == "threads") scenario_threads();
  else if (s == "errors") scenario_errors();
  else if (s == "ptrattr") scenario_ptrattr();
  else if (s == "oom") scenario_oom();
  else if (s == "fence") scenario_fence();
  else if (s == "solo") scenario_solo();
  else if (s == "context") scenario_context();
  else if (s == "fork") scenario_fork();
  else if (s == "lifetime") scenario_lifetime();
  else if (s == "exit") scenario_exit();
  else if (s == "lookup") scenario_lookup();
  else if (s == "split") scenario_split();
  else {
    fprintf(stderr, "unknown scenario %s\n", s.c_str());
    return 2;
  }
  // Nothing the scenario wrote landed in memory that had died with its
  // context.
  CHECK_EQ(api.dead_writes(), 0u);
  fprintf(stderr, "%s %s: ok\n", argv[1], argv[2]);
  return 0;
}
