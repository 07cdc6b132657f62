// What the two caches of pieces (segments.hpp, ranges.hpp) share: their
// state under one lock of rank R, which fork() takes, and the counters of
// the memory they hold (hits, misses and active counts are the shards').
#pragma once

#include <algorithm>
#include <iterator>

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

  // The piece at `it`, in none of its cache's indexes, merged with each
  // neighbour that `mergeable` accepts: the neighbour leaves its index
  // (`unlist(at, piece)`) and the map, and the lower of the two keeps both.
  // The merged piece, still in no index.
  template <class Pieces, class Mergeable, class Unlist>
  typename Pieces::iterator merge_neighbours(Pieces& pieces, typename Pieces::iterator it,
                                             Mergeable&& mergeable, Unlist&& unlist)
      GPUPOOL_REQUIRES(mu_) {
    if (auto next = std::next(it); next != pieces.end() && mergeable(next->second)) {
      unlist(next->first, next->second);
      absorb(it->second, next->second);
      pieces.erase(next);
    }
    if (it != pieces.begin())
      if (auto prev = std::prev(it); mergeable(prev->second)) {
        unlist(prev->first, prev->second);
        absorb(prev->second, it->second);
        pieces.erase(it);
        it = prev;
      }
    return it;
  }

  // Every two neighbouring free pieces that `joinable(lower, upper)` accepts,
  // as one, until no two are: both leave the free index (`unlist(at, piece)`),
  // the lower keeps both and goes back (`relist(at, piece)`). Whether any
  // were merged.
  template <class Pieces, class Joinable, class Unlist, class Relist>
  bool coalesce_free(Pieces& pieces, Joinable&& joinable, Unlist&& unlist, Relist&& relist)
      GPUPOOL_REQUIRES(mu_) {
    bool merged = false;
    for (auto it = pieces.begin(); it != pieces.end();) {
      auto next = std::next(it);
      if (next == pieces.end()) break;
      if (joinable(it->second, next->second)) {
        unlist(it->first, it->second);
        unlist(next->first, next->second);
        absorb(it->second, next->second);
        pieces.erase(next);
        relist(it->first, it->second);
        merged = true;
        continue;  // the lower may take the next one too
      }
      it = next;
    }
    return merged;
  }
};

}  // namespace gpupool::core_detail
