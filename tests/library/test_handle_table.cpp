// The shim's handle tables (interpose/handle_table.hpp) against a model: a
// lost or stale entry would make the shim pass a pooled pointer to the driver
// or pool one it does not own.
#include <cstdint>
#include <random>
#include <unordered_map>

#include <gtest/gtest.h>

#include "interpose/handle_table.hpp"

namespace {

using gpupool::HandleTable;

int g_values[8];

// Random puts, replacements and erases of handles shaped like the APIs'
// (aligned, clustered), checking every live key after each erase: backward
// shifting across the end of the array and across runs of other homes is
// where an open-addressing erase goes wrong.
TEST(HandleTable, MatchesModel) {
  for (std::uint64_t align : {1ull, 512ull, 4096ull, 2ull << 20}) {
    std::mt19937_64 rng(align);
    HandleTable<int> t;
    std::unordered_map<std::uintptr_t, int*> model;
    const std::uintptr_t base = 0x7f0000000000ull;
    for (int step = 0; step < 20000; ++step) {
      const std::uintptr_t key = base + align * (rng() % 300);
      int* value = &g_values[rng() % 8];
      const unsigned op = rng() % 3;
      if (op < 2) {
        auto it = model.find(key);
        int* before = it == model.end() ? nullptr : it->second;
        ASSERT_EQ(t.put(key, value), before);
        model[key] = value;
      } else {
        auto it = model.find(key);
        int* before = it == model.end() ? nullptr : it->second;
        ASSERT_EQ(t.erase(key), before);
        model.erase(key);
        for (auto& [k, v] : model)
          ASSERT_EQ(t.find(k), v) << "key " << k << " lost at step " << step;
      }
      ASSERT_EQ(t.size(), model.size());
      ASSERT_EQ(t.find(key), model.count(key) ? model[key] : nullptr);
    }
    for (auto& [k, v] : model) ASSERT_EQ(t.erase(k), v);
    EXPECT_EQ(t.size(), 0u);
    EXPECT_EQ(t.find(base), nullptr);
  }
}

TEST(HandleTable, EmptyTable) {
  HandleTable<int> t;
  EXPECT_EQ(t.find(0x1000), nullptr);
  EXPECT_EQ(t.erase(0x1000), nullptr);
  EXPECT_EQ(t.size(), 0u);
}

}  // namespace
