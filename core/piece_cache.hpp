// What the two caches of pieces (segments.hpp, ranges.hpp) share: their
// state under one lock of rank R, which fork() takes, and the counters of
// the memory they hold (hits, misses and active counts are the shards').
#pragma once

#include <algorithm>

#include "core/cache.hpp"
#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"

namespace gpupool::core_detail {

// Two neighbouring free pieces (of a segment or a range) as one: fences
// are ordered, so the later covers both, and the merged piece was freed
// when the later of the two was.
template <class Piece>
void absorb(Piece& into, const Piece& from) {
  into.size += from.size;
  into.fence = std::max(into.fence, from.fence);
  into.freed_at_ns = std::max(into.freed_at_ns, from.freed_at_ns);
}

template <LockRank R>
class PieceCache : public Cache {
 public:
  void add_counters(Stats& s) const override {
    LockGuard lock(mu_);
    s += c_;
  }
  void reset_peaks() override {
    LockGuard lock(mu_);
    c_.reset_peaks();
  }

  bool lock() GPUPOOL_TRY_ACQUIRE(true, mu_) { return fork_wait::take(mu_); }  // fork()
  void unlock() GPUPOOL_RELEASE(mu_) { mu_.unlock(); }

 protected:
  mutable Ranked<R> mu_;
  Stats c_ GPUPOOL_GUARDED_BY(mu_);
};

}  // namespace gpupool::core_detail
