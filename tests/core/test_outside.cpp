// Memory a backend holds outside the pool (core/outside.hpp: a driver's
// memory pool that gpupool manages) is held memory like held blocks: every
// release path gives it back, it counts in the group's held bytes and the
// stats, and nothing is given back once its arena is retired.
#include <gtest/gtest.h>

#include <memory>

#include "core/arena.hpp"
#include "core/pool.hpp"
#include "fake_backend.hpp"

using namespace gpupool;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::uint64_t g_now = 0;
std::uint64_t test_clock() { return g_now; }

// What the driver's pool keeps (`kept`), of which `stuck` it cannot give
// back (frees not yet executed); last used at `used_at`.
struct DriverPool final : Backend, HeldOutside {
  std::size_t kept = 0, stuck = 0, in_use = 0, give_backs = 0, peak_resets = 0;
  std::uint64_t used_at = 0;
  BackendResult allocate(std::size_t, std::uint64_t) override { return {}; }
  void release(Handle, std::size_t, void*) override { ADD_FAILURE() << "not a block"; }
  HeldOutside* outside() override { return this; }
  std::size_t held() override { return kept - stuck; }
  std::uint64_t last_use_ns() override { return used_at; }
  std::size_t give_back() override {
    ++give_backs;
    const std::size_t n = kept - stuck;
    kept = stuck;
    return n;
  }
  void add_counters(Stats& s) override {
    s.held_bytes += kept;
    s.active_bytes += in_use;
    s.managed_bytes += kept + in_use;
  }
  void reset_peaks() override { ++peak_resets; }
};

struct Fixture {
  std::shared_ptr<FakeDevice> dev = std::make_shared<FakeDevice>();
  Pool pool{PoolOptions{.clock = test_clock}};
  Arena* blocks = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  DriverPool* driver_pool = new DriverPool;
  Arena* outside =
      pool.add_arena(std::unique_ptr<Backend>(driver_pool), {.group = "g", .kind = "async"});
};

}  // namespace

TEST(Outside, CountsInTheStatsAndTheGroupsHeldBytes) {
  Fixture f;
  f.driver_pool->kept = 6 * MiB;
  f.driver_pool->in_use = 2 * MiB;
  f.pool.free(f.pool.allocate(f.blocks, MiB).block);
  EXPECT_EQ(f.pool.group_releasable("g"), 7 * MiB);
  const Stats s = f.pool.group_totals("g");
  EXPECT_EQ(s.held_bytes, 7 * MiB);
  EXPECT_EQ(s.active_bytes, 2 * MiB);
  EXPECT_EQ(s.managed_bytes, 9 * MiB);
  EXPECT_EQ(f.outside->stats().managed_bytes, 8 * MiB);
}

TEST(Outside, FreeHeldAndARequestGiveItBack) {
  Fixture f;
  f.driver_pool->kept = 6 * MiB;
  f.pool.free_held();
  EXPECT_EQ(f.driver_pool->kept, 0u);
  EXPECT_EQ(f.outside->stats().backend_frees, 1u);
  f.driver_pool->kept = 8 * MiB;
  f.pool.free(f.pool.allocate(f.blocks, MiB).block);
  // Largest first: the pool's 8 MiB covers 3 MiB; the block stays.
  EXPECT_EQ(f.pool.release_group("g", 3 * MiB), 8 * MiB);
  EXPECT_EQ(f.pool.group_releasable("g"), MiB);
}

TEST(Outside, WhatCannotBeGivenBackEndsTheLoops) {
  Fixture f;
  f.driver_pool->kept = 6 * MiB;
  f.driver_pool->stuck = 2 * MiB;
  EXPECT_EQ(f.pool.release_group("g", SIZE_MAX), 4 * MiB);
  f.pool.free_held();  // returns: nothing more is offered
  EXPECT_EQ(f.driver_pool->kept, 2 * MiB);
}

TEST(Outside, IdleSinceItsLastUse) {
  Fixture f;
  f.driver_pool->kept = 6 * MiB;
  f.driver_pool->used_at = 100;
  g_now = 150;
  EXPECT_EQ(f.pool.release_idle("g", 100), 0u);  // used 50 ago
  g_now = 250;
  std::size_t items = 0;
  EXPECT_EQ(f.pool.release_idle("g", 100, &items), 6 * MiB);
  EXPECT_EQ(items, 1u);
  EXPECT_EQ(f.outside->stats().trims, 1u);
}

TEST(Outside, ARetiredArenaGivesNothingBack) {
  Fixture f;
  f.driver_pool->kept = 6 * MiB;
  f.pool.retire_arena(f.outside);  // the driver's pool is gone
  f.pool.free_held();
  EXPECT_EQ(f.pool.group_releasable("g"), 0u);
}

// The driver's pool keeps its own peaks (its high-water marks): the pool's
// reset_peaks asks it to reset them.
TEST(Outside, ResetPeaksAsksTheDriversPool) {
  Fixture f;
  f.pool.reset_peaks();
  EXPECT_EQ(f.driver_pool->peak_resets, 1u);
}
