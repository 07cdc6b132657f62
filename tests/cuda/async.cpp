// Stream-ordered allocations (cuMemAllocAsync, cuMemAllocFromPoolAsync,
// cuMemFreeAsync) on the stand-in driver's memory pools, with and without
// gpupool (docs/guarantees.md, "What gpupool keeps exactly as the driver
// does"). gpupool manages the driver's pools: the program sees the
// driver's answers, and
// what differs is only how often the pool makes physical memory, what it
// keeps between steps, and who can make it give that memory back.
//
// usage: cuda_async SCENARIO
// CLIENT_POOLED=1: gpupool is preloaded and expected to manage the pools.
// Every check prints what failed and exits 1.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>
#include <string>
#include <thread>

#include "standin.h"

#include "check.h"

namespace {

constexpr size_t MiB = size_t{1} << 20;
bool g_pooled = false;
StandinCounters snap() { return *standin_counters(); }

// gpupool's C API when it is preloaded (switched off, it answers -1).
void gpupool_call(const char* name) {
  using Fn = int (*)();
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  const int r = fn ? fn() : 0;
  if (g_pooled) CHECK_EQ(r, 0);
}

uint64_t attr(CUmemoryPool pool, CUmemPool_attribute a) {
  cuuint64_t v = 0;
  OK(cuMemPoolGetAttribute(pool, a, &v));
  return v;
}
uint64_t reserved(CUmemoryPool pool) { return attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT); }

CUmemoryPool setup() {
  OK(cuInit(0));
  CUdevice dev;
  OK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  OK(cuDevicePrimaryCtxRetain(&ctx, dev));
  OK(cuCtxSetCurrent(ctx));
  CUmemoryPool pool;
  OK(cuDeviceGetDefaultMemPool(&pool, dev));
  return pool;
}

// One training-like step: three buffers of the default pool (`alloc`: the
// export, or the per-thread variant cudart takes), written and summed,
// freed in stream order, then the stream synchronized.
using AllocAsync = CUresult (*)(CUdeviceptr*, size_t, CUstream);
uint64_t step(AllocAsync alloc, CUstream s, int i) {
  const size_t sizes[3] = {1 * MiB, 3 * MiB, 5 * MiB};
  CUdeviceptr p[3];
  uint64_t sum = 0;
  for (int k = 0; k < 3; ++k) {
    OK(alloc(&p[k], sizes[k], s));
    auto* b = reinterpret_cast<unsigned char*>(p[k]);
    memset(b, (i * 3 + k) & 0xff, sizes[k]);
    for (size_t j = 0; j < sizes[k]; j += 4096) sum += b[j] * (j + 1);
  }
  for (auto q : p) OK(cuMemFreeAsync(q, s));
  OK(cuStreamSynchronize(s));
  return sum;
}

uint64_t expected_sum(int i) {
  const size_t sizes[3] = {1 * MiB, 3 * MiB, 5 * MiB};
  uint64_t sum = 0;
  for (int k = 0; k < 3; ++k)
    for (size_t j = 0; j < sizes[k]; j += 4096) sum += ((i * 3 + k) & 0xff) * (j + 1);
  return sum;
}

AllocAsync per_thread_alloc() {
  void* fn = nullptr;
  OK(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11020,
                         CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  CHECK(fn != standin_own("cuMemAllocAsync"));  // the _ptsz variant (or gpupool's hook of it)
  return reinterpret_cast<AllocAsync>(fn);
}

// The default pool keeps its memory between steps under gpupool (the
// driver's threshold 0 gives it back at every synchronization without),
// and the program reads the same results and the same threshold.
void scenario_steps() {
  CUmemoryPool pool = setup();
  const AllocAsync ptsz = per_thread_alloc();
  const StandinCounters c0 = snap();
  const int n = 20;
  for (int i = 0; i < n; ++i)
    CHECK_EQ(step(i % 2 ? ptsz : &cuMemAllocAsync, nullptr, i), expected_sum(i));
  const StandinCounters c1 = snap();
  CHECK_EQ(c1.async_allocs - c0.async_allocs, uint64_t(3 * n));
  if (g_pooled) {
    CHECK_EQ(c1.pool_creations - c0.pool_creations, 3u);
    CHECK_EQ(reserved(pool), 12 * MiB);  // 2 + 4 + 6 MiB chunks, kept
  } else {
    CHECK_EQ(c1.pool_creations - c0.pool_creations, uint64_t(3 * n));
    CHECK_EQ(reserved(pool), 0u);
  }
  CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0u);
  CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0u);  // what the program would see
}

// The driver's order of reuse, kept: a chunk freed on a stream is reusable
// there at once; on another stream only once the free has executed.
void scenario_streams() {
  CUmemoryPool pool = setup();
  CUstream a, b;
  OK(cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
  OK(cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
  CUdeviceptr p, q, r;
  StandinCounters c0 = snap();
  OK(cuMemAllocAsync(&p, 4 * MiB, a));
  OK(cuMemFreeAsync(p, a));
  OK(cuMemAllocAsync(&q, 4 * MiB, a));  // same stream: the same chunk at once
  CHECK_EQ(q, p);
  CHECK_EQ(snap().pool_creations - c0.pool_creations, 1u);
  OK(cuMemFreeAsync(q, a));
  OK(cuMemAllocAsync(&r, 4 * MiB, b));  // another stream, free not executed: new memory
  CHECK(r != q);
  CHECK_EQ(snap().pool_creations - c0.pool_creations, 2u);
  OK(cuStreamSynchronize(a));
  OK(cuMemFreeAsync(r, b));
  OK(cuStreamSynchronize(b));
  // Both frees executed: kept by gpupool for any stream, returned without.
  c0 = snap();
  CUdeviceptr s1, s2;
  OK(cuMemAllocAsync(&s1, 4 * MiB, b));
  OK(cuMemAllocAsync(&s2, 4 * MiB, a));
  CHECK_EQ(snap().pool_creations - c0.pool_creations, g_pooled ? 0u : 2u);
  OK(cuMemFreeAsync(s1, b));
  OK(cuMemFreeAsync(s2, a));
  OK(cuCtxSynchronize());
  CHECK_EQ(reserved(pool), g_pooled ? 8 * MiB : 0u);
  // An event's synchronization executes frees as well.
  CUevent ev;
  OK(cuEventCreate(&ev, 0));
  OK(cuMemAllocAsync(&p, 4 * MiB, a));
  OK(cuMemFreeAsync(p, a));
  OK(cuEventRecord(ev, a));
  OK(cuEventSynchronize(ev));
  CHECK_EQ(reserved(pool), g_pooled ? 8 * MiB : 0u);
  OK(cuEventDestroy(ev));
}

// A threshold the program sets is the driver's to apply, and its own
// trims trim; an explicit pool is kept like the default one.
void scenario_threshold() {
  CUmemoryPool pool = setup();
  cuuint64_t four = 4 * MiB;
  OK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &four));
  CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 4 * MiB);
  CUdeviceptr p[3];
  for (auto& x : p) OK(cuMemAllocAsync(&x, 2 * MiB, nullptr));
  for (auto x : p) OK(cuMemFreeAsync(x, nullptr));
  OK(cuStreamSynchronize(nullptr));
  CHECK_EQ(reserved(pool), 4 * MiB);  // down to the program's threshold, both ways
  OK(cuMemPoolTrimTo(pool, 2 * MiB));
  CHECK_EQ(reserved(pool), 2 * MiB);
  OK(cuMemPoolTrimTo(pool, 0));
  CHECK_EQ(reserved(pool), 0u);

  // An explicit pool, through cuMemAllocFromPoolAsync.
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = 0;
  CUmemoryPool mine;
  OK(cuMemPoolCreate(&mine, &props));
  const StandinCounters c0 = snap();
  for (int i = 0; i < 10; ++i) {
    CUdeviceptr x;
    OK(cuMemAllocFromPoolAsync(&x, 3 * MiB, mine, nullptr));
    OK(cuMemFreeAsync(x, nullptr));
    OK(cuStreamSynchronize(nullptr));
  }
  CHECK_EQ(snap().pool_creations - c0.pool_creations, g_pooled ? 1u : 10u);
  CHECK_EQ(attr(mine, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0u);
  // The current pool set to it: cuMemAllocAsync allocates from it.
  OK(cuDeviceSetMemPool(0, mine));
  CUmemoryPool cur;
  OK(cuDeviceGetMemPool(&cur, 0));
  CHECK(cur == mine);
  CUdeviceptr x;
  OK(cuMemAllocAsync(&x, 3 * MiB, nullptr));
  CHECK_EQ(attr(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 4 * MiB);
  OK(cuMemFreeAsync(x, nullptr));
  OK(cuStreamSynchronize(nullptr));
  CHECK_EQ(snap().pool_creations - c0.pool_creations, g_pooled ? 1u : 11u);
  OK(cuDeviceSetMemPool(0, pool));
  OK(cuMemPoolDestroy(mine));
}

// The held bytes of gpupool's stream-ordered row in its stats (-1: none).
long long async_held() {
  using Fn = size_t (*)(char*, size_t);
  auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gpupool_stats_json"));
  if (!fn) return -1;
  std::string buf(1 << 20, '\0');
  buf.resize(fn(buf.data(), buf.size()));
  const size_t at = buf.find("\"kind\":\"cuda-async\"");
  if (at == std::string::npos) return -1;
  const size_t h = buf.find("\"held_bytes\":", at);
  CHECK(h != std::string::npos);
  return atoll(buf.c_str() + h + strlen("\"held_bytes\":"));
}

// What gpupool keeps shows in its stats, and goes on request: free_held
// trims, stop_holding trims and keeps nothing more.
void scenario_release() {
  CUmemoryPool pool = setup();
  for (int i = 0; i < 3; ++i) CHECK_EQ(step(&cuMemAllocAsync, nullptr, i), expected_sum(i));
  CHECK_EQ(reserved(pool), g_pooled ? 12 * MiB : 0u);
  CHECK_EQ(async_held(), g_pooled ? (long long)(12 * MiB) : -1);
  gpupool_call("gpupool_free_held");
  CHECK_EQ(reserved(pool), 0u);
  CHECK_EQ(async_held(), g_pooled ? 0 : -1);
  // reset_peak resets the pool's high-water marks to what it has now.
  CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= 4 * MiB);
  gpupool_call("gpupool_reset_peak");
  if (g_pooled) {
    CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 0u);
    CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 0u);
  } else {
    CHECK(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) >= 4 * MiB);
  }
  CHECK_EQ(step(&cuMemAllocAsync, nullptr, 3), expected_sum(3));
  CHECK_EQ(reserved(pool), g_pooled ? 12 * MiB : 0u);
  gpupool_call("gpupool_stop_holding");
  CHECK_EQ(reserved(pool), 0u);
  const StandinCounters c0 = snap();
  for (int i = 0; i < 3; ++i) CHECK_EQ(step(&cuMemAllocAsync, nullptr, i), expected_sum(i));
  CHECK_EQ(reserved(pool), 0u);  // nothing kept once holding stopped
  CHECK_EQ(snap().pool_creations - c0.pool_creations, 9u);
  CHECK_EQ(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0u);
}

// Nothing is trimmed while a stream captures (a call the driver does not
// allow then); afterwards it is.
void scenario_capture() {
  CUmemoryPool pool = setup();
  CHECK_EQ(step(&cuMemAllocAsync, nullptr, 0), expected_sum(0));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const uint64_t kept = reserved(pool);
  CHECK_EQ(kept, g_pooled ? 12 * MiB : 0u);
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUstreamCaptureStatus st;
  OK(cuStreamIsCapturing(s, &st));
  CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  const StandinCounters c0 = snap();
  gpupool_call("gpupool_free_held");
  CHECK_EQ(snap().trim_calls - c0.trim_calls, 0u);
  CHECK_EQ(reserved(pool), kept);
  CUgraph g;
  OK(cuStreamEndCapture(s, &g));
  gpupool_call("gpupool_free_held");
  CHECK_EQ(reserved(pool), 0u);
  // A capture whose stream is destroyed is over too.
  CHECK_EQ(step(&cuMemAllocAsync, nullptr, 1), expected_sum(1));
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuStreamDestroy(s));
  gpupool_call("gpupool_free_held");
  CHECK_EQ(reserved(pool), 0u);
  CHECK_EQ(snap().trims_refused, 0u);
}

// Memory gpupool keeps in a pool never fails another allocation: out of
// memory elsewhere (cuMemAlloc, another pool) trims and retries.
void scenario_oom() {
  CUmemoryPool pool = setup();
  CUdeviceptr p[5], big;
  for (auto& x : p) OK(cuMemAllocAsync(&x, 8 * MiB, nullptr));
  for (auto x : p) OK(cuMemFreeAsync(x, nullptr));
  OK(cuStreamSynchronize(nullptr));
  CHECK_EQ(reserved(pool), g_pooled ? 40 * MiB : 0u);
  OK(cuMemAlloc(&big, 40 * MiB));  // 64 MiB device: fits only once the pool lets go
  CHECK_EQ(reserved(pool), 0u);
  OK(cuMemFree(big));
  gpupool_call("gpupool_free_held");

  // Another pool's kept memory, for the default pool's allocation.
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool mine;
  OK(cuMemPoolCreate(&mine, &props));
  for (auto& x : p) OK(cuMemAllocFromPoolAsync(&x, 8 * MiB, mine, nullptr));
  for (auto x : p) OK(cuMemFreeAsync(x, nullptr));
  OK(cuStreamSynchronize(nullptr));
  CHECK_EQ(reserved(mine), g_pooled ? 40 * MiB : 0u);
  OK(cuMemAllocAsync(&big, 40 * MiB, nullptr));
  CHECK_EQ(reserved(mine), 0u);
  OK(cuMemFreeAsync(big, nullptr));
  OK(cuStreamSynchronize(nullptr));
  OK(cuMemPoolDestroy(mine));
}

// What a trace of stream-ordered allocations shows (run_async_trace.py
// reads it): each allocation and free the program makes, whichever call
// frees it, ends at its pool's destruction, none made while a stream
// captures, and one left allocated at exit (the leak).
void scenario_traced() {
  CUmemoryPool pool = setup();
  (void)pool;
  CUdeviceptr a, b, c, e, f, g, leak;
  OK(cuMemAllocAsync(&a, 1 * MiB + 100, nullptr));
  OK(cuMemAllocAsync(&b, 3 * MiB, nullptr));
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUmemoryPool mine;
  OK(cuMemPoolCreate(&mine, &props));
  OK(cuMemAllocFromPoolAsync(&c, 2 * MiB, mine, nullptr));
  OK(cuMemAllocFromPoolAsync(&e, 5 * MiB, mine, nullptr));
  OK(cuMemAllocAsync(&leak, 7 * MiB, nullptr));
  OK(cuMemFreeAsync(a, nullptr));
  OK(cuMemFree(b));  // the driver allows it for stream-ordered memory
  OK(cuMemFreeAsync(c, nullptr));
  OK(cuStreamSynchronize(nullptr));
  // Destroyed while `e` is allocated: the driver frees it when the program does.
  OK(cuMemPoolDestroy(mine));
  OK(cuMemFreeAsync(e, nullptr));
  // A free captured into a graph ends the allocation; one made while the
  // stream captures is the graph's.
  OK(cuMemAllocAsync(&f, 6 * MiB, nullptr));
  CUstream s;
  OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  OK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  OK(cuMemAllocAsync(&g, 4 * MiB, s));
  OK(cuMemFreeAsync(g, s));
  OK(cuMemFreeAsync(f, s));
  CUgraph graph;
  OK(cuStreamEndCapture(s, &graph));
  OK(cuStreamSynchronize(s));
  OK(cuStreamDestroy(s));
  // A free the driver refuses (on the destroyed stream) ends nothing.
  CUdeviceptr h;
  OK(cuMemAllocAsync(&h, 8 * MiB, nullptr));
  CHECK_EQ(cuMemFreeAsync(h, s), CUDA_ERROR_INVALID_HANDLE);
  OK(cuMemFreeAsync(h, nullptr));
  OK(cuStreamSynchronize(nullptr));
}

// The program destroys its pools while another thread of it asks gpupool
// for what they keep (gpupool_free_held: each pool's attributes and a
// trim): gpupool never names a destroyed pool to the driver (whose
// handle may by then be another pool's).
void scenario_destroy() {
  setup();
  CUcontext ctx = nullptr;
  OK(cuCtxGetCurrent(&ctx));
  std::atomic<bool> done{false};
  std::thread asker([&] {
    cuCtxSetCurrent(ctx);
    while (!done.load()) gpupool_call("gpupool_free_held");
  });
  const StandinCounters c0 = snap();
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  for (int i = 0; i < 2000; ++i) {
    CUmemoryPool mine;
    CUdeviceptr p;
    OK(cuMemPoolCreate(&mine, &props));
    OK(cuMemAllocFromPoolAsync(&p, 2 * MiB, mine, nullptr));
    OK(cuMemFreeAsync(p, nullptr));
    OK(cuStreamSynchronize(nullptr));
    OK(cuMemPoolDestroy(mine));
  }
  done.store(true);
  asker.join();
  CHECK_EQ(snap().dead_pool_calls - c0.dead_pool_calls, 0u);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s SCENARIO\n", argv[0]);
    return 2;
  }
  const char* pooled = getenv("CLIENT_POOLED");
  g_pooled = pooled && atoi(pooled) != 0;
  const std::string s = argv[1];
  if (s == "steps") scenario_steps();
  else if (s == "streams") scenario_streams();
  else if (s == "threshold") scenario_threshold();
  else if (s == "release") scenario_release();
  else if (s == "capture") scenario_capture();
  else if (s == "oom") scenario_oom();
  else if (s == "traced") scenario_traced();
  else if (s == "destroy") scenario_destroy();
  else {
    fprintf(stderr, "unknown scenario %s\n", s.c_str());
    return 2;
  }
  fprintf(stderr, "async %s: ok\n", argv[1]);
  return 0;
}
