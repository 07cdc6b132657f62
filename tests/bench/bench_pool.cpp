// The pool's own speed: the warm alloc+free pair (the product's main speed
// figure), its scaling with threads, and the miss path with a backend that
// costs nothing. The GPU harness's suite runs it (scripts/gpu/harness.sh).
#include <benchmark/benchmark.h>

#include <atomic>
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
  for (auto _ : state) {
    Block* b = s.pool.allocate(s.arena, size).block;
    benchmark::DoNotOptimize(b);
    s.pool.free(b);
  }
  state.SetItemsProcessed(state.iterations());
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
  for (auto _ : state) {
    Block* b = pool.allocate(arena, 4096).block;
    benchmark::DoNotOptimize(b);
    pool.free(b);
  }
  state.SetItemsProcessed(state.iterations());
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
  for (auto _ : state) {
    Block* b = pool.allocate(arena, size).block;
    benchmark::DoNotOptimize(b);
    pool.free(b);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_WarmRangePair)->Arg(4 << 20)->ThreadRange(1, 16)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
