// The pool against a reference model: thousands of random operation
// sequences (allocate, free, free_held, stop_holding, out-of-memory, error
// injection, a held-byte cap, fences, idle trimming) on three arenas in two
// groups. After every step the model and the pool must agree on which blocks
// the backend holds, on what each allocation returned, and on every counter.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "core/pool.hpp"
#include "fake_backend.hpp"

using namespace gpupool;
using gpupool::testing::fake_cost_clock;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

namespace {

std::uint64_t g_clock = 0;
// Advanced once per step, so the pool and the model stamp a free alike.
std::uint64_t fake_clock() { return g_clock; }

std::uint64_t g_grown = 0;     // fresh blocks the model allocated instead of waiting, all seeds
std::uint64_t g_unpaid = 0;    // waits because growth was not yet paid for, all seeds
std::uint64_t g_borrowed = 0;  // requests a larger bin's held block served, all seeds

// The model: the pool's documented behaviour, written as plainly as possible.
struct Model {
  struct MBlock {
    Handle handle;
    std::size_t size, requested;
    bool pooled;
    std::uint64_t fence, freed_at;
  };
  struct MArena {
    int group;
    std::size_t max_pooled, max_block, pending_growth;
    std::map<std::size_t, std::deque<MBlock>> bins;  // back = newest
    Stats s;
    std::map<std::size_t, std::int64_t> credit;  // per bin: time of its waits less its growths'
  };
  BinScheme scheme{4};
  bool holding = true;
  bool borrow = false;
  std::uint64_t release_after = 0;
  std::vector<MArena> arenas;
  std::vector<std::size_t> group_cap;
  std::uint64_t alloc_cost = 0, wait_cost = 0;       // what the pool's cost clock sees
  std::vector<std::shared_ptr<FakeDevice>> devices;  // the model's own devices, per group

  void note(Stats& s) {
    s.peak_active_blocks = std::max(s.peak_active_blocks, s.active_blocks);
    s.peak_active_bytes = std::max(s.peak_active_bytes, s.active_bytes);
    s.peak_held_blocks = std::max(s.peak_held_blocks, s.held_blocks);
    s.peak_held_bytes = std::max(s.peak_held_bytes, s.held_bytes);
    s.peak_managed_bytes = std::max(s.peak_managed_bytes, s.managed_bytes);
  }
  std::size_t group_held(int g) {
    std::size_t n = 0;
    for (auto& a : arenas)
      if (a.group == g) n += a.s.held_bytes;
    return n;
  }
  void unheld(MArena& a, const MBlock& b) {
    --a.s.held_blocks;
    a.s.held_bytes -= b.size;
  }
  void release(MArena& a, const MBlock& b) {
    FakeBackend(devices[a.group]).release(b.handle, b.size, FakeBackend::record_of(b.handle));
    ++a.s.backend_frees;
    a.s.managed_bytes -= b.size;
  }

  std::size_t release_for_oom(int ai, std::size_t wanted) {
    std::size_t released = 0;
    std::vector<std::vector<int>> tiers(3);
    for (int i = 0; i < int(arenas.size()); ++i)
      tiers[i == ai ? 0 : arenas[i].group == arenas[ai].group ? 1 : 2].push_back(i);
    for (auto& tier : tiers) {
      while (released < wanted) {
        int best = -1;
        std::size_t best_bin = 0, best_size = 0;
        for (int i : tier)
          for (auto it = arenas[i].bins.rbegin(); it != arenas[i].bins.rend(); ++it)
            if (!it->second.empty()) {
              if (it->second.back().size > best_size) {
                best = i, best_bin = it->first, best_size = it->second.back().size;
              }
              break;
            }
        if (best < 0) break;
        auto& q = arenas[best].bins[best_bin];
        MBlock v = q.front();
        q.pop_front();
        unheld(arenas[best], v);
        released += v.size;
        release(arenas[best], v);
      }
      if (released >= wanted) break;
    }
    return released;
  }

  // Returns {status, handle}.
  std::pair<BackendStatus, MBlock> allocate(int ai, std::size_t size) {
    MArena& a = arenas[ai];
    FakeDevice& dev = *devices[a.group];
    const bool pooled = size <= a.max_pooled && size <= a.max_block;
    const std::size_t bin = scheme.bin_number(size);
    const std::size_t want = pooled ? scheme.rounded(size, a.max_block) : size;
    FakeBackend be(devices[a.group]);
    bool grown = false;
    BackendResult r;
    // The newest block of a non-empty bin if the device is done with it,
    // else the oldest if that one is.
    auto take_ready = [&](std::deque<MBlock>& q, MBlock* b) {
      auto ready = [&](const MBlock& m) { return m.fence == 0 || m.fence <= dev.completed; };
      if (ready(q.back())) {
        *b = q.back();
        q.pop_back();
      } else if (ready(q.front())) {
        *b = q.front();
        q.pop_front();
      } else {
        return false;
      }
      return true;
    };
    if (pooled && a.bins.count(bin) && !a.bins[bin].empty()) {
      auto& q = a.bins[bin];
      MBlock b;
      if (take_ready(q, &b)) return hit(a, b, size);
      if (q.size() < kMaxPendingBlocks && q.size() * q.back().size + want <= a.pending_growth &&
          a.credit[bin] >= 0 && (r = be.allocate(want, 0)).status == BackendStatus::ok) {
        grown = true;  // a fresh block instead of waiting; no held memory released for it
        a.credit[bin] -= std::int64_t(alloc_cost);
        ++g_grown;
      } else {
        if (a.credit[bin] < 0) ++g_unpaid;
        ++dev.waits;
        dev.completed = dev.issued;
        ++a.s.fence_waits;
        a.s.fence_wait_ns += wait_cost;
        a.credit[bin] += std::int64_t(wait_cost);
        b = q.back();
        q.pop_back();
      }
      if (!grown) return hit(a, b, size);
    }
    // Its bin empty: a ready held block of a larger bin, under twice the
    // size, serves it (the smallest such bin first).
    if (borrow && pooled && !grown && (!a.bins.count(bin) || a.bins[bin].empty())) {
      const std::size_t last = scheme.bin_number(2 * want);
      for (auto it = a.bins.upper_bound(bin); it != a.bins.end() && it->first < last; ++it) {
        MBlock b;
        if (it->second.empty() || !take_ready(it->second, &b)) continue;
        ++g_borrowed;
        return hit(a, b, size);
      }
    }
    if (!grown) r = miss_allocate(ai, want);
    bool exact = false;
    if (!grown && r.status == BackendStatus::out_of_memory && size < want) {
      r = be.allocate(size, 0);
      exact = r.status == BackendStatus::ok;
    }
    ++a.s.misses;
    if (r.status != BackendStatus::ok) return {r.status, {}};
    MBlock b{r.handle, exact ? size : want, size, pooled && !exact, 0, 0};
    ++a.s.backend_allocs;
    a.s.managed_bytes += b.size;
    ++a.s.active_blocks;
    a.s.active_bytes += size;
    note(a.s);
    return {BackendStatus::ok, b};
  }

  std::pair<BackendStatus, MBlock> hit(MArena& a, MBlock b, std::size_t size) {
    unheld(a, b);
    b.requested = size;
    ++a.s.hits;
    ++a.s.active_blocks;
    a.s.active_bytes += size;
    note(a.s);
    return {BackendStatus::ok, b};
  }

  // The driver, with release of held blocks (largest first) on out-of-memory.
  BackendResult miss_allocate(int ai, std::size_t want) {
    MArena& a = arenas[ai];
    FakeBackend be(devices[a.group]);
    BackendResult r = be.allocate(want, 0);
    std::size_t released = 0;
    while (r.status == BackendStatus::out_of_memory) {
      std::size_t n = release_for_oom(ai, std::max<std::size_t>(released, 1));
      if (!n) break;
      released += n;
      ++a.s.oom_retries;
      r = be.allocate(want, 0);
    }
    return r;
  }

  void free(int ai, MBlock b) {
    MArena& a = arenas[ai];
    FakeDevice& dev = *devices[a.group];
    --a.s.active_blocks;
    a.s.active_bytes -= b.requested;
    if (b.pooled && b.size > group_cap[a.group]) b.pooled = false;
    if (!b.pooled || !holding) return release(a, b);
    b.fence = dev.fences ? ++dev.issued : 0;
    b.freed_at = fake_clock();
    a.bins[scheme.bin_number(b.size)].push_back(b);  // its own bin, also when borrowed
    ++a.s.held_blocks;
    a.s.held_bytes += b.size;
    if (b.fence) ++a.s.pending_frees;
    note(a.s);
    int g = a.group;
    while (group_held(g) > group_cap[g]) {
      int oa = -1;
      std::size_t obin = 0;
      std::uint64_t oldest = UINT64_MAX;
      for (int i = 0; i < int(arenas.size()); ++i) {
        if (arenas[i].group != g) continue;
        for (auto& [bin, q] : arenas[i].bins)
          if (!q.empty() && q.front().freed_at < oldest)
            oldest = q.front().freed_at, oa = i, obin = bin;
      }
      auto& q = arenas[oa].bins[obin];
      MBlock v = q.front();
      q.pop_front();
      unheld(arenas[oa], v);
      ++arenas[oa].s.trims;
      release(arenas[oa], v);
    }
  }

  void free_held() {
    for (auto& a : arenas) {
      for (auto& [bin, q] : a.bins)
        for (auto& b : q) {
          unheld(a, b);
          release(a, b);
        }
      a.bins.clear();
    }
  }

  void trim(std::uint64_t now) {
    if (!release_after) return;
    for (auto& a : arenas)
      for (auto& [bin, q] : a.bins)
        while (!q.empty() && q.front().freed_at + release_after <= now) {
          MBlock v = q.front();
          q.pop_front();
          unheld(a, v);
          ++a.s.trims;
          release(a, v);
        }
  }
};

void expect_same(const Stats& model, const Stats& pool, const char* what, int seed, int step) {
  ASSERT_EQ(model, pool) << what << " differ at seed " << seed << " step " << step
                         << ": model held " << model.held_blocks << "/" << model.held_bytes
                         << " active " << model.active_blocks << "/" << model.active_bytes
                         << " managed " << model.managed_bytes << " hits " << model.hits
                         << " misses " << model.misses << " oom " << model.oom_retries << " trims "
                         << model.trims << " waits " << model.fence_waits << "; pool held "
                         << pool.held_blocks << "/" << pool.held_bytes << " active "
                         << pool.active_blocks << "/" << pool.active_bytes << " managed "
                         << pool.managed_bytes << " hits " << pool.hits << " misses " << pool.misses
                         << " oom " << pool.oom_retries << " trims " << pool.trims << " waits "
                         << pool.fence_waits;
}

Stats g_seen;  // what all seeds exercised together

void run_seed(int seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](std::size_t n) { return std::size_t(rng() % n); };

  // Scenario knobs drawn per seed.
  const bool fences = pick(2);
  const std::size_t capacity = pick(3) == 0 ? SIZE_MAX : 1 << (14 + pick(6));
  const std::size_t cap = pick(3) == 0 ? 1 << (10 + pick(8)) : SIZE_MAX;
  const std::uint64_t release_after = pick(3) == 0 ? 5 + pick(50) : 0;
  const std::size_t max_pooled = pick(4) == 0 ? 1 << (8 + pick(6)) : SIZE_MAX;
  const std::size_t max_block = pick(4) == 0 ? 3000 + pick(30000) : SIZE_MAX;
  // Growth budgets: none, a power of two, or whole blocks of one bin (so
  // that "pending blocks and the new one fit exactly" happens).
  const std::size_t block_sizes[] = {100, 4096, 10000, 65536};
  const std::size_t growth_draw = pick(3);
  const std::size_t pending_growth =
      growth_draw == 0   ? 0
      : growth_draw == 1 ? std::size_t{1} << (8 + pick(14))
                         : BinScheme(4).rounded(block_sizes[pick(4)]) * (1 + pick(4));

  // What a growth and a wait cost: growth once per bin (no wait pays it), or
  // after one or more waits.
  const std::uint64_t alloc_cost = pick(4), wait_cost = pick(3);

  g_clock = 0;
  PoolOptions po;
  po.shards = 1 + pick(4);
  po.clock = fake_clock;
  po.cost_clock = fake_cost_clock;
  po.release_after_ns = release_after;
  po.borrow_larger = pick(4) != 0;
  Pool pool(po);

  Model m;
  m.borrow = po.borrow_larger;
  m.release_after = release_after;
  m.group_cap = {cap, SIZE_MAX};
  m.alloc_cost = alloc_cost;
  m.wait_cost = wait_cost;
  std::vector<std::shared_ptr<FakeDevice>> real_dev, model_dev;
  for (int g = 0; g < 2; ++g) {
    for (auto* v : {&real_dev, &model_dev}) {
      v->push_back(std::make_shared<FakeDevice>());
      v->back()->capacity = capacity;
      v->back()->fences = fences;
      v->back()->alloc_cost = alloc_cost;
      v->back()->wait_cost = wait_cost;
    }
  }
  m.devices = model_dev;
  const int groups[3] = {0, 0, 1};
  std::vector<Arena*> arenas;
  for (int i = 0; i < 3; ++i) {
    ArenaOptions ao;
    ao.name = "arena" + std::to_string(i);
    ao.group = "g" + std::to_string(groups[i]);
    ao.max_pooled = max_pooled;
    ao.max_block = max_block;
    ao.max_held = groups[i] == 0 ? cap : SIZE_MAX;
    ao.pending_growth = pending_growth;
    arenas.push_back(pool.add_arena(std::make_unique<FakeBackend>(real_dev[groups[i]]), ao));
    m.arenas.push_back({groups[i], max_pooled, max_block, pending_growth, {}, {}, {}});
  }

  struct Live {
    int arena;
    Block* block;
    Model::MBlock mb;
  };
  std::vector<Live> live;
  const std::size_t sizes[] = {1, 7, 16, 100, 512, 1000, 4096, 4500, 10000, 65536, 100000};

  const bool trace =
      std::getenv("MODEL_TRACE_SEED") && std::atoi(std::getenv("MODEL_TRACE_SEED")) == seed;
  if (trace)
    std::printf("cap %zu capacity %zu release_after %lu max_pooled %zu max_block %zu fences %d\n",
                cap, capacity, (unsigned long)release_after, max_pooled, max_block, fences);
  for (int step = 0; step < 300; ++step) {
    const std::size_t op = pick(100);
    ++g_clock;
    if (trace) std::printf("step %d op %zu live %zu\n", step, op, live.size());
    if (op < 50) {
      const int ai = int(pick(3));
      std::size_t size = sizes[pick(std::size(sizes))];
      if (pick(4) == 0) size += pick(300);
      if (pick(20) == 0) {
        const int err = -int(1 + pick(50));
        real_dev[groups[ai]]->inject_error = err;
        model_dev[groups[ai]]->inject_error = err;
      }
      AllocResult r = pool.allocate(arenas[ai], size);
      auto [mstatus, mb] = m.allocate(ai, size);
      ASSERT_EQ(int(r.status), int(mstatus)) << "seed " << seed << " step " << step;
      if (r.status == BackendStatus::ok) {
        ASSERT_EQ(r.block->handle, mb.handle) << "seed " << seed << " step " << step;
        ASSERT_EQ(r.block->size, mb.size);
        ASSERT_EQ(r.block->requested, size);
        ASSERT_GE(r.block->size, size);
        live.push_back({ai, r.block, mb});
      } else if (r.status == BackendStatus::error) {
        ASSERT_LT(r.error, 0) << "the backend's own error comes back unchanged";
      }
    } else if (op < 90 && !live.empty()) {
      const std::size_t i = pick(live.size());
      pool.free(live[i].block);
      m.free(live[i].arena, live[i].mb);
      live.erase(live.begin() + long(i));
    } else if (op < 93) {
      pool.free_held();
      m.free_held();
    } else if (op < 94) {
      pool.stop_holding();
      m.holding = false;
      m.free_held();
    } else if (op < 97) {
      // The device catches up with some of the work.
      for (int g = 0; g < 2; ++g) {
        const std::uint64_t behind = pick(3);
        for (auto* v : {&real_dev, &model_dev}) {
          FakeDevice& d = *(*v)[g];
          d.completed = std::max(d.completed, d.issued - std::min(d.issued, behind));
        }
      }
    } else {
      const std::uint64_t now = fake_clock();
      pool.trim_idle(now);
      m.trim(now);
    }
    for (int i = 0; i < 3; ++i)
      expect_same(m.arenas[i].s, arenas[i]->stats(), arenas[i]->options().name.c_str(), seed, step);
    for (int g = 0; g < 2; ++g) {
      ASSERT_EQ(real_dev[g]->live, model_dev[g]->live)
          << "backend memory differs, seed " << seed << " step " << step;
      ASSERT_EQ(real_dev[g]->waits, model_dev[g]->waits);
    }
    // Live blocks of one device never share a handle.
    for (std::size_t i = 0; i < live.size(); ++i)
      for (std::size_t j = i + 1; j < live.size(); ++j)
        if (groups[live[i].arena] == groups[live[j].arena]) {
          ASSERT_NE(live[i].block->handle, live[j].block->handle)
              << "seed " << seed << " step " << step << " arenas " << live[i].arena << ","
              << live[j].arena;
        }
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (auto& l : live) pool.free(l.block);
  g_seen += pool.totals();
}

}  // namespace

TEST(PoolModel, RandomSequencesAgreeWithTheModel) {
  for (int seed = 1; seed <= 3000; ++seed) {
    run_seed(seed);
    if (HasFatalFailure()) return;
  }
  // The sequences must actually reach every mechanism.
  EXPECT_GT(g_seen.hits, 5000u);
  EXPECT_GT(g_seen.oom_retries, 100u);
  EXPECT_GT(g_seen.trims, 100u);
  EXPECT_GT(g_seen.fence_waits, 100u);
  EXPECT_GT(g_seen.pending_frees, 1000u);
  EXPECT_GT(g_grown, 1000u);
  EXPECT_GT(g_unpaid, 100u);
  EXPECT_GT(g_borrowed, 1000u);  // the sequences exercise borrowing
}
