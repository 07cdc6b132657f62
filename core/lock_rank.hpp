// Lock ranks: the one order in which gpupool's locks nest.
//
// Every lock has a rank from the table below. A thread may take a lock only
// while each lock it already holds ranks lower; several locks of one rank
// are held together only by fork handlers, which take every lock at once
// (lock_rank::entering_fork). Debug builds (GPUPOOL_LOCK_RANKS, defined for
// CMAKE_BUILD_TYPE=Debug, which CI's sanitizer builds are) keep, per thread,
// how many locks of each rank it holds and abort naming both locks when one
// is taken out of order, before it can deadlock; other builds compile the
// checks away. jemalloc's witness (WITNESS_RANK_*) works the same way.
#pragma once

#include <mutex>

// X(id, name), lowest rank first: a lock ranks after every lock that may be
// held when it is taken.
//
// interpose/'s locks go before `pool_arenas`: they are held while calling
// into the pool (a context's teardown lock around retire_arena, the context
// registry around add_arena), and the pool holds none of its own while it
// calls a backend or its observer (only Backend::passed, which takes no
// lock, runs under the shard and segment locks).
#define GPUPOOL_LOCK_RANK_TABLE(X)                                                 \
  /* ArenaList::mu_: the arena and group lists, the retired totals. */             \
  X(pool_arenas, "pool arenas")                                                    \
  /* Arena::slow_mu_: the counters of backend calls. */                            \
  X(arena_counters, "arena counters")                                              \
  /* Shard::mu (binned.hpp): a thread slot's bins and counters (the hit path). */ \
  X(arena_shard, "arena shard")                                                    \
  /* SegmentCache::mu_: an arena's segments and pieces. */                        \
  X(arena_segments, "arena segments")

namespace gpupool {

enum class LockRank : unsigned char {
#define GPUPOOL_LOCK_RANK_ID(id, name) id,
  GPUPOOL_LOCK_RANK_TABLE(GPUPOOL_LOCK_RANK_ID)
#undef GPUPOOL_LOCK_RANK_ID
};

namespace lock_rank {

inline constexpr unsigned kRanks = 0
#define GPUPOOL_LOCK_RANK_COUNT(id, name) +1
    GPUPOOL_LOCK_RANK_TABLE(GPUPOOL_LOCK_RANK_COUNT)
#undef GPUPOOL_LOCK_RANK_COUNT
    ;

const char* name(LockRank rank);

// The checker (lock_rank.cpp, compiled into every build so that a test can
// use it in any): `taking` aborts if this thread holds a lock of `rank` or
// higher (the same rank inside a ForkScope excepted), then counts it held.
void taking(LockRank rank);
void released(LockRank rank);
void fork_begin();
void fork_end();

// Builds with and without the checks may meet in one program (a test of the
// checker in a release build): each has its own names for what differs.
// Only for what is declared here and in spin_lock.hpp: a class holding a
// Ranked member (Arena, Shard, ArenaList, SegmentCache) is the same class
// either way, so a file whose checking differs from core's must not use
// core's other headers (it would be two definitions of one class).
#ifdef GPUPOOL_LOCK_RANKS
inline namespace checked {
inline void will_take(LockRank r) { taking(r); }
inline void did_release(LockRank r) { released(r); }
// From a fork's prepare handler to its parent or child handler, where every
// lock of a rank is taken at once.
inline void entering_fork() { fork_begin(); }
inline void leaving_fork() { fork_end(); }
}  // namespace checked
#else
inline namespace unchecked {
inline void will_take(LockRank) {}
inline void did_release(LockRank) {}
inline void entering_fork() {}
inline void leaving_fork() {}
}  // namespace unchecked
#endif

}  // namespace lock_rank

#ifdef GPUPOOL_LOCK_RANKS
inline namespace checked {
#else
inline namespace unchecked {
#endif

// A lock (std::mutex, SpinLock) with its rank: what every lock in gpupool is.
template <LockRank R, class Lock = std::mutex>
class Ranked {
 public:
  static constexpr LockRank rank = R;
  void lock() {
    lock_rank::will_take(R);
    lock_.lock();
  }
  void unlock() {
    lock_.unlock();
    lock_rank::did_release(R);
  }

 private:
  Lock lock_;
};

}  // namespace checked / unchecked
}  // namespace gpupool
