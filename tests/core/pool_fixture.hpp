// One pool with one arena on a fake device, as most core tests start.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "core/pool.hpp"
#include "fake_backend.hpp"

namespace gpupool::testing {

struct PoolFixture {
  std::shared_ptr<FakeDevice> dev = std::make_shared<FakeDevice>();
  Pool pool;
  Arena* arena;
  // The arena's group is "dev" unless ao names one; growth is timed by the
  // fake cost clock unless po brings its own.
  explicit PoolFixture(PoolOptions po = {}, ArenaOptions ao = {}) : pool(with_cost_clock(po)) {
    if (ao.group.empty()) ao.group = "dev";
    arena = pool.add_arena(std::make_unique<FakeBackend>(dev), ao);
  }
  static PoolOptions with_cost_clock(PoolOptions po) {
    if (!po.cost_clock) po.cost_clock = fake_cost_clock;
    return po;
  }
  Block* alloc(std::size_t n) {
    AllocResult r = pool.allocate(arena, n);
    EXPECT_EQ(r.status, BackendStatus::ok);
    return r.block;
  }
};

}  // namespace gpupool::testing
