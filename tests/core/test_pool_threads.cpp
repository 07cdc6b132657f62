// Many threads allocating and freeing the same sizes: no block is ever handed
// to two owners, frees from other threads are fine, and the counters add up.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/pool.hpp"
#include "fake_backend.hpp"

using namespace gpupool;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

TEST(PoolThreads, StressNoBlockHasTwoOwners) {
  auto dev = std::make_shared<FakeDevice>();
  dev->capacity = 1 << 22;  // small enough to hit out-of-memory now and then
  Pool pool({.shards = 4});
  ArenaOptions ao{.name = "a", .group = "g", .max_held = 1 << 21};
  Arena* arenas[2] = {pool.add_arena(std::make_unique<FakeBackend>(dev), ao),
                      pool.add_arena(std::make_unique<FakeBackend>(dev), ao)};
  std::mutex owners_mu;
  std::map<Handle, int> owners;
  std::atomic<bool> bad{false};
  constexpr int kThreads = 6;
  std::vector<std::thread> ts;
  // A block freed by one thread is often taken by another: pass half of each
  // thread's blocks to its neighbour through a shared queue.
  std::mutex handoff_mu;
  std::vector<Block*> handoff;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      std::mt19937 rng(t);
      std::vector<Block*> mine;
      for (int i = 0; i < 20000; ++i) {
        if (mine.size() < 16 && rng() % 2) {
          AllocResult r = pool.allocate(arenas[rng() % 2], 64 << (rng() % 10));
          if (r.status != BackendStatus::ok) continue;
          std::lock_guard lock(owners_mu);
          if (!owners.emplace(r.block->handle, t).second) bad = true;
          mine.push_back(r.block);
        } else if (!mine.empty()) {
          Block* b = mine.back();
          mine.pop_back();
          if (rng() % 4 == 0) {
            std::lock_guard lock(handoff_mu);
            handoff.push_back(b);
            continue;
          }
          {
            std::lock_guard lock(owners_mu);
            owners.erase(b->handle);
          }
          pool.free(b);
        }
        if (i % 1000 == 0) {
          if (t == 0) pool.free_held();
          std::vector<Block*> take;
          {
            std::lock_guard lock(handoff_mu);
            take.swap(handoff);
          }
          for (Block* b : take) {
            {
              std::lock_guard lock(owners_mu);
              owners.erase(b->handle);
            }
            pool.free(b);
          }
        }
      }
      for (Block* b : mine) {
        {
          std::lock_guard lock(owners_mu);
          owners.erase(b->handle);
        }
        pool.free(b);
      }
    });
  for (auto& t : ts) t.join();
  for (Block* b : handoff) pool.free(b);
  EXPECT_FALSE(bad) << "a block was handed to two owners";
  Stats s = pool.totals();
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.active_bytes, 0u);
  EXPECT_EQ(s.managed_bytes, s.held_bytes);
  EXPECT_EQ(dev->used, s.held_bytes) << "the backend holds exactly what the pool says it holds";
  EXPECT_EQ(s.backend_allocs - s.backend_frees, s.held_blocks);
  EXPECT_LE(s.held_bytes, std::uint64_t{1} << 21) << "the cap holds with concurrent frees";
  pool.free_held();
  EXPECT_EQ(dev->used, 0u);
}

// Threads come and go (thread pools, benchmark runners): a thread alive
// beside another must not be put on its shard while shards are free, or the
// two contend on one lock (seen as 2 threads running 3x slower than 1).
TEST(PoolThreads, ThreadsAliveTogetherGetDifferentShards) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 2});
  Arena* a = pool.add_arena(std::make_unique<FakeBackend>(dev), {.name = "a", .group = "g"});
  Block* mine = pool.allocate(a, 4096).block;
  ASSERT_NE(mine, nullptr);
  const unsigned main_shard = mine->shard;
  pool.free(mine);
  for (int i = 0; i < 8; ++i) {
    unsigned other = main_shard;
    std::thread([&] {
      Block* b = pool.allocate(a, 4096).block;
      other = b->shard;
      pool.free(b);
    }).join();
    EXPECT_NE(other, main_shard) << "thread " << i << " shares the main thread's shard";
  }
}

// The counters only grow while arenas come and go: an arena destroyed while
// totals() or snapshot() runs is counted once, as itself or in the retired
// totals, never in neither.
TEST(PoolThreads, CountersNeverGoBackwardsWhileArenasAreDestroyed) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 1});
  // The window is a few instructions wide: on a 2-core machine 100000
  // arenas hit it in 7 runs of 10 before totals() pinned first. Fewer in
  // the (Debug) sanitizer builds, which are 20 times slower.
#ifdef NDEBUG
  constexpr int kArenas = 100000;
#else
  constexpr int kArenas = 10000;
#endif
  std::atomic<bool> done{false};
  std::thread churn([&] {
    for (int i = 0; i < kArenas; ++i) {
      Arena* a = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g", .kind = "k"});
      Block* b = pool.allocate(a, 64).block;  // a miss
      pool.retire_arena(a);
      pool.forget(b);  // its last block: destroyed here
    }
    done = true;
  });
  std::uint64_t last_totals = 0, last_rows = 0;
  int backwards = 0;
  for (unsigned round = 0; !done; ++round) {
    const std::uint64_t t = pool.totals().misses;
    backwards += t < last_totals;
    last_totals = t;
    if (round % 16) continue;  // a snapshot costs more: the window comes less often
    Stats rows;
    for (const ArenaSnapshot& row : pool.snapshot()) rows += row.stats;
    backwards += rows.misses < last_rows;
    last_rows = rows.misses;
  }
  churn.join();
  EXPECT_EQ(backwards, 0) << "totals() or the snapshot's rows counted fewer misses than before";
  EXPECT_EQ(pool.totals().misses, std::uint64_t{kArenas});
}
