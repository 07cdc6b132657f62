// The virtual memory API as programs use it, on the stand-in driver, with and
// without gpupool: XLA's platform allocator (every buffer a handle mapped
// whole in a reservation of its own), PyTorch's expandable segments (handles
// mapped into one large reservation), the driver's answers to misuse, out of
// memory and a context's end.
//
// usage: cuda_vmm_client MODE SCENARIO
//   MODE: dlsym (dlopen + dlsym) or procaddr (cuGetProcAddress_v2, as XLA's
//   CUDA plugin finds the driver)
//   SCENARIO: xla, expandable, errors, oom, context, ghost, threads
// CLIENT_POOLED=1: gpupool is preloaded and must pool (the stand-in's
// counters show the driver calls it saved). Every check prints what failed
// and exits 1.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "standin.h"

#include "check.h"

namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct Api {
  decltype(&cuInit) init;
  decltype(&cuDeviceGet) device_get;
  decltype(&cuDevicePrimaryCtxRetain) primary_retain;
  decltype(&cuCtxSetCurrent) ctx_set_current;
  decltype(&cuCtxGetCurrent) ctx_get_current;
  decltype(&cuCtxCreate_v4) ctx_create;
  decltype(&cuCtxDestroy_v2) ctx_destroy;
  decltype(&cuCtxSynchronize) ctx_sync;
  decltype(&cuMemAlloc_v2) mem_alloc;
  decltype(&cuMemFree_v2) mem_free;
  decltype(&cuMemCreate) create;
  decltype(&cuMemRelease) release;
  decltype(&cuMemAddressReserve) reserve;
  decltype(&cuMemAddressFree) address_free;
  decltype(&cuMemMap) map;
  decltype(&cuMemUnmap) unmap;
  decltype(&cuMemSetAccess) set_access;
  decltype(&cuMemRetainAllocationHandle) retain;
  decltype(&cuMemExportToShareableHandle) export_handle;
  decltype(&cuMemGetAllocationGranularity) granularity;
  decltype(&standin_counters) counters;
  decltype(&standin_used) used;
} api;
bool g_pooled = false;

void free_held() {
  using Fn = int (*)();  // docs/c-api.md
  if (auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpupool_free_held"))) fn();
}

void load(const std::string& mode) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  CHECK(lib);
  using GetProc =
      CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto get_proc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  CHECK(get_proc);
  auto find = [&](const char* base, const char* exported) {
    void* p = nullptr;
    if (mode == "procaddr") {
      CUdriverProcAddressQueryResult status;
      OK(get_proc(base, &p, 12080, 0, &status));
    } else {
      p = dlsym(lib, exported);
    }
    CHECK(p);
    return p;
  };
#define LOAD(field, base, exported) \
  api.field = reinterpret_cast<decltype(api.field)>(find(base, exported))
  LOAD(init, "cuInit", "cuInit");
  LOAD(device_get, "cuDeviceGet", "cuDeviceGet");
  LOAD(primary_retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain");
  LOAD(ctx_set_current, "cuCtxSetCurrent", "cuCtxSetCurrent");
  LOAD(ctx_get_current, "cuCtxGetCurrent", "cuCtxGetCurrent");
  LOAD(ctx_create, "cuCtxCreate", "cuCtxCreate_v4");
  LOAD(ctx_destroy, "cuCtxDestroy", "cuCtxDestroy_v2");
  LOAD(ctx_sync, "cuCtxSynchronize", "cuCtxSynchronize");
  LOAD(mem_alloc, "cuMemAlloc", "cuMemAlloc_v2");
  LOAD(mem_free, "cuMemFree", "cuMemFree_v2");
  LOAD(create, "cuMemCreate", "cuMemCreate");
  LOAD(release, "cuMemRelease", "cuMemRelease");
  LOAD(reserve, "cuMemAddressReserve", "cuMemAddressReserve");
  LOAD(address_free, "cuMemAddressFree", "cuMemAddressFree");
  LOAD(map, "cuMemMap", "cuMemMap");
  LOAD(unmap, "cuMemUnmap", "cuMemUnmap");
  LOAD(set_access, "cuMemSetAccess", "cuMemSetAccess");
  LOAD(retain, "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle");
  LOAD(export_handle, "cuMemExportToShareableHandle", "cuMemExportToShareableHandle");
  LOAD(granularity, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity");
#undef LOAD
  api.counters = reinterpret_cast<decltype(api.counters)>(dlsym(lib, "standin_counters"));
  api.used = reinterpret_cast<decltype(api.used)>(dlsym(lib, "standin_used"));
  CHECK(api.counters && api.used);
}

CUmemAllocationProp device_prop(int dev = 0) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}

void grant(CUdeviceptr va, size_t size, int dev = 0) {
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(api.set_access(va, size, &a, 1));
}

// One buffer as XLA's CudaDeviceAllocator makes it.
struct Buffer {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  size_t size = 0;
};

Buffer xla_allocate(size_t size) {
  Buffer b;
  b.size = size;
  const CUmemAllocationProp prop = device_prop();
  OK(api.create(&b.handle, size, &prop, 0));
  OK(api.reserve(&b.va, size, 0, 0, 0));
  OK(api.map(b.va, size, 0, b.handle, 0));
  grant(b.va, size);
  return b;
}

// Its deallocation: the device drained first, then unmap, release, free.
void xla_free(const Buffer& b) {
  OK(api.ctx_sync());
  OK(api.unmap(b.va, b.size));
  OK(api.release(b.handle));
  OK(api.address_free(b.va, b.size));
}

void fill(CUdeviceptr va, size_t size, unsigned seed) {
  auto* p = reinterpret_cast<uint32_t*>(va);
  for (size_t i = 0; i < size / 4; i += 1024) p[i] = seed * 2654435761u + unsigned(i);
}
uint64_t sum(CUdeviceptr va, size_t size) {
  const auto* p = reinterpret_cast<const uint32_t*>(va);
  uint64_t s = 0;
  for (size_t i = 0; i < size / 4; i += 1024) s = s * 31 + p[i];
  return s;
}

void primary() {
  CUdevice dev;
  CUcontext ctx;
  OK(api.device_get(&dev, 0));
  OK(api.primary_retain(&ctx, dev));
  OK(api.ctx_set_current(ctx));
}

// Every physical allocation and reservation is gone (gpupool released what it
// held).
void check_all_returned() {
  free_held();
  CHECK_EQ(api.used(0), 0u);
  const StandinCounters c = *api.counters();
  CHECK_EQ(c.vmm_created, c.vmm_freed);
}

// XLA's platform allocator: a step's buffers made and freed, sizes repeating
// from step to step. Pooled, the driver makes a handful of physical
// allocations instead of one per buffer, and the data is what was written.
void scenario_xla() {
  primary();
  const size_t sizes[] = {2 * kMiB, 4 * kMiB, 2 * kMiB, 8 * kMiB, 6 * kMiB, 2 * kMiB};
  constexpr int kSteps = 30;
  uint64_t total = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<Buffer> bufs;
    for (size_t k = 0; k < std::size(sizes); ++k) {
      bufs.push_back(xla_allocate(sizes[k]));
      fill(bufs.back().va, sizes[k], unsigned(step * 16 + k));
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      // Another buffer's data never shows in this one.
      Buffer probe = bufs[k];
      std::vector<uint32_t> expect(1);
      fill(reinterpret_cast<CUdeviceptr>(expect.data()), 4, unsigned(step * 16 + k));
      CHECK_EQ(reinterpret_cast<uint32_t*>(probe.va)[0], expect[0]);
      total += sum(probe.va, probe.size);
    }
    for (const Buffer& b : bufs) xla_free(b);
  }
  printf("checksum %llx\n", (unsigned long long)total);
  const StandinCounters c = *api.counters();
  const uint64_t buffers = kSteps * std::size(sizes);
  printf("physical allocations: %llu for %llu buffers\n", (unsigned long long)c.vmm_created,
         (unsigned long long)buffers);
  if (g_pooled) CHECK(c.vmm_created <= 3 * std::size(sizes));
  else CHECK_EQ(c.vmm_created, buffers);
  check_all_returned();
}

// PyTorch's expandable segments: one large reservation, 2 MiB handles mapped
// into it at offsets. A handle the pool made (a held one, after a warm-up of
// XLA-style buffers) works there exactly as a fresh one.
void scenario_expandable() {
  primary();
  for (int i = 0; i < 4; ++i) xla_free(xla_allocate(2 * kMiB));  // a held unit, pooled
  CUdeviceptr base = 0;
  const size_t span = 32 * kMiB;
  OK(api.reserve(&base, span, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> handles;
  const CUmemAllocationProp prop = device_prop();
  for (int i = 0; i < 8; ++i) {
    CUmemGenericAllocationHandle h;
    OK(api.create(&h, 2 * kMiB, &prop, 0));
    OK(api.map(base + i * 2 * kMiB, 2 * kMiB, 0, h, 0));
    grant(base + i * 2 * kMiB, 2 * kMiB);
    handles.push_back(h);
  }
  fill(base, 16 * kMiB, 7);
  const uint64_t s = sum(base, 16 * kMiB);
  printf("checksum %llx\n", (unsigned long long)s);
  // The handle of a mapped address, retained: one more reference to release.
  CUmemGenericAllocationHandle again = 0;
  OK(api.retain(&again, reinterpret_cast<void*>(base + 2 * kMiB)));
  CHECK_EQ(again, handles[1]);
  OK(api.release(again));
  // Memory released while mapped lives until unmapped.
  for (auto h : handles) OK(api.release(h));
  CHECK_EQ(sum(base, 16 * kMiB), s);
  OK(api.unmap(base, 16 * kMiB));
  OK(api.address_free(base, span));
  // A pooled buffer's handle exported (another process could map it).
  const Buffer shared = xla_allocate(2 * kMiB);
  int fd = -1;
  const CUresult r =
      api.export_handle(&fd, shared.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  CHECK_EQ(r, CUDA_ERROR_NOT_PERMITTED);  // not asked for at creation
  xla_free(shared);
  check_all_returned();
}

// The driver's answers, for buffers the pool made and held before.
void scenario_errors() {
  primary();
  for (int i = 0; i < 3; ++i) xla_free(xla_allocate(4 * kMiB));
  const CUmemAllocationProp prop = device_prop();
  CUmemGenericAllocationHandle h;
  CHECK_EQ(api.create(&h, 3 * kMiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not a granule multiple
  CHECK_EQ(api.create(nullptr, 4 * kMiB, &prop, 0), CUDA_ERROR_INVALID_VALUE);
  Buffer b = xla_allocate(4 * kMiB);
  CHECK_EQ(api.address_free(b.va, b.size), CUDA_ERROR_INVALID_VALUE);  // still mapped
  OK(api.unmap(b.va, b.size));
  OK(api.unmap(b.va, b.size));  // an unmapped range of a reservation
  CHECK_EQ(api.set_access(b.va, b.size, nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  OK(api.release(b.handle));
  CHECK_EQ(api.release(b.handle), CUDA_ERROR_INVALID_VALUE);                  // released twice
  CHECK_EQ(api.map(b.va, b.size, 0, b.handle, 0), CUDA_ERROR_INVALID_VALUE);  // a released handle
  OK(api.address_free(b.va, b.size));
  CHECK_EQ(api.address_free(b.va, b.size), CUDA_ERROR_INVALID_VALUE);  // freed twice
  CHECK_EQ(api.unmap(b.va, b.size), CUDA_ERROR_INVALID_VALUE);         // not reserved any more
  // Half a handle mapped: the driver does not support it.
  Buffer c;
  c.size = 4 * kMiB;
  OK(api.create(&c.handle, 4 * kMiB, &prop, 0));
  OK(api.reserve(&c.va, 4 * kMiB, 0, 0, 0));
  CHECK_EQ(api.map(c.va, 2 * kMiB, 0, c.handle, 0), CUDA_ERROR_NOT_SUPPORTED);
  OK(api.map(c.va, 4 * kMiB, 0, c.handle, 0));
  grant(c.va, 4 * kMiB);
  fill(c.va, 4 * kMiB, 3);
  xla_free(c);
  // Reserved at another size than created: the program's own layout.
  Buffer e;
  OK(api.create(&e.handle, 4 * kMiB, &prop, 0));
  OK(api.reserve(&e.va, 8 * kMiB, 0, 0, 0));
  OK(api.map(e.va + 2 * kMiB, 4 * kMiB, 0, e.handle, 0));
  grant(e.va + 2 * kMiB, 4 * kMiB);
  fill(e.va + 2 * kMiB, 4 * kMiB, 5);
  OK(api.unmap(e.va + 2 * kMiB, 4 * kMiB));
  OK(api.release(e.handle));
  OK(api.address_free(e.va, 8 * kMiB));
  // Created and released, never reserved (the handle may have gone where
  // gpupool does not see, a multicast binding, say): the driver releases it.
  OK(api.create(&h, 4 * kMiB, &prop, 0));
  OK(api.release(h));
  CHECK_EQ(api.release(h), CUDA_ERROR_INVALID_VALUE);
  // A tile pool (sparse arrays): the driver's own.
  CUmemAllocationProp tiles = prop;
  tiles.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
  const uint64_t made = api.counters()->vmm_created;
  OK(api.create(&h, 4 * kMiB, &tiles, 0));
  CHECK_EQ(api.counters()->vmm_created, made + 1);
  OK(api.release(h));
  check_all_returned();
}

// Released and unmapped, the reservation kept for later: the memory is free
// for the program, also for other kinds of allocation (64 MiB device).
void scenario_ghost() {
  primary();
  const CUmemAllocationProp prop = device_prop();
  for (int round = 0; round < 2; ++round) {
    Buffer b = xla_allocate(40 * kMiB);
    fill(b.va, b.size, 2);
    OK(api.unmap(b.va, b.size));
    OK(api.release(b.handle));
    CUdeviceptr p = 0;
    OK(api.mem_alloc(&p, 40 * kMiB));
    OK(api.mem_free(p));
    free_held();
    // The reservation is still the program's: another handle mapped there.
    CUmemGenericAllocationHandle h;
    OK(api.create(&h, 40 * kMiB, &prop, 0));
    OK(api.map(b.va, b.size, 0, h, 0));
    grant(b.va, b.size);
    fill(b.va, b.size, 3);
    OK(api.unmap(b.va, b.size));
    OK(api.release(h));
    OK(api.address_free(b.va, b.size));
  }
  check_all_returned();
}

// Threads allocating and freeing at once: each buffer is its own (the
// reservation a create's thread asks for next is that create's unit).
void scenario_threads() {
  primary();
  CUcontext ctx;
  OK(api.ctx_get_current(&ctx));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, ctx] {
      OK(api.ctx_set_current(ctx));
      for (int i = 0; i < 40; ++i) {
        const size_t size = size_t(2 + 2 * ((t + i) % 3)) * kMiB;
        Buffer b = xla_allocate(size);
        fill(b.va, size, unsigned(t * 1000 + i));
        std::this_thread::yield();
        std::vector<uint32_t> expect(1);
        fill(reinterpret_cast<CUdeviceptr>(expect.data()), 4, unsigned(t * 1000 + i));
        CHECK_EQ(reinterpret_cast<uint32_t*>(b.va)[0], expect[0]);
        xla_free(b);
      }
    });
  for (auto& th : threads) th.join();
  check_all_returned();
}

// Held units go back when the device runs short, for any kind of allocation.
void scenario_oom() {
  primary();  // STANDIN_CAPACITY=64 MiB
  std::vector<Buffer> bufs;
  for (int i = 0; i < 8; ++i) bufs.push_back(xla_allocate(6 * kMiB));
  for (const Buffer& b : bufs) xla_free(b);  // 48 MiB held when pooled
  Buffer big = xla_allocate(40 * kMiB);
  fill(big.va, big.size, 1);
  xla_free(big);
  for (int i = 0; i < 8; ++i) bufs[i] = xla_allocate(6 * kMiB);
  for (const Buffer& b : bufs) xla_free(b);
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, 40 * kMiB));
  OK(api.mem_free(p));
  check_all_returned();
}

// A created context ends with buffers the program has, and some held: the
// program's stay usable and are freed as usual (the memory is no context's),
// the held ones go back to the driver.
void scenario_context() {
  CUdevice dev;
  CUcontext ctx;
  OK(api.init(0));
  OK(api.device_get(&dev, 0));
  OK(api.ctx_create(&ctx, nullptr, 0, dev));
  for (int i = 0; i < 3; ++i) xla_free(xla_allocate(2 * kMiB));
  Buffer kept = xla_allocate(2 * kMiB);
  Buffer unmapped = xla_allocate(4 * kMiB);
  OK(api.unmap(unmapped.va, unmapped.size));
  Buffer released = xla_allocate(6 * kMiB);
  OK(api.release(released.handle));
  fill(kept.va, kept.size, 9);
  const uint64_t s = sum(kept.va, kept.size);
  OK(api.ctx_destroy(ctx));
  CHECK_EQ(sum(kept.va, kept.size), s);
  OK(api.unmap(kept.va, kept.size));
  OK(api.release(kept.handle));
  OK(api.address_free(kept.va, kept.size));
  OK(api.release(unmapped.handle));
  OK(api.address_free(unmapped.va, unmapped.size));
  CHECK_EQ(sum(released.va, released.size), sum(released.va, released.size));  // still mapped
  OK(api.unmap(released.va, released.size));
  OK(api.address_free(released.va, released.size));
  CHECK_EQ(api.used(0), 0u);
  const StandinCounters c = *api.counters();
  CHECK_EQ(c.vmm_created, c.vmm_freed);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s dlsym|procaddr xla|expandable|errors|oom|context|ghost|threads\n",
            argv[0]);
    return 2;
  }
  const char* pooled = getenv("CLIENT_POOLED");
  g_pooled = pooled && strcmp(pooled, "1") == 0;
  load(argv[1]);
  OK(api.init(0));
  const std::string s = argv[2];
  if (s == "xla") scenario_xla();
  else if (s == "expandable") scenario_expandable();
  else if (s == "errors") scenario_errors();
  else if (s == "oom") scenario_oom();
  else if (s == "context") scenario_context();
  else if (s == "ghost") scenario_ghost();
  else if (s == "threads") scenario_threads();
  else return 2;
  printf("ok\n");
  return 0;
}
