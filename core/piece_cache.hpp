// What the two caches of pieces (segments.hpp, ranges.hpp) share: their
// state under one lock of rank R, which fork() takes, and the counters of
// the memory they hold (hits, misses and active counts are the shards').
#pragma once

#include "core/cache.hpp"
#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"

namespace gpupool::core_detail {

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
