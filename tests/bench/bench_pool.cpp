// The pool's own speed: the warm alloc+free pair (the product's main speed
// figure), its scaling with threads, and the miss path with a backend that
// costs nothing. The GPU harness's suite runs it (scripts/gpu/harness.sh).
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <memory>

#include "core/pool.hpp"

using namespace gpupool;

namespace {

// Hands out distinct handles and nothing else, so only the pool is measured.
class NullBackend : public Backend {
 public:
  BackendResult allocate(std::size_t, std::uint64_t) override {
    return {BackendStatus::ok, next_.fetch_add(4096, std::memory_order_relaxed), 0};
  }
  void release(Handle, std::size_t, void*) override {}

 private:
  std::atomic<Handle> next_{4096};
};

// The timed loop of the pair benchmarks: allocate `size` bytes, free them.
void pairs(benchmark::State& state, Pool& pool, Arena* arena, std::size_t size) {
  for (auto _ : state) {
    Block* b = pool.allocate(arena, size).block;
    benchmark::DoNotOptimize(b);
    pool.free(b);
  }
  state.SetItemsProcessed(state.iterations());
}

struct Shared {
  Pool pool;
  Arena* arena;
  Shared() {
    arena = pool.add_arena(std::make_unique<NullBackend>(), {.name = "bench", .group = "bench"});
  }
};

Shared& shared() {
  static Shared s;
  return s;
}

// Every thread allocates and frees the same size: the case a per-bin lock
// would serialise.
void BM_WarmPair(benchmark::State& state) {
  Shared& s = shared();
  const std::size_t size = std::size_t(state.range(0));
  s.pool.free(s.pool.allocate(s.arena, size).block);  // warm this thread's bin
  pairs(state, s.pool, s.arena, size);
}
BENCHMARK(BM_WarmPair)->Arg(4096)->ThreadRange(1, 16)->UseRealTime();

// Several blocks live at once, as an array library's temporaries are.
void BM_WarmBatch8(benchmark::State& state) {
  Shared& s = shared();
  Block* blocks[8];
  for (auto _ : state) {
    for (int i = 0; i < 8; ++i) blocks[i] = s.pool.allocate(s.arena, 1024u << i).block;
    for (int i = 0; i < 8; ++i) s.pool.free(blocks[i]);
  }
  state.SetItemsProcessed(state.iterations() * 8);
}
BENCHMARK(BM_WarmBatch8)->ThreadRange(1, 16)->UseRealTime();

// Miss path: holding stopped, so every pair reaches the backend.
void BM_MissPair(benchmark::State& state) {
  static Pool pool({.hold = false});
  static Arena* arena =
      pool.add_arena(std::make_unique<NullBackend>(), {.name = "miss", .group = "miss"});
  pairs(state, pool, arena, 4096);
}
BENCHMARK(BM_MissPair)->ThreadRange(1, 16)->UseRealTime();

// Maps granules of 2 MiB into one reserved range, and costs nothing.
class NullRangeBackend : public NullBackend {
 public:
  std::size_t granule() override { return std::size_t{2} << 20; }
  BackendResult reserve(std::size_t) override { return {BackendStatus::ok, Handle{1} << 44, 0}; }
  BackendResult map(Handle, std::size_t, void*) override { return {BackendStatus::ok, 0, 0}; }
};

// The warm pair of a range's pieces (GPUPOOL_SEGMENTS=expandable, requests
// of 1 MiB and more): every thread frees and allocates the same size.
void BM_WarmRangePair(benchmark::State& state) {
  static Pool pool;
  static Arena* arena = pool.add_arena(
      std::make_unique<NullRangeBackend>(),
      {.name = "range", .group = "range", .split_min = std::size_t{1} << 20, .expandable = true});
  const std::size_t size = std::size_t(state.range(0));
  pool.free(pool.allocate(arena, size).block);  // warm
  pairs(state, pool, arena, size);
}
BENCHMARK(BM_WarmRangePair)->Arg(4 << 20)->ThreadRange(1, 16)->UseRealTime();

// Safe reuse (GPUPOOL_REUSE's default), as the CUDA shim fences: a block
// freed in epoch E is ready once a whole-device wait that began at E or
// later has ended, and such a wait costs what one of the shim's took on
// an idle H200 (kWaitNs, spun: 1.2 us a pair of a loop that waited every
// time, cuCtxSynchronize alone 0.48 us). Waits are not shared between
// threads here, as the shim's partly are.
constexpr std::uint64_t kWaitNs = 1200;
// What the shim lets pending blocks take: 2% of an H200's memory.
constexpr std::size_t kPendingGrowth = std::size_t{2867} << 20;
// And a thread slot per hardware thread of an H200 machine's, as the bounds
// of growth are per slot.
constexpr PoolOptions kH200Slots{.shards = 16};
template <class Base>
class Fenced : public Base {
 public:
  std::uint64_t fence() override { return next_.load(std::memory_order_seq_cst); }
  bool passed(std::uint64_t f) override {
    return f == 0 || done_.load(std::memory_order_acquire) >= f;
  }
  void wait_all() override {
    const std::uint64_t s = next_.fetch_add(1, std::memory_order_seq_cst);
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kWaitNs);
    while (std::chrono::steady_clock::now() < until) {
    }
    std::uint64_t cur = done_.load(std::memory_order_relaxed);
    while (cur < s && !done_.compare_exchange_weak(cur, s, std::memory_order_release)) {
    }
  }

 private:
  std::atomic<std::uint64_t> next_{1}, done_{0};
};

// Every thread's warm pair, its blocks fenced; thread 0's view of all
// threads' waits while it ran, and the most the arena took so far.
void fenced_pairs(benchmark::State& state, Pool& pool, Arena* arena) {
  const std::size_t size = std::size_t(state.range(0));
  const std::uint64_t waits = pool.totals().fence_waits;
  pairs(state, pool, arena, size);
  if (state.thread_index() == 0) {
    const Stats t = pool.totals();
    state.counters["waits_per_pair"] =
        double(t.fence_waits - waits) / double(state.iterations() * state.threads());
    state.counters["peak_managed_MiB"] = double(t.peak_managed_bytes >> 20);
  }
}

// Binned blocks of one size.
void BM_WarmPairFenced(benchmark::State& state) {
  static Pool pool(kH200Slots);
  static Arena* arena =
      pool.add_arena(std::make_unique<Fenced<NullBackend>>(),
                     {.name = "fenced", .group = "fenced", .pending_growth = kPendingGrowth});
  fenced_pairs(state, pool, arena);
}
BENCHMARK(BM_WarmPairFenced)->Arg(4 << 20)->ThreadRange(1, 16)->UseRealTime();

// The same for a range's pieces.
void BM_WarmRangePairFenced(benchmark::State& state) {
  static Pool pool(kH200Slots);
  static Arena* arena = pool.add_arena(std::make_unique<Fenced<NullRangeBackend>>(),
                                       {.name = "range-fenced",
                                        .group = "range-fenced",
                                        .pending_growth = kPendingGrowth,
                                        .split_min = std::size_t{1} << 20,
                                        .expandable = true});
  fenced_pairs(state, pool, arena);
}
BENCHMARK(BM_WarmRangePairFenced)->Arg(4 << 20)->ThreadRange(1, 16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
