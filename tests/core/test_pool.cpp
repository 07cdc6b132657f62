// The pool's behaviours one at a time, as a backend author relies on them.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/pool.hpp"
#include "pool_fixture.hpp"

using namespace gpupool;
using gpupool::testing::DroppingBackend;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

namespace {

using Fixture = gpupool::testing::PoolFixture;

}  // namespace

TEST(Pool, FreedBlockIsHeldAndHandedOutAgain) {
  Fixture f;
  Block* a = f.alloc(1000);
  EXPECT_EQ(a->size, 1024u);
  const Handle h = a->handle;
  f.pool.free(a);
  Stats s = f.arena->stats();
  EXPECT_EQ(s.held_blocks, 1u);
  EXPECT_EQ(s.held_bytes, 1024u);
  EXPECT_EQ(s.active_blocks, 0u);
  // Any size of the same bin gets the held block back.
  AllocResult r = f.pool.allocate(f.arena, 1010);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, h);
  s = f.arena->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.active_bytes, 1010u);
  EXPECT_EQ(s.managed_bytes, 1024u);
  EXPECT_EQ(f.dev->allocs, 1u);
  f.pool.free(r.block);
}

TEST(Pool, SmallerBinsAreNotServedFromTheHeldBlock) {
  Fixture f;
  f.pool.free(f.alloc(1000));
  Block* b = f.alloc(2000);
  EXPECT_EQ(f.dev->allocs, 2u);
  f.pool.free(b);
}

// A request whose bin holds nothing takes a held block of a larger bin under
// twice its size (the smallest such), rather than a fresh one: sizes a
// program uses in one phase serve the next phase's (docs/memory.md, "Memory
// overhead"). The block keeps its size and goes back to its own bin.
TEST(Pool, AnEmptyBinBorrowsALargerHeldBlockUnderTwiceTheSize) {
  PoolOptions po;
  po.borrow_larger = true;
  Fixture f(po);
  Block* big = f.alloc(3072);
  Block* bigger = f.alloc(3584);
  const Handle h = big->handle;
  f.pool.free(bigger);
  f.pool.free(big);
  AllocResult r = f.pool.allocate(f.arena, 2000);  // bin 2048: borrows 3072, not 3584
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, h);
  EXPECT_EQ(r.block->size, 3072u);
  EXPECT_EQ(f.dev->allocs, 2u);
  Stats s = f.arena->stats();
  EXPECT_EQ(s.active_bytes, 2000u);
  EXPECT_EQ(s.held_bytes, 3584u);
  f.pool.free(r.block);
  // Back in its own bin: a 3072 request gets it again.
  AllocResult again = f.pool.allocate(f.arena, 3072);
  EXPECT_TRUE(again.hit);
  EXPECT_EQ(again.block->handle, h);
  f.pool.free(again.block);
  // Twice the size or more is not borrowed: 1536 from 3072 would waste half.
  Block* small = f.alloc(1536);
  EXPECT_EQ(f.dev->allocs, 3u);
  f.pool.free(small);
}

// No new out-of-memory: a program that filled the device with one size,
// freed it all and fills it again with a smaller size gets as much as the
// device gives it without a pool (each held block is released for the
// smaller ones). Borrowing held larger blocks would leave it with two thirds
// (measured on the H100's OpenCL: 52.4 of 78.7 GiB), so it is opt-in.
TEST(Pool, RefillWithASmallerSizeGetsTheWholeDevice) {
  EXPECT_FALSE(PoolOptions{}.borrow_larger);  // GPUPOOL_BORROW=0
  for (bool borrow : {false, true}) {
    PoolOptions po;
    po.borrow_larger = borrow;
    Fixture f(po);
    f.dev->capacity = 300 * 1024;
    std::vector<Block*> v;
    for (AllocResult r; (r = f.pool.allocate(f.arena, 3072)).block;) v.push_back(r.block);
    EXPECT_EQ(v.size(), 100u);
    for (Block* b : v) f.pool.free(b);
    v.clear();
    for (AllocResult r; (r = f.pool.allocate(f.arena, 2048)).block;) v.push_back(r.block);
    if (!borrow) EXPECT_EQ(v.size(), 150u);
    else EXPECT_EQ(v.size(), 100u);  // what borrowing costs such a program
    for (Block* b : v) f.pool.free(b);
  }
}

TEST(Pool, OutOfMemoryReleasesLargestHeldFirstThenRetries) {
  Fixture f;
  f.dev->capacity = 10000;
  Block* small = f.alloc(100);  // 100
  Block* mid = f.alloc(1000);   // 1024
  Block* big = f.alloc(4097);   // 4352
  Handle mid_h = mid->handle;
  f.pool.free(small);
  f.pool.free(mid);
  f.pool.free(big);
  // 5476 held; 6000 rounds to 6144 and needs 1620 released: only the largest goes.
  Block* b = f.alloc(6000);
  ASSERT_NE(b, nullptr);
  Stats s = f.arena->stats();
  EXPECT_EQ(s.oom_retries, 1u);
  EXPECT_EQ(s.held_blocks, 2u);
  EXPECT_EQ(s.backend_frees, 1u);
  EXPECT_TRUE(f.dev->live.count(mid_h)) << "smaller held blocks stay";
  f.pool.free(b);
}

TEST(Pool, OutOfMemoryLooksAtOwnArenaThenItsGroupThenOthers) {
  auto dev = std::make_shared<FakeDevice>();
  auto other_dev = std::make_shared<FakeDevice>();
  dev->capacity = 5000;
  Pool pool;
  ArenaOptions a0{.name = "a0", .group = "g"}, a1{.name = "a1", .group = "g"},
      b0{.name = "b0", .group = "h"};
  Arena* x = pool.add_arena(std::make_unique<FakeBackend>(dev), a0);
  Arena* y = pool.add_arena(std::make_unique<FakeBackend>(dev), a1);
  Arena* z = pool.add_arena(std::make_unique<FakeBackend>(other_dev), b0);
  pool.free(pool.allocate(z, 8000).block);  // larger, but on another device
  pool.free(pool.allocate(y, 2000).block);  // 2048 in the same group
  pool.free(pool.allocate(x, 1000).block);  // 1024 in the arena itself
  ASSERT_EQ(dev->used, 3072u);
  AllocResult r = pool.allocate(x, 3000);  // rounds to 3072: the arena alone is not enough
  ASSERT_EQ(r.status, BackendStatus::ok);
  EXPECT_EQ(x->stats().held_blocks, 0u) << "own arena released first";
  EXPECT_EQ(y->stats().held_blocks, 0u) << "then the group";
  EXPECT_EQ(z->stats().held_blocks, 1u) << "other groups untouched while the group sufficed";
  pool.free(r.block);
}

TEST(Pool, ExactSizeIsTriedWhenTheRoundedSizeCannotFit) {
  Fixture f;
  f.dev->capacity = 4200;
  AllocResult r = f.pool.allocate(f.arena, 4100);  // rounds to 4352 > capacity
  ASSERT_EQ(r.status, BackendStatus::ok);
  EXPECT_EQ(r.block->size, 4100u);
  EXPECT_FALSE(r.block->pooled);
  f.pool.free(r.block);
  EXPECT_EQ(f.arena->stats().held_blocks, 0u) << "an exact block does not fit its bin: released";
  EXPECT_EQ(f.dev->used, 0u);
}

TEST(Pool, OutOfMemoryIsReportedWhenNothingHelps) {
  Fixture f;
  f.dev->capacity = 1000;
  AllocResult r = f.pool.allocate(f.arena, 5000);
  EXPECT_EQ(r.status, BackendStatus::out_of_memory);
  EXPECT_EQ(r.block, nullptr);
}

// Another process holds 800 of the device's 1000 bytes. Our own held block
// goes first; only then is the neighbour asked, and the request retried.
TEST(Pool, OutOfMemoryAsksOtherHoldersOnlyAfterReleasingItsOwn) {
  Fixture f;
  f.dev->capacity = 1000;
  f.pool.free(f.alloc(100));
  f.dev->used += 800;  // the neighbour's
  std::size_t neighbour_held = 800;
  f.dev->neighbour = [&](std::size_t) {
    std::lock_guard lock(f.dev->mu);
    f.dev->used -= neighbour_held;
    return std::exchange(neighbour_held, 0);
  };
  AllocResult r = f.pool.allocate(f.arena, 500);
  ASSERT_EQ(r.status, BackendStatus::ok);
  EXPECT_EQ(f.dev->relieve_calls, 1u);
  EXPECT_EQ(f.dev->used_when_relieved, 800u) << "our held block was released before asking";
  EXPECT_EQ(f.arena->stats().held_blocks, 0u);
  EXPECT_GE(f.arena->stats().oom_retries, 2u);
  f.pool.free(r.block);
}

TEST(Pool, OutOfMemoryWhenNoOtherHolderReleases) {
  Fixture f;
  f.dev->capacity = 1000;
  f.dev->used = 900;
  f.dev->neighbour = [](std::size_t) { return std::size_t{0}; };
  AllocResult r = f.pool.allocate(f.arena, 500);
  EXPECT_EQ(r.status, BackendStatus::out_of_memory);
  EXPECT_EQ(r.error, 2) << "the backend's own code";
  EXPECT_EQ(f.dev->relieve_calls, 1u) << "a holder that released nothing is not asked again";
}

// What another process's request releases: one device's held blocks,
// largest first, until enough.
TEST(Pool, ReleaseGroupReleasesThatGroupLargestFirst) {
  auto other = std::make_shared<FakeDevice>();
  Fixture f;
  Arena* b = f.pool.add_arena(std::make_unique<FakeBackend>(other), {.group = "other"});
  Block* small = f.alloc(256);
  Block* large = f.alloc(4096);
  Block* mid = f.alloc(1024);
  Block* elsewhere = f.pool.allocate(b, 8192).block;
  const std::size_t small_size = small->size, large_size = large->size, mid_size = mid->size;
  f.pool.free(small);
  f.pool.free(large);
  f.pool.free(mid);
  f.pool.free(elsewhere);
  EXPECT_EQ(f.pool.release_group("dev", 4000), large_size);
  EXPECT_EQ(f.dev->live.size(), 2u);
  EXPECT_EQ(f.pool.release_group("dev", 1), mid_size) << "then the next largest";
  EXPECT_EQ(f.pool.release_group("dev", SIZE_MAX), small_size);
  EXPECT_EQ(f.pool.release_group("dev", SIZE_MAX), 0u);
  EXPECT_EQ(other->releases, 0u) << "another group's blocks stay held";
  EXPECT_EQ(b->stats().held_blocks, 1u);
}

// A release (another process's request, `gpupool free-held --all --device`
// with 2^64-1 bytes) takes what is held when it starts, once, and answers:
// a program that keeps freeing meanwhile must not keep the control thread
// releasing what it frees (issue 28: 7 s and 24 GB against such a program).
TEST(Pool, ReleaseGroupTakesOnlyWhatWasHeldWhenItStarted) {
  Fixture f;
  std::vector<Block*> in_use;
  for (int i = 0; i < 8; ++i) in_use.push_back(f.alloc(4096));
  Block* held = f.alloc(4096);
  const std::size_t size = held->size;
  f.pool.free(held);
  // Each block the release gives back, the program frees another meanwhile.
  f.dev->after_release = [&] {
    if (!in_use.empty()) {
      Block* b = in_use.back();
      in_use.pop_back();
      f.pool.free(b);
    }
  };
  EXPECT_EQ(f.pool.release_group("dev", SIZE_MAX), size) << "only the one block held at the start";
  f.dev->after_release = nullptr;
  EXPECT_EQ(f.dev->releases, 1u);
  EXPECT_EQ(f.arena->stats().held_blocks, 1u) << "what the program freed meanwhile stays held";
  for (Block* b : in_use) f.pool.free(b);
}

TEST(Pool, OtherBackendErrorsPassThroughWithoutRetry) {
  Fixture f;
  f.pool.free(f.alloc(64));
  f.dev->inject_error = -61;
  AllocResult r = f.pool.allocate(f.arena, 5000);
  EXPECT_EQ(r.status, BackendStatus::error);
  EXPECT_EQ(r.error, -61);
  EXPECT_EQ(f.arena->stats().held_blocks, 1u) << "held memory kept: not an out-of-memory";
}

TEST(Pool, RequestsAboveMaxPooledAreExactAndReleasedAtFree) {
  Fixture f({}, {.group = "dev", .max_pooled = 1 << 20});
  Block* b = f.alloc((1 << 20) + 1);
  EXPECT_EQ(b->size, (1u << 20) + 1);
  f.pool.free(b);
  EXPECT_EQ(f.arena->stats().held_blocks, 0u);
  EXPECT_EQ(f.dev->releases, 1u);
}

TEST(Pool, StopHoldingReleasesHeldAndEveryLaterFree) {
  Fixture f;
  Block* a = f.alloc(100);
  f.pool.free(f.alloc(200));
  f.pool.stop_holding();
  EXPECT_FALSE(f.pool.holding());
  EXPECT_EQ(f.arena->stats().held_blocks, 0u);
  f.pool.free(a);
  EXPECT_EQ(f.arena->stats().held_blocks, 0u);
  EXPECT_EQ(f.dev->used, 0u);
}

TEST(Pool, FreeHeldKeepsHolding) {
  Fixture f;
  f.pool.free(f.alloc(100));
  f.pool.free_held();
  EXPECT_EQ(f.dev->used, 0u);
  f.pool.free(f.alloc(100));
  EXPECT_EQ(f.arena->stats().held_blocks, 1u);
}

TEST(Pool, HoldDisabledAtStart) {
  Fixture f({.hold = false});
  f.pool.free(f.alloc(100));
  EXPECT_EQ(f.arena->stats().held_blocks, 0u);
}

TEST(Pool, CapReleasesTheOldestHeldBlocks) {
  static std::uint64_t t = 0;
  Fixture f({.clock = [] { return ++t; }}, {.group = "dev", .max_held = 3000});
  Block* a = f.alloc(1000);
  Block* b = f.alloc(1000);
  Block* c = f.alloc(1000);
  Handle ha = a->handle, hc = c->handle;
  f.pool.free(a);
  f.pool.free(b);
  f.pool.free(c);  // 3 x 1024 = 3072 > 3000: the oldest (a) goes
  EXPECT_EQ(f.arena->stats().held_blocks, 2u);
  EXPECT_EQ(f.arena->stats().trims, 1u);
  EXPECT_FALSE(f.dev->live.count(ha));
  EXPECT_TRUE(f.dev->live.count(hc));
  Block* huge = f.alloc(5000);
  f.pool.free(huge);  // larger than the cap by itself: not kept
  EXPECT_EQ(f.arena->stats().held_bytes, 2048u);
}

TEST(Pool, IdleBlocksAreReleasedAfterTheirTime) {
  static std::uint64_t t = 0;
  Fixture f({.release_after_ns = 100, .clock = [] { return t; }});
  t = 1000;
  f.pool.free(f.alloc(100));
  t = 1050;
  f.pool.free(f.alloc(2000));
  EXPECT_EQ(f.pool.trim_idle(1099), 0u);
  EXPECT_EQ(f.pool.trim_idle(1100), 1u);
  EXPECT_EQ(f.arena->stats().held_blocks, 1u);
  EXPECT_EQ(f.pool.trim_idle(1150), 1u);
  EXPECT_EQ(f.arena->stats().trims, 2u);
}

// A process arrived on the GPU: the group's blocks idle at least that long
// go, largest first; blocks reused recently and other groups' stay.
TEST(Pool, ReleaseIdleTakesTheGroupsLongIdleBlocksLargestFirst) {
  static std::uint64_t t = 0;
  auto other = std::make_shared<FakeDevice>();
  Fixture f({.clock = [] { return t; }});
  Arena* b = f.pool.add_arena(std::make_unique<FakeBackend>(other), {.group = "other"});
  t = 1000;
  Block* small = f.alloc(256);
  Block* large = f.alloc(4096);
  Block* recent = f.alloc(1024);
  Block* elsewhere = f.pool.allocate(b, 8192).block;
  const std::size_t small_size = small->size, large_size = large->size;
  const Handle h_small = small->handle, h_large = large->handle, h_recent = recent->handle;
  f.pool.free(small);
  f.pool.free(large);
  f.pool.free(elsewhere);
  t = 1900;
  f.pool.free(recent);
  t = 2000;
  std::size_t blocks = 0;
  EXPECT_EQ(f.pool.release_idle("dev", 1000, &blocks), small_size + large_size);
  EXPECT_EQ(blocks, 2u);
  EXPECT_FALSE(f.dev->live.count(h_small));
  EXPECT_FALSE(f.dev->live.count(h_large));
  EXPECT_TRUE(f.dev->live.count(h_recent)) << "freed 100 ns ago: kept";
  EXPECT_EQ(other->live.size(), 1u) << "another group's block stays";
  EXPECT_EQ(f.arena->stats().trims, 2u);
  EXPECT_EQ(f.pool.release_idle("dev", 1000), 0u);
  t = 2900;
  EXPECT_EQ(f.pool.release_idle("dev", 1000),
            f.pool.bins().alloc_size(f.pool.bins().bin_number(1024)));
}

TEST(Pool, PendingBlocksWaitForTheirFenceAndOneBulkWaitClearsThem) {
  Fixture f;
  f.dev->fences = true;
  Block* a = f.alloc(100);
  Block* b = f.alloc(100);
  Handle ha = a->handle;
  f.pool.free(a);  // fence 1
  f.dev->completed = 1;
  f.pool.free(b);  // fence 2, still running
  // The newest block is pending, the older one is ready: the ready one is used, no wait.
  AllocResult r1 = f.pool.allocate(f.arena, 100);
  EXPECT_EQ(r1.block->handle, ha);
  EXPECT_EQ(f.dev->waits, 0u);
  // Only a pending block left: one bulk wait, then it is reused.
  AllocResult r2 = f.pool.allocate(f.arena, 100);
  EXPECT_TRUE(r2.hit);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(f.arena->stats().fence_waits, 1u);
  EXPECT_EQ(f.arena->stats().pending_frees, 2u);
  f.pool.free(r1.block);
  f.pool.free(r2.block);
}

// A loop that frees and at once reallocates one size, the device never
// idle: while the pending blocks fit the growth budget the pool allocates
// fresh ones instead of waiting; then one wait frees them all, and that many
// pairs follow without a wait.
TEST(Pool, PendingBlocksGrowWithinTheBudgetThenOneWaitFreesThemAll) {
  const std::size_t block = BinScheme(4).rounded(100);
  Fixture f({}, {.pending_growth = 3 * block});
  f.dev->fences = true;
  auto pair = [&] { f.pool.free(f.alloc(100)); };
  pair();  // the first block
  pair();  // its block pending: a second one
  pair();  // both pending: a third
  EXPECT_EQ(f.dev->allocs, 3u);
  EXPECT_EQ(f.dev->waits, 0u);
  pair();  // three pending, no room for a fourth: one wait
  EXPECT_EQ(f.dev->allocs, 3u);
  EXPECT_EQ(f.dev->waits, 1u);
  pair();  // the wait freed the other two as well
  pair();
  EXPECT_EQ(f.dev->waits, 1u);
  pair();  // all three pending again
  EXPECT_EQ(f.dev->waits, 2u);
  EXPECT_EQ(f.dev->allocs, 3u);
  EXPECT_EQ(f.arena->stats().fence_waits, 2u);
  EXPECT_EQ(f.arena->stats().held_bytes, 3 * block);
}

// However small the blocks, at most kMaxPendingBlocks wait for the device.
TEST(Pool, AtMostMaxPendingBlocksOfASize) {
  static_assert(kMaxPendingBlocks == 256, "the documentation (options.def) names the number");
  Fixture f({}, {.pending_growth = std::size_t{1} << 30});
  f.dev->fences = true;
  for (std::size_t i = 0; i < kMaxPendingBlocks + 1; ++i) f.pool.free(f.alloc(100));
  EXPECT_EQ(f.dev->allocs, kMaxPendingBlocks);
  EXPECT_EQ(f.dev->waits, 1u);
}

// Ski rental: a bin grows while the time its waits took covers the time its
// growths took (the first is free). Cheap waits (an idle device) buy blocks
// slowly, a long one (a busy queue) buys several.
TEST(Pool, GrowthIsPaidForByTheWaitsItSaves) {
  Fixture f({}, {.pending_growth = std::size_t{1} << 30});
  f.dev->fences = true;
  f.dev->alloc_cost = 100;
  f.dev->wait_cost = 40;
  auto pair = [&] { f.pool.free(f.alloc(100)); };
  pair();  // the bin's first block: a miss, not a growth
  pair();  // pending: grows at once (credit -100)
  EXPECT_EQ(f.dev->allocs, 2u);
  EXPECT_EQ(f.dev->waits, 0u);
  // Two blocks, both pending: three waits of 40 bring the credit back to 20.
  for (int i = 0; i < 6; ++i) pair();
  EXPECT_EQ(f.dev->allocs, 2u);
  EXPECT_EQ(f.dev->waits, 3u);
  pair();  // the third block (credit -80)
  EXPECT_EQ(f.dev->allocs, 3u);
  EXPECT_EQ(f.dev->waits, 3u);
  // A wait longer than a growth (the device was busy) pays at once.
  f.dev->wait_cost = 1000;
  pair();  // all three pending: one wait (credit 920)
  EXPECT_EQ(f.dev->waits, 4u);
  pair(), pair();  // the wait readied the other two
  pair();          // all pending again: a fourth block (credit 820)
  EXPECT_EQ(f.dev->allocs, 4u);
  EXPECT_EQ(f.dev->waits, 4u);
  // The rest of that wait pays for more blocks, one per pair without a wait,
  // until it is spent: 9 more (credit -80), then a wait.
  while (f.dev->waits == 4) pair();
  EXPECT_EQ(f.dev->allocs, 13u);
  EXPECT_EQ(f.arena->stats().held_blocks, 13u);
  // What the waits took the program: three of 40, two of 1000.
  EXPECT_EQ(f.arena->stats().fence_waits, 5u);
  EXPECT_EQ(f.arena->stats().fence_wait_ns, 2120u);
}

// Each bin keeps its own account: one bin's growth does not stop another's.
TEST(Pool, GrowthCreditIsPerBin) {
  Fixture f({}, {.pending_growth = std::size_t{1} << 30});
  f.dev->fences = true;
  f.dev->alloc_cost = 100;
  f.dev->wait_cost = 1;
  f.pool.free(f.alloc(100));
  f.pool.free(f.alloc(100));  // bin of 100 grows (credit -100)
  f.pool.free(f.alloc(5000));
  f.pool.free(f.alloc(5000));  // bin of 5000 grows too
  EXPECT_EQ(f.dev->allocs, 4u);
  EXPECT_EQ(f.dev->waits, 0u);
}

// Growing never makes the pool give held memory back: without room, it waits.
TEST(Pool, GrowthThatDoesNotFitWaitsInsteadOfReleasing) {
  const std::size_t block = BinScheme(4).rounded(100);
  Fixture f({}, {.pending_growth = 8 * block});
  f.dev->fences = true;
  f.dev->capacity = block;  // room for one block only
  f.pool.free(f.alloc(100));
  Block* b = f.alloc(100);  // pending; a fresh one does not fit
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(f.dev->releases, 0u);
  EXPECT_EQ(f.arena->stats().oom_retries, 0u);
  f.pool.free(b);
}

TEST(Pool, RetiredArenaForgetsBlocksWithoutReleasingThem) {
  Fixture f({}, {.name = "ctx", .group = "dev", .kind = "fake"});
  Block* a = f.alloc(100);
  f.pool.free(f.alloc(300));
  f.pool.retire_arena(f.arena);
  EXPECT_TRUE(f.arena->retired());
  EXPECT_EQ(f.dev->releases, 0u) << "the driver already freed the context's memory";
  // The backend lets go of each block's record (the shim's pointer-map
  // entry), handed back with it: FakeBackend::drop checks it is this one.
  EXPECT_EQ(f.dev->drops, 1u) << "the held block";
  EXPECT_EQ(f.pool.arena_count(), 1u) << "a block is still in the program's hands";
  f.pool.free(a);  // the program frees after the context died: nothing reaches the backend
  EXPECT_EQ(f.dev->releases, 0u);
  EXPECT_EQ(f.dev->drops, 2u) << "the block the program held, at its free";
  // The arena is gone; what it did stays in the totals.
  EXPECT_EQ(f.pool.arena_count(), 0u);
  Stats s = f.pool.totals();
  EXPECT_EQ(s.held_blocks + s.active_blocks, 0u);
  EXPECT_EQ(s.managed_bytes, 0u);
  EXPECT_EQ(s.misses, 2u);
  EXPECT_EQ(s.backend_allocs, 2u);
}

// retire_arena drops the held blocks of an arena that is already marked
// retired with no block active: a reclaim() on another thread meanwhile (the
// control thread's periodic check) must not destroy the arena under it.
TEST(Pool, RetiringArenaIsNotDestroyedWhileItsHeldBlocksAreDropped) {
  struct Watched : FakeBackend {
    std::atomic<bool>* destroyed;
    std::function<void()> on_drop;
    Watched(std::shared_ptr<FakeDevice> d, std::atomic<bool>* flag)
        : FakeBackend(std::move(d)), destroyed(flag) {}
    ~Watched() override { destroyed->store(true); }
    void drop(Handle h, std::size_t bytes, void* data) override {
      if (on_drop) on_drop();
      FakeBackend::drop(h, bytes, data);
    }
  };
  auto dev = std::make_shared<FakeDevice>();
  std::atomic<bool> destroyed{false};
  Pool pool;
  auto backend = std::make_unique<Watched>(dev, &destroyed);
  Watched* w = backend.get();
  Arena* a = pool.add_arena(std::move(backend), {.name = "ctx", .group = "dev", .kind = "fake"});
  Block* x = pool.allocate(a, 100).block;
  Block* y = pool.allocate(a, 300).block;
  pool.free(x);
  pool.free(y);
  int drops = 0;
  bool destroyed_during_drop = false;
  w->on_drop = [&] {
    // Another thread's reclaim, run to its end before this drop goes on.
    std::thread([&] { pool.reclaim(); }).join();
    destroyed_during_drop = destroyed_during_drop || destroyed.load();
    ++drops;
  };
  pool.retire_arena(a);
  EXPECT_EQ(drops, 2);
  EXPECT_FALSE(destroyed_during_drop) << "the arena was destroyed while it was being emptied";
  EXPECT_TRUE(destroyed.load()) << "destroyed once emptied";
  EXPECT_EQ(pool.arena_count(), 0u);
}

TEST(Pool, DestroyedArenasKeepOneRowPerKindAndDevice) {
  // One row per kind and device, with its device: Prometheus sums them by
  // GPU (before: one row per kind, its device empty).
  auto dev = std::make_shared<FakeDevice>();
  Pool pool;
  for (int i = 0; i < 1000; ++i) {
    Arena* a = pool.add_arena(std::make_unique<FakeBackend>(dev),
                              {.name = "ctx " + std::to_string(i),
                               .group = "g" + std::to_string(i),
                               .kind = i % 2 ? "odd" : "even",
                               .device = i / 2 % 2 ? "GPU-b" : "GPU-a"});
    pool.free(pool.allocate(a, 100).block);
    pool.free(pool.allocate(a, 100 + std::size_t(i)).block);
    pool.retire_arena(a);
  }
  Arena* live = pool.add_arena(std::make_unique<FakeBackend>(dev), {.name = "live", .kind = "odd"});
  pool.free(pool.allocate(live, 10).block);
  EXPECT_EQ(pool.arena_count(), 1u);
  const auto snap = pool.snapshot();
  ASSERT_EQ(snap.size(), 5u);
  std::vector<std::tuple<std::string, std::string, std::string>> rows;
  for (std::size_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(snap[i].retired);
    rows.emplace_back(snap[i].name, snap[i].kind, snap[i].device);
  }
  std::sort(rows.begin(), rows.end());
  using Row = std::tuple<std::string, std::string, std::string>;
  EXPECT_EQ(rows, (std::vector<Row>{{"even: 250 destroyed arenas", "even", "GPU-a"},
                                    {"even: 250 destroyed arenas", "even", "GPU-b"},
                                    {"odd: 250 destroyed arenas", "odd", "GPU-a"},
                                    {"odd: 250 destroyed arenas", "odd", "GPU-b"}}));
  EXPECT_EQ(snap[4].name, "live");
  Stats sum;
  for (const auto& row : snap) sum += row.stats;
  EXPECT_EQ(sum, pool.totals()) << "the rows add up to the totals";
  EXPECT_EQ(pool.totals().hits + pool.totals().misses, 2001u);
}

TEST(Pool, ForkedChildDropsItsParentsCounters) {
  Fixture f;
  f.pool.free(f.alloc(100));
  f.pool.retire_arena(f.arena, /*keep_stats=*/false);
  EXPECT_EQ(f.pool.arena_count(), 0u);
  EXPECT_EQ(f.pool.totals(), Stats{});
  EXPECT_TRUE(f.pool.snapshot().empty());
}

// The same with a block the parent still had active at the fork: the arena
// lives on until the block is dropped, but its counters, the block and its
// end are the parent's, in the stats and for the observer (the trace).
TEST(Pool, ForkedChildDoesNotReportItsParentsActiveBlocks) {
  struct Counting : PoolObserver {
    int frees = 0;
    void on_allocate(const Arena&, const Block&, Served) noexcept override {}
    void on_free(const Arena&, const Block&) noexcept override { ++frees; }
  } obs;
  Fixture f;
  Block* kept = f.alloc(100);
  f.pool.free(f.alloc(300));
  f.pool.set_observer(&obs);
  f.pool.retire_arena(f.arena, /*keep_stats=*/false);
  EXPECT_EQ(f.pool.arena_count(), 1u);
  EXPECT_EQ(f.pool.totals(), Stats{});
  EXPECT_TRUE(f.pool.snapshot().empty());
  f.pool.forget(kept);
  EXPECT_EQ(obs.frees, 0);
  EXPECT_EQ(f.pool.arena_count(), 0u);
  EXPECT_EQ(f.pool.totals(), Stats{});
}

TEST(Pool, ReleaseHeldOfOneArena) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool;
  Arena* x = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  Arena* y = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  pool.free(pool.allocate(x, 10).block);
  pool.free(pool.allocate(y, 10).block);
  pool.release_held(x);
  EXPECT_EQ(x->stats().held_blocks, 0u);
  EXPECT_EQ(y->stats().held_blocks, 1u);
}

TEST(Pool, SnapshotListsBinsHoldingMostMemoryFirst) {
  Fixture f({}, {.name = "dev0", .group = "dev", .kind = "fake"});
  std::vector<Block*> bs;
  for (int i = 0; i < 3; ++i) bs.push_back(f.alloc(100));
  bs.push_back(f.alloc(5000));
  for (Block* b : bs) f.pool.free(b);
  auto snap = f.pool.snapshot();
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_EQ(snap[0].name, "dev0");
  EXPECT_EQ(snap[0].kind, "fake");
  ASSERT_EQ(snap[0].bins.size(), 2u);
  EXPECT_EQ(snap[0].bins[0].alloc_size, 5120u);
  EXPECT_EQ(snap[0].bins[1].held_blocks, 3u);
  EXPECT_EQ(f.pool.totals().held_blocks, 4u);
}

// fork(): the handlers take every lock of the pool, several of a kind at
// once, in rank order (debug builds check it: core/lock_rank.hpp), and give
// them all back in the parent and in the child, which goes on as before.
TEST(Pool, ForkHandlersTakeEveryLockAndGiveThemBack) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 4});
  Arena* binned = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  Arena* split =
      pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g", .split_min = 1 << 20});
  Block* b = pool.allocate(binned, 100).block;
  Block* p = pool.allocate(split, 3 << 20).block;
  pool.fork_prepare();
  pool.fork_parent();
  pool.fork_prepare();
  pool.fork_child();
  pool.free(b);
  pool.free(p);
  const Stats s = pool.totals();
  EXPECT_EQ(s.active_blocks, 0u);
  EXPECT_EQ(s.held_bytes, dev->used);
}

// A thread inside the pool holding a shard's lock, stopped there: a backend
// whose passed() (the one backend call made under a shard's lock) waits
// until the test lets it go, as a thread a signal handler interrupted
// inside Pool::free or allocate waits for its handler.
class StoppedInShard {
 public:
  explicit StoppedInShard(Pool& pool) : pool_(pool) {}
  // The thread allocates and frees a block whose fence has not passed,
  // then asks for one of its size: passed() is asked under its shard's lock.
  void start(std::shared_ptr<FakeDevice> dev) {
    dev->fences = true;
    auto backend = std::make_unique<PassWaiting>(dev, *this);
    Arena* a = pool_.add_arena(std::move(backend), {.group = "g"});
    thread_ = std::thread([this, a] {
      pool_.free(pool_.allocate(a, 100).block);
      armed_ = true;
      pool_.free(pool_.allocate(a, 100).block);
    });
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return inside_; });
  }
  void let_go() {
    {
      std::lock_guard lock(mu_);
      go_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  struct PassWaiting : FakeBackend {
    PassWaiting(std::shared_ptr<FakeDevice> dev, StoppedInShard& s)
        : FakeBackend(std::move(dev)), s_(s) {}
    bool passed(std::uint64_t f) override {
      if (s_.armed_) {
        std::unique_lock lock(s_.mu_);
        s_.inside_ = true;
        s_.cv_.notify_all();
        s_.cv_.wait(lock, [&] { return s_.go_; });
      }
      return FakeBackend::passed(f);
    }
    StoppedInShard& s_;
  };
  Pool& pool_;
  std::thread thread_;
  std::atomic<bool> armed_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool inside_ = false, go_ = false;
};

// fork() from a signal handler on one thread while another forks (issue
// 35): the other's prepare waits for a shard's lock that the first holds,
// and the first, inside its handler, waits for the other's fork to end. The
// prepare gives up as soon as a holder says it forks, lets go of every lock
// it took (the list's, the counters', the shards' before the busy one), and
// a later fork takes them all. Before, the prepare spun on the shard for ever.
TEST(Pool, ForkPrepareGivesUpWhenAHolderForksAndLetsGoOfWhatItTook) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 4});
  Arena* other = pool.add_arena(std::make_unique<FakeBackend>(dev), {.group = "g"});
  Block* kept = pool.allocate(other, 5000).block;
  StoppedInShard stopped(pool);
  stopped.start(dev);

  fork_wait::begin();
  fork_wait::holder_forking_begin();
  EXPECT_FALSE(pool.fork_prepare());
  EXPECT_TRUE(fork_wait::end()) << "a prepare that gave up says so";
  fork_wait::holder_forking_end();

  // Every lock the prepare took is free again: the program goes on (a
  // lock left taken would stop this thread here), and so does the thread
  // that was stopped.
  pool.free(kept);
  pool.free(pool.allocate(other, 5000).block);
  stopped.let_go();
  fork_wait::begin();
  EXPECT_TRUE(pool.fork_prepare()) << "a later fork takes every lock";
  EXPECT_FALSE(fork_wait::end());
  pool.fork_parent();
  EXPECT_EQ(pool.totals().active_blocks, 0u);
}

// Without a holder that forks, a busy lock is waited for up to the bound:
// with none, the prepare gives up at the first busy lock. A prepare that
// finds every lock free completes whoever forks behind it.
TEST(Pool, ForkPrepareWaitsUpToItsBoundAndOnlyWhenALockIsBusy) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 4});
  StoppedInShard stopped(pool);
  stopped.start(dev);
  fork_wait::begin(/*bound_ns=*/0);
  EXPECT_FALSE(pool.fork_prepare());
  EXPECT_TRUE(fork_wait::end());
  stopped.let_go();

  fork_wait::begin(/*bound_ns=*/0);
  fork_wait::holder_forking_begin();
  EXPECT_TRUE(pool.fork_prepare()) << "no lock was busy: nothing to give up";
  fork_wait::holder_forking_end();
  EXPECT_FALSE(fork_wait::end());
  pool.fork_parent();
}

// A holder that stays stuck past one prepare's bound (gpupool's control
// thread waiting, through its files thread, on a driver lock held by the
// thread a signal handler interrupted to fork: helper review of issue 35)
// costs one bound, not one per fork: until a prepare completes, the next
// ones wait kBoundAfterGiveUpNs at most; after one completes, the full
// bound again. (Time bounds here are hang checks, far from the waits.)
TEST(Pool, ForkPrepareAfterAGiveUpWaitsBrieflyUntilOneCompletes) {
  using std::chrono::steady_clock;
  auto dev = std::make_shared<FakeDevice>();
  Pool pool({.shards = 4});
  StoppedInShard stopped(pool);
  stopped.start(dev);
  fork_wait::begin(/*bound_ns=*/50'000'000);
  EXPECT_FALSE(pool.fork_prepare());
  EXPECT_TRUE(fork_wait::end());
  auto t0 = steady_clock::now();
  fork_wait::begin();  // the full bound, 10 s
  EXPECT_FALSE(pool.fork_prepare());
  EXPECT_TRUE(fork_wait::end());
  EXPECT_LT(steady_clock::now() - t0, std::chrono::seconds(5)) << "waited the full bound again";
  stopped.let_go();

  fork_wait::begin();
  EXPECT_TRUE(pool.fork_prepare());
  EXPECT_FALSE(fork_wait::end());
  pool.fork_parent();

  StoppedInShard again(pool);
  again.start(dev);
  t0 = steady_clock::now();
  fork_wait::begin(/*bound_ns=*/300'000'000);
  EXPECT_FALSE(pool.fork_prepare());
  EXPECT_TRUE(fork_wait::end());
  EXPECT_GE(steady_clock::now() - t0, std::chrono::milliseconds(300))
      << "a completed prepare gives the next the full bound";
  again.let_go();
  fork_wait::begin();
  EXPECT_TRUE(pool.fork_prepare());
  EXPECT_FALSE(fork_wait::end());
  pool.fork_parent();
}

// A fork while another thread empties a retired arena (an OpenCL context
// finished without any lock a fork handler takes): the child keeps the
// arena as it was, a retired row still holding what was not dropped yet,
// and never destroys it with blocks in its bins.
TEST(Pool, ForkedWhileAnArenaIsEmptiedTheChildKeepsIt) {
  auto dev = std::make_shared<FakeDevice>();
  Pool pool;
  auto backend = std::make_unique<DroppingBackend>(dev);
  DroppingBackend* hook = backend.get();
  Arena* a = pool.add_arena(std::move(backend), {.name = "ctx", .group = "g", .kind = "fake"});
  pool.free(pool.allocate(a, 100).block);
  pool.free(pool.allocate(a, 5000).block);
  std::mutex mu;
  std::condition_variable cv;
  bool dropping = false, forked = false;
  hook->on_drop = [&] {
    std::unique_lock lock(mu);
    dropping = true;
    cv.notify_all();
    cv.wait(lock, [&] { return forked; });
  };
  std::thread retiring([&] { pool.retire_arena(a); });
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return dropping; });
  }
  pool.fork_prepare();
  const pid_t child = fork();
  if (child == 0) {
    pool.fork_child();
    pool.reclaim();
    const auto snap = pool.snapshot();
    const bool kept = pool.arena_count() == 1 && snap.size() == 1 && snap[0].name == "ctx" &&
                      snap[0].retired && snap[0].stats.held_blocks == 1;
    _exit(kept ? 0 : 1);
  }
  pool.fork_parent();
  {
    std::lock_guard lock(mu);
    forked = true;
  }
  cv.notify_all();
  retiring.join();
  ASSERT_GT(child, 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child destroyed, or lost the row of, the arena its parent was emptying";
  EXPECT_EQ(pool.arena_count(), 0u) << "the parent's retire ends as usual";
}

// reset_peaks (PyTorch's reset_peak_memory_stats): every peak comes down to
// its current value, in every thread's shard, the segments' free pieces and
// the destroyed arenas' rows; the other counters go on, and later peaks
// grow from there.
TEST(Pool, ResetPeaksBringsEveryPeakDownToItsCurrentValue) {
  ArenaOptions ao;
  ao.split_min = 1 << 20;
  Fixture f({}, ao);
  Arena* gone =
      f.pool.add_arena(std::make_unique<FakeBackend>(f.dev), {.group = "g", .kind = "old"});
  f.pool.free(f.pool.allocate(gone, 4096).block);
  f.pool.retire_arena(gone);
  // Blocks of two threads (two shards), and a split piece.
  std::vector<Block*> mine, theirs;
  for (int i = 0; i < 8; ++i) mine.push_back(f.alloc(1000));
  std::thread([&] {
    for (int i = 0; i < 8; ++i) theirs.push_back(f.alloc(3000));
  }).join();
  Block* piece = f.alloc(3 << 20);
  for (int i = 0; i < 6; ++i) {
    f.pool.free(mine.back());
    mine.pop_back();
    f.pool.free(theirs.back());
    theirs.pop_back();
  }
  f.pool.free(piece);
  const Stats before = f.pool.totals();
  EXPECT_EQ(before.peak_active_blocks, 18u);  // 8 + 8 + the piece, and the destroyed arena's 1
  EXPECT_GT(before.peak_active_bytes, before.active_bytes);
  EXPECT_GT(before.peak_managed_bytes, 0u);

  f.pool.reset_peaks();
  const Stats after = f.pool.totals();
  EXPECT_EQ(after.peak_active_blocks, after.active_blocks);
  EXPECT_EQ(after.active_blocks, 4u);
  EXPECT_EQ(after.peak_active_bytes, after.active_bytes);
  EXPECT_EQ(after.peak_held_blocks, after.held_blocks);
  EXPECT_EQ(after.peak_held_bytes, after.held_bytes);
  EXPECT_EQ(after.peak_managed_bytes, after.managed_bytes);
  for (const ArenaSnapshot& row : f.pool.snapshot()) {
    EXPECT_EQ(row.stats.peak_active_bytes, row.stats.active_bytes) << row.name;
    EXPECT_EQ(row.stats.peak_held_bytes, row.stats.held_bytes) << row.name;
    EXPECT_EQ(row.stats.peak_managed_bytes, row.stats.managed_bytes) << row.name;
  }
  // Nothing else changed.
  EXPECT_EQ(after.hits, before.hits);
  EXPECT_EQ(after.misses, before.misses);
  EXPECT_EQ(after.backend_allocs, before.backend_allocs);
  EXPECT_EQ(after.held_bytes, before.held_bytes);

  // Later peaks count from the reset.
  Block* one = f.alloc(1000);
  EXPECT_EQ(f.pool.totals().peak_active_blocks, 5u);
  f.pool.free(one);
  EXPECT_EQ(f.pool.totals().peak_active_blocks, 5u);
  for (Block* b : mine) f.pool.free(b);
  for (Block* b : theirs) f.pool.free(b);
}
