// The lock-rank checker (core/lock_rank.hpp), on in this test in every build
// type: a lock taken out of the table's order stops the program with both
// locks named, before the two threads that would deadlock ever meet.
#include <gtest/gtest.h>

#include <mutex>
#include <string>

#include "core/lock_rank.hpp"
#include "core/spin_lock.hpp"

#ifndef GPUPOOL_LOCK_RANKS
#error "tests/core/CMakeLists.txt turns the checks on for this test"
#endif

using namespace gpupool;

namespace {

using ShardLock = Ranked<LockRank::arena_shard, SpinLock>;

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
