// What an arena's caches show the release policies (release.hpp): the
// memory they hold, one item at a time. Two caches implement it, the bins of
// held blocks (binned.hpp) and the wholly free segments (segments.hpp);
// their hit paths are their own.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/backend.hpp"
#include "core/stats.hpp"

namespace gpupool {
struct Block;
}  // namespace gpupool

// core/'s own types are in core_detail, out of the way of interpose/'s.
namespace gpupool::core_detail {

class Cache;

// Memory taken out of a cache, to be given back to the backend (or let go:
// Arena::let_go): a held block, or a segment none of whose pieces is in use.
struct Held {
  Handle handle = 0;
  std::size_t size = 0;    // 0: nothing was taken
  void* data = nullptr;    // the backend's record (BackendResult::data)
  Block* block = nullptr;  // a held block, deleted once its memory is let go
  // Memory the backend kept outside the pool (HeldOutside), already given
  // back when taken: counted, nothing more.
  bool outside = false;
  // Granules of an arena's range (ranges.hpp), unmapped (or, retired,
  // dropped) by their cache when taken, and out of the cap's count: only
  // the arena's counters are left to do.
  bool unmapped = false;
};

// Room in `out` for n more items, so that taking them out of a cache cannot
// fail half-way (growing geometrically, as push_back would).
inline void make_room(std::vector<Held>& out, std::size_t n) {
  if (out.capacity() - out.size() < n) out.reserve(std::max(out.size() + n, 2 * out.capacity()));
}

// Which item a policy gives back first: the largest (out of memory, another
// process's request) or the one held longest (the cap).
enum class Victims { largest, oldest };

// The best item so far of a search over several caches (pick_victim).
struct Offer {
  Cache* cache = nullptr;  // none yet
  std::size_t size = 0;
  std::uint64_t freed_at_ns = UINT64_MAX;
  std::size_t place[2] = {};  // where it lies, in the cache's own terms
  // An item of `bytes` freed at `t_ns` comes strictly before this one.
  bool beaten_by(Victims order, std::size_t bytes, std::uint64_t t_ns) const {
    return order == Victims::largest ? bytes > size : t_ns < freed_at_ns;
  }
};

// The held bytes of a group of arenas (the memory one device offers) and
// their cap, ArenaOptions::max_held. Counted only when a cap is set, so an
// uncapped pool has no shared write on its hit path. Memory is counted here
// as it starts being held (a free) and stops (a hit, Arena::let_go); the
// cap policy (release_over_cap) gives back what is over.
struct HeldCap {
  std::size_t max_held = SIZE_MAX;
  std::atomic<std::uint64_t> held_bytes{0};
  bool capped() const { return max_held != SIZE_MAX; }
  // Held by itself it would push everything else out: never held.
  bool too_large(std::size_t bytes) const { return capped() && bytes > max_held; }
  // `bytes` start being held: true when that puts the group over its cap.
  bool hold(std::size_t bytes) {
    return capped() && held_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes > max_held;
  }
  void unhold(std::size_t bytes) {
    if (capped()) held_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  }
  bool over() const { return held_bytes.load(std::memory_order_relaxed) > max_held; }
};

class Cache {
 public:
  // Make `best` this cache's first item in `order` if that one comes
  // strictly before it.
  virtual void offer(Victims order, Offer& best) = 0;
  // Take out the item this cache offered, if it is still held (a hit on
  // another thread may have taken it): else nothing.
  virtual Held take_offered(const Offer& offer) = 0;
  // Any one item, or nothing. Allocates nothing: a context's teardown
  // empties its arenas with it and must not fail half-way.
  virtual Held take_any() = 0;
  // Every item freed at or before `freed_by_ns`, appended to `out`.
  virtual void take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) = 0;
  // The bytes of the items it holds now.
  virtual std::size_t releasable_bytes() const = 0;
  // Its counters, added to `s`.
  virtual void add_counters(Stats& s) const = 0;
  // Its peaks down to its current values (Pool::reset_peaks).
  virtual void reset_peaks() = 0;

 protected:
  ~Cache() = default;
};

}  // namespace gpupool::core_detail
