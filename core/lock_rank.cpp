// The lock-rank checker (lock_rank.hpp). Only debug builds call it.
#include "core/lock_rank.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace gpupool::lock_rank {
namespace {

constexpr const char* kNames[] = {
#define GPUPOOL_LOCK_RANK_NAME(id, lock_name) lock_name,
    GPUPOOL_LOCK_RANK_TABLE(GPUPOOL_LOCK_RANK_NAME)
#undef GPUPOOL_LOCK_RANK_NAME
};

// What this thread holds: how many locks of each rank. Fork handlers hold
// every shard of every arena at once, so a count, not a bit.
struct Held {
  std::uint32_t count[kRanks] = {};
  unsigned forking = 0;
};
thread_local Held t_held;

[[noreturn]] void fail(const char* what, LockRank taken, int held) {
  if (held >= 0)
    std::fprintf(stderr,
                 "gpupool: lock order violated: %s '%s' (rank %u) while holding '%s' (rank %d)\n",
                 what, name(taken), static_cast<unsigned>(taken), kNames[held], held);
  else
    std::fprintf(stderr, "gpupool: lock rank: %s '%s' (rank %u), which this thread does not hold\n",
                 what, name(taken), static_cast<unsigned>(taken));
  std::abort();
}

}  // namespace

const char* name(LockRank rank) { return kNames[static_cast<unsigned>(rank)]; }

void taking(LockRank rank) {
  const unsigned r = static_cast<unsigned>(rank);
  for (unsigned h = kRanks; h-- > r;) {
    if (t_held.count[h] == 0) continue;
    if (h > r || !t_held.forking) fail("taking", rank, static_cast<int>(h));
    break;
  }
  ++t_held.count[r];
}

void took(LockRank rank) { ++t_held.count[static_cast<unsigned>(rank)]; }

void released(LockRank rank) {
  std::uint32_t& n = t_held.count[static_cast<unsigned>(rank)];
  if (n == 0) fail("releasing", rank, -1);
  --n;
}

void fork_begin() { ++t_held.forking; }
void fork_end() { --t_held.forking; }

}  // namespace gpupool::lock_rank
