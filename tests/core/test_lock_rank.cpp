// The lock-rank checker (core/lock_rank.hpp), on in this test in every build
// type: a lock taken out of the table's order stops the program with both
// locks named, before the two threads that would deadlock ever meet.
#include <gtest/gtest.h>

#include <mutex>
#include <shared_mutex>
#include <string>

#include "core/lock_rank.hpp"
#include "core/spin_lock.hpp"

#ifndef GPUPOOL_LOCK_RANKS
#error "tests/core/CMakeLists.txt turns the checks on for this test"
#endif

using namespace gpupool;

namespace {

using ShardLock = Ranked<LockRank::arena_shard, SpinLock>;
using TeardownLock = Ranked<LockRank::cuda_teardown, std::shared_mutex>;
using BufferShardLock = Ranked<LockRank::opencl_buffers, SpinLock>;

std::string rank_of(LockRank r) { return std::to_string(static_cast<unsigned>(r)); }

// The message, as a regular expression.
std::string violation(const char* taken, LockRank t, const char* held, LockRank h) {
  return std::string("lock order violated: taking '") + taken + "' \\(rank " + rank_of(t) +
         "\\) while holding '" + held + "' \\(rank " + rank_of(h) + "\\)";
}

}  // namespace

TEST(LockRank, NestingInTheTablesOrderIsQuiet) {
  Ranked<LockRank::pool_arenas> list;
  Ranked<LockRank::arena_counters> counters;
  ShardLock shard;
  Ranked<LockRank::arena_segments> segments;
  std::lock_guard a(list);
  std::lock_guard b(counters);
  std::lock_guard c(shard);
  std::lock_guard d(segments);
}

TEST(LockRank, ALockLetGoNoLongerCounts) {
  ShardLock shard;
  Ranked<LockRank::pool_arenas> list;
  shard.lock();
  shard.unlock();
  std::lock_guard a(list);
  std::lock_guard b(shard);
}

TEST(LockRankDeathTest, AnInvertedPairStopsTheProgramNamingBoth) {
  EXPECT_DEATH(
      {
        ShardLock shard;
        Ranked<LockRank::pool_arenas> list;
        std::lock_guard a(shard);
        std::lock_guard b(list);
      },
      violation("pool arenas", LockRank::pool_arenas, "arena shard", LockRank::arena_shard));
}

// Only the highest rank held matters: a lower one taken under it is out of
// order even when a still lower one is held too.
TEST(LockRankDeathTest, TheHighestRankHeldIsTheOneToBeat) {
  EXPECT_DEATH(
      {
        Ranked<LockRank::pool_arenas> list;
        Ranked<LockRank::arena_segments> segments;
        Ranked<LockRank::arena_counters> counters;
        std::lock_guard a(list);
        std::lock_guard b(segments);
        std::lock_guard c(counters);
      },
      violation("arena counters", LockRank::arena_counters, "arena segments",
                LockRank::arena_segments));
}

// Two locks of one rank (two shards) have no order between them.
TEST(LockRankDeathTest, TwoOfOneRankStopTheProgramOutsideFork) {
  EXPECT_DEATH(
      {
        ShardLock one;
        ShardLock two;
        std::lock_guard a(one);
        std::lock_guard b(two);
      },
      violation("arena shard", LockRank::arena_shard, "arena shard", LockRank::arena_shard));
}

TEST(LockRank, ForkHandlersHoldEveryLockOfARankAtOnce) {
  Ranked<LockRank::pool_arenas> list;
  ShardLock shards[3];
  lock_rank::entering_fork();
  list.lock();
  for (auto& s : shards) s.lock();
  for (auto& s : shards) s.unlock();
  list.unlock();
  lock_rank::leaving_fork();
}

TEST(LockRankDeathTest, ForkHandlersStillKeepTheOrderOfRanks) {
  EXPECT_DEATH(
      {
        Ranked<LockRank::pool_arenas> list;
        ShardLock shard;
        lock_rank::entering_fork();
        std::lock_guard a(shard);
        std::lock_guard b(list);
      },
      violation("pool arenas", LockRank::pool_arenas, "arena shard", LockRank::arena_shard));
}

TEST(LockRankDeathTest, LettingGoOfALockNotHeldStopsTheProgram) {
  EXPECT_DEATH(
      {
        ShardLock shard;
        shard.unlock();
      },
      "releasing 'arena shard' \\(rank " + rank_of(LockRank::arena_shard) +
          "\\), which this thread does not hold");
}

// interpose/'s locks are in the same table, before the pool's: they are
// held while calling into the pool. The nestings gpupool's code makes, from
// the control thread's round down to the observer's locks, taken from
// inside pool calls.
TEST(LockRank, InterposeLocksNestInTheTablesOrder) {
  Ranked<LockRank::control_round> round;
  Ranked<LockRank::control_work> work;
  Ranked<LockRank::cuda_solo> solo;
  TeardownLock teardown;
  Ranked<LockRank::cuda_contexts> contexts;
  Ranked<LockRank::node_devices> devices;
  Ranked<LockRank::pool_arenas> list;
  ShardLock shard;
  Ranked<LockRank::trace_buffer> buffer;
  Ranked<LockRank::trace_file> file;
  Ranked<LockRank::sites> sites;
  std::lock_guard a(round);
  std::lock_guard b(work);
  std::lock_guard c(solo);
  std::shared_lock d(teardown);
  std::lock_guard e(contexts);
  std::lock_guard f(devices);
  std::lock_guard g(list);
  std::lock_guard h(shard);
  std::lock_guard i(buffer);
  std::lock_guard j(file);
  std::lock_guard k(sites);
}

// The inversion the table exists for: a backend call (which may take a
// context's teardown lock) made while the pool holds one of its own locks.
// A shared take ranks as an exclusive one.
TEST(LockRankDeathTest, AContextsTeardownLockUnderAPoolLockStopsTheProgram) {
  EXPECT_DEATH(
      {
        Ranked<LockRank::pool_arenas> list;
        TeardownLock teardown;
        std::lock_guard a(list);
        std::shared_lock b(teardown);
      },
      violation("cuda context teardown", LockRank::cuda_teardown, "pool arenas",
                LockRank::pool_arenas));
}

TEST(LockRankDeathTest, TheOpenCLContextLockUnderItsBufferMapStopsTheProgram) {
  EXPECT_DEATH(
      {
        BufferShardLock buffers;
        Ranked<LockRank::opencl_context> context;
        std::lock_guard a(buffers);
        std::lock_guard b(context);
      },
      violation("opencl context", LockRank::opencl_context, "opencl buffer shard",
                LockRank::opencl_buffers));
}

// A try_lock never waits, so it cannot deadlock whatever is held: it is not
// checked (the exit's bounded wait for the control's work lock), but what
// it took counts as held.
TEST(LockRank, ATryLockOutOfOrderIsQuiet) {
  ShardLock shard;
  Ranked<LockRank::control_work> work;
  std::lock_guard a(shard);
  std::unique_lock b(work, std::try_to_lock);
  EXPECT_TRUE(b.owns_lock());
}

TEST(LockRankDeathTest, ALockTakenByTryLockCountsAsHeld) {
  EXPECT_DEATH(
      {
        Ranked<LockRank::node_devices> devices;
        Ranked<LockRank::cuda_contexts> contexts;
        std::unique_lock a(devices, std::try_to_lock);
        std::lock_guard b(contexts);
      },
      violation("cuda contexts", LockRank::cuda_contexts, "node devices", LockRank::node_devices));
}

// fork()'s child makes new a lock its prepare took that it cannot unlock
// (a written shared mutex): it is no longer held, so a lock of a lower rank
// may be taken. (Not used again here: outside a real child,
// ThreadSanitizer still sees the old lock written at that address.)
TEST(LockRank, ALockMadeNewInAForkedChildIsNoLongerHeld) {
  TeardownLock teardown;
  Ranked<LockRank::cuda_solo> solo;
  teardown.lock();
  teardown.remake_held_in_child();
  std::lock_guard a(solo);
}
