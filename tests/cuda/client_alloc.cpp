// Scenarios of blocks served and reused: the driver sees fewer allocations
// when pooled, and live blocks never overlap and keep their contents.
#include <stdio.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "client.hpp"

namespace client {

namespace {

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

}  // namespace

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
  if (g_ordered) {
    // Ordered on the device instead: the one block, and no wait.
    CHECK_EQ(grown, 1u);
    CHECK_EQ(waits, 0u);
  } else if (g_growth) {
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

}  // namespace client
