// The release policies on their own (core/release.hpp), over arenas a pool
// made and filled: the one victim picker looks at both caches of every
// arena it is given, and each policy is a loop over what it picks.
#include <gtest/gtest.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "alloc_failure.hpp"
#include "core/arena.hpp"
#include "core/release.hpp"
#include "fake_backend.hpp"

using namespace gpupool;
using namespace gpupool::core_detail;
using gpupool::testing::DroppingBackend;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::uint64_t g_now = 0;
std::uint64_t test_clock() { return g_now; }

// Two arenas of one group on one device: `split` serves 1 MiB and more from
// segments, `binned` only has bins. Blocks are freed at the times given.
struct Two {
  std::shared_ptr<FakeDevice> dev = std::make_shared<FakeDevice>();
  Pool pool{PoolOptions{.clock = test_clock}};
  Arena* split =
      pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g", .split_min = MiB});
  Arena* binned = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  Handle free_at(Arena* a, std::size_t size, std::uint64_t t) {
    Block* b = pool.allocate(a, size).block;
    const Handle h = b->handle;
    g_now = t;
    pool.free(b);
    return h;
  }
};

}  // namespace

TEST(Release, ThePickerLooksAtBothCachesOfEveryArena) {
  Two f;
  const Handle segment = f.free_at(f.split, 2 * MiB, 20);  // a wholly free 2 MiB segment
  f.free_at(f.split, 4096, 10);
  const Handle oldest = f.free_at(f.binned, 8192, 5);
  f.free_at(f.binned, 100, 30);
  Arena* both[] = {f.split, f.binned};

  const Victim largest = pick_victim(both, Victims::largest);
  EXPECT_EQ(largest.arena, f.split);
  EXPECT_EQ(largest.offer.cache, f.split->segments());
  EXPECT_EQ(largest.offer.size, 2 * MiB);

  const Victim first_freed = pick_victim(both, Victims::oldest);
  EXPECT_EQ(first_freed.arena, f.binned);
  EXPECT_EQ(first_freed.offer.freed_at_ns, 5u);

  // What the picker offers is what its cache hands over.
  const Held item = first_freed.offer.cache->take_offered(first_freed.offer);
  EXPECT_EQ(item.handle, oldest);
  f.binned->let_go(item, /*drop=*/false);
  EXPECT_FALSE(f.dev->live.count(oldest));
  EXPECT_TRUE(f.dev->live.count(segment));
}

// Of equal items the first arena's wins, and in an arena a wholly free
// segment before a held block.
TEST(Release, ThePickerKeepsTheFirstOfEquals) {
  Two f;
  f.free_at(f.split, 2 * MiB, 7);
  f.free_at(f.split, 4096, 7);
  f.free_at(f.binned, 2 * MiB, 7);  // a block of the 2 MiB bin
  Arena* split_first[] = {f.split, f.binned};
  Arena* binned_first[] = {f.binned, f.split};
  EXPECT_EQ(pick_victim(split_first, Victims::largest).arena, f.split);
  EXPECT_EQ(pick_victim(binned_first, Victims::largest).arena, f.binned);
  const Victim oldest = pick_victim(split_first, Victims::oldest);
  EXPECT_EQ(oldest.arena, f.split);
  EXPECT_EQ(oldest.offer.cache, f.split->segments());
  EXPECT_EQ(pick_victim(binned_first, Victims::oldest).arena, f.binned);
}

// An arena being retired still holds what retire_arena has not dropped yet:
// memory its driver already freed, never to be released again.
TEST(Release, ARetiredArenaIsNeverPicked) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool{PoolOptions{.clock = test_clock}};
  auto backend = std::make_unique<DroppingBackend>(dev);
  DroppingBackend* hook = backend.get();
  Arena* dying = pool.add_arena(std::move(backend), {.group = "g", .split_min = MiB});
  Arena* alive = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  pool.free(pool.allocate(dying, 16384).block);
  pool.free(pool.allocate(dying, 2 * MiB).block);  // still held at the first drop
  pool.free(pool.allocate(alive, 8192).block);
  Arena* both[] = {dying, alive};
  Victim largest, oldest;
  hook->on_drop = [&] {
    largest = pick_victim(both, Victims::largest);
    oldest = pick_victim(both, Victims::oldest);
  };
  pool.retire_arena(dying);
  EXPECT_EQ(largest.arena, alive);
  EXPECT_EQ(oldest.arena, alive);
}

// Idleness gives back what main's idle trim did, in the same order: each
// arena's wholly free segments while it is scanned, largest first; then the
// held blocks of all the arenas, largest first.
TEST(Release, FreedByGivesBackSegmentsWhileScanningThenBlocksLargestFirst) {
  Two f;
  const Handle small_segment = f.free_at(f.split, 2 * MiB, 10);
  const Handle large_segment = f.free_at(f.split, 6 * MiB, 10);
  const Handle split_block = f.free_at(f.split, 16384, 10);  // under split_min: a block
  const Handle big_block = f.free_at(f.binned, 64 * MiB, 10);
  const Handle small_block = f.free_at(f.binned, 4096, 10);
  const Handle recent = f.free_at(f.binned, 8192, 50);
  Arena* binned_first[] = {f.binned, f.split};
  std::size_t items = 0;
  EXPECT_EQ(release_freed_by(binned_first, 10, &items), 8 * MiB + 16384 + 64 * MiB + 4096);
  EXPECT_EQ(items, 5u);
  EXPECT_EQ(f.dev->release_log, (std::vector<Handle>{large_segment, small_segment, big_block,
                                                     split_block, small_block}));
  EXPECT_TRUE(f.dev->live.count(recent));
  EXPECT_EQ(f.split->stats().trims + f.binned->stats().trims, 5u);
}

// An allocation that fails while idle items are taken out of the caches
// loses none of them: each is given back or still held, and the counters,
// the cap and the device agree.
TEST(Release, FreedByLosesNothingWhenAnAllocationFails) {
  bool failed_once = false;
  for (int n = 1;; ++n) {
    auto dev = std::make_shared<FakeDevice>();
    Pool pool{PoolOptions{.shards = 2, .clock = test_clock}};
    const ArenaOptions capped{.group = "g", .max_held = 1024 * MiB};
    Arena* arenas[] = {
        pool.add_arena(std::make_unique<FakeBackend>(dev), capped),
        pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g", .split_min = MiB})};
    for (Arena* a : arenas)
      for (std::size_t size : {std::size_t{4096}, std::size_t{100000}, 3 * MiB, 5 * MiB}) {
        Block* x = pool.allocate(a, size).block;
        Block* y = pool.allocate(a, size).block;
        g_now = 10;
        pool.free(x);
        pool.free(y);
      }
    dev->release_log.reserve(64);  // the fake's own bookkeeping must not fail
    bool failed = false;
    {
      gpupool::testing::FailNthAllocation fail(n);
      try {
        release_freed_by(arenas, 10, nullptr);
      } catch (const std::bad_alloc&) {
      }
      failed = fail.failed();
    }
    const Stats s = pool.totals();
    EXPECT_EQ(s.managed_bytes, s.held_bytes) << "allocation " << n << " failed: an item is lost";
    EXPECT_EQ(dev->used, s.managed_bytes) << "allocation " << n;
    EXPECT_EQ(arenas[0]->group().cap.held_bytes.load(), s.held_bytes) << "allocation " << n;
    pool.free_held();
    EXPECT_EQ(dev->used, 0u) << "allocation " << n;
    if (!failed) break;  // past the trim's last allocation
    failed_once = true;
  }
  EXPECT_TRUE(failed_once);
}

// An arena retired while an idle trim is under way (its context torn down
// on another thread) is not trimmed: what it holds the driver already
// freed, so it is dropped by its retire, never released.
TEST(Release, FreedBySkipsAnArenaRetiredMeanwhile) {
  auto first_dev = std::make_shared<FakeDevice>();
  auto dying_dev = std::make_shared<FakeDevice>();
  Pool pool{PoolOptions{.clock = test_clock}};
  Arena* first =
      pool.add_arena(std::make_unique<FakeBackend>(first_dev), {.group = "g", .split_min = MiB});
  auto backend = std::make_unique<DroppingBackend>(dying_dev);
  DroppingBackend* hook = backend.get();
  Arena* dying = pool.add_arena(std::move(backend), {.group = "g"});
  g_now = 10;
  pool.free(pool.allocate(first, 2 * MiB).block);  // a segment, given back while scanning
  pool.free(pool.allocate(dying, 4096).block);
  pool.free(pool.allocate(dying, 8192).block);

  // The context goes while the trim gives back `first`'s segment: its
  // retire is stopped in its first drop until the trim is over.
  std::mutex mu;
  std::condition_variable cv;
  bool dropping = false, retired = false, trim_done = false;
  std::thread retiring;
  bool trimming_started = false;
  hook->on_drop = [&] {
    std::unique_lock lock(mu);
    dropping = true;
    cv.notify_all();
    cv.wait(lock, [&] { return trim_done; });
  };
  first_dev->after_release = [&] {
    if (std::exchange(trimming_started, true)) return;
    retiring = std::thread([&] {
      pool.retire_arena(dying);
      std::lock_guard lock(mu);
      retired = true;
      cv.notify_all();
    });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return dropping || retired; });  // retired: it had nothing to drop
  };
  g_now = 100;
  std::size_t items = 0;
  pool.release_idle("g", 50, &items);
  {
    std::lock_guard lock(mu);
    trim_done = true;
  }
  cv.notify_all();
  retiring.join();
  EXPECT_EQ(items, 1u) << "only the live arena's segment";
  EXPECT_EQ(dying_dev->releases, 0u) << "memory its driver freed was released";
  EXPECT_EQ(dying_dev->drops, 2u);
}
