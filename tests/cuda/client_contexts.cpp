// Scenarios of contexts that end, by paths gpupool sees and paths it does
// not: their blocks are dropped, never handed out or asked about again.
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client.hpp"

namespace client {

namespace {

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

}  // namespace

// Under GPUPOOL_SEGMENTS=expandable, a destroyed context's range (virtual
// memory is the device's, not the context's) is unmapped and its address
// space freed once the program has freed its last block of it: by the
// program's free, or by gpupool's thread where that one had the arena
// pinned then. Waits (bounded) until it is, so that what follows counts
// only the new context's memory.
static void wait_range_let_go(const StandinCounters& before) {
  if (!g_expandable) return;
  for (int i = 0; i < 500 && snap().vmm_address_free_calls == before.vmm_address_free_calls; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK_EQ(snap().vmm_address_free_calls - before.vmm_address_free_calls, 1u);
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
  StandinCounters c0 = snap();
  OK(api.ctx_destroy(a));
  // The program's own frees of blocks of the destroyed context get the
  // driver's answer, pooled or not.
  const StandinCounters destroyed = snap();
  CHECK_EQ(api.mem_free(still_active), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(host_active), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(snap().dead_ptr_calls - destroyed.dead_ptr_calls, 2u);
  wait_range_let_go(c0);
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
    const StandinCounters ended = snap();
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
    wait_range_let_go(ended);
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

// A context that ended unseen took the events of gpupool's marks with it,
// and the program's new events may have their handles: a free of one of
// its blocks records no mark (it would record the program's event). Marks
// are recorded for an expandable range's waits only.
void lifetime_marks_unseen() {
  const char* segments = getenv("GPUPOOL_SEGMENTS");
  if (!g_pooled || g_immediate || g_mode != "linked" || !segments ||
      strcmp(segments, "expandable") != 0)
    return;
  using DevFn = CUresult (*)(CUdevice);
  CUdevice dev;
  OK(api.device_get(&dev, 0));
  CUcontext pc = nullptr;
  OK(api.primary_retain(&pc, dev));
  OK(api.ctx_set_current(pc));
  auto past_the_gap = [] { std::this_thread::sleep_for(std::chrono::microseconds(200)); };
  CUdeviceptr old = 0;
  OK(api.mem_alloc(&old, 4096));
  for (int i = 0; i < 40; ++i) {  // marks, in events of this context
    CUdeviceptr x = 0;
    OK(api.mem_alloc(&x, 4096));
    OK(api.memset_async(x, 1, 4096, nullptr));
    OK(api.ctx_sync());
    past_the_gap();
    OK(api.mem_free(x));
  }
  OK(api.ctx_sync());
  OK(own<DevFn>("cuDevicePrimaryCtxReset_v2")(dev));  // unseen
  CUcontext again = nullptr;
  OK(api.primary_retain(&again, dev));
  OK(api.ctx_set_current(again));
  auto event_create =
      reinterpret_cast<decltype(&cuEventCreate)>(dlsym(RTLD_DEFAULT, "cuEventCreate"));
  auto event_query = reinterpret_cast<decltype(&cuEventQuery)>(dlsym(RTLD_DEFAULT, "cuEventQuery"));
  CHECK(event_create && event_query);
  CUevent events[32];
  for (CUevent& e : events) OK(event_create(&e, 0));  // the dead marks' handles among them
  CUdeviceptr y = 0;
  OK(own<decltype(&cuMemAlloc_v2)>("cuMemAlloc_v2")(&y, 8192));
  OK(api.memset_async(y, 2, 8192, nullptr));  // queued: an event recorded now is not ready
  StandinCounters c1 = snap();
  past_the_gap();
  OK(api.mem_free(old));
  StandinCounters c2 = snap();
  int recorded = 0;
  for (CUevent& e : events) recorded += event_query(e) == CUDA_ERROR_NOT_READY;
  fprintf(stderr, "marks after an unseen end: recorded %llu, the program's events touched %d\n",
          (unsigned long long)(c2.ctx_events - c1.ctx_events), recorded);
  CHECK_EQ(c2.ctx_events - c1.ctx_events, 0u);
  CHECK_EQ(recorded, 0);
  OK(api.ctx_sync());
  OK(own<decltype(&cuMemFree_v2)>("cuMemFree_v2")(y));
  OK(api.primary_release(dev));
  OK(api.primary_release(dev));
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
  lifetime_marks_unseen();
}

}  // namespace client
