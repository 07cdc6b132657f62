// The binned cache (class BinnedCache in pool.hpp, so that an arena holds it
// in place): blocks the program freed, kept by size class (bins.hpp) in one
// shard per thread slot, each with its own lock, bins and counters, so
// threads that allocate and free the same sizes share neither a lock nor a
// written cache line. Its hit path is here, inline. Internal to core/.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/cache.hpp"
#include "core/lock_rank.hpp"
#include "core/pool.hpp"
#include "core/spin_lock.hpp"

namespace gpupool::core_detail {

// One bin's held blocks, oldest first. A queue over a vector: blocks leave
// from the front (oldest, the first whose fence passes) as often as from the
// back (newest, best in cache), and erasing the front of a vector would move
// every other block each time (64 of them in a growing safe-reuse loop).
class BinQueue {
 public:
  bool empty() const { return head_ == v_.size(); }
  std::size_t size() const { return v_.size() - head_; }
  Block* front() const { return v_[head_]; }
  Block* back() const { return v_.back(); }
  Block* const* begin() const { return v_.data() + head_; }
  Block* const* end() const { return v_.data() + v_.size(); }
  void push_back(Block* b) { v_.push_back(b); }
  // Room for one more push_back, so that it cannot throw. False when even
  // that allocation fails.
  bool reserve_one() noexcept {
    if (v_.size() < v_.capacity()) return true;
    try {
      v_.reserve(std::max<std::size_t>(8, v_.capacity() * 2));
      return true;
    } catch (...) {
      return false;
    }
  }
  void pop_back() {
    v_.pop_back();
    if (empty()) clear();
  }
  // Drop the n oldest; the space they leave is reclaimed once it is at least
  // half the vector, so each block is moved O(1) times on average.
  void pop_front(std::size_t n = 1) {
    head_ += n;
    if (empty()) clear();
    else if (head_ >= 16 && head_ * 2 >= v_.size()) {
      v_.erase(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(head_));
      head_ = 0;
    }
  }
  void clear() {
    v_.clear();
    head_ = 0;
  }

 private:
  std::vector<Block*> v_;
  std::size_t head_ = 0;
};

// Per bin of a shard, under the shard's lock: ns the bin's waits took less
// ns its growths took. The bin grows only while this is >= 0, one thread at
// a time (Pool::grow). Per shard, so that threads whose blocks all wait for
// the device do not meet at one lock on every allocation.
struct BinGrowth {
  std::int64_t credit_ns = 0;
  bool growing = false;
};

// One thread slot's part of an arena. Its counters are the arena's for the
// blocks this slot handed out (pieces of segments too), so the hit path
// writes only its own shard. Peaks are per shard: exact when one thread
// allocates, the sum of per-shard peaks (an upper bound) when several do.
struct alignas(64) Shard {
  Ranked<LockRank::arena_shard, SpinLock> mu;
  std::vector<BinQueue> bins GPUPOOL_GUARDED_BY(mu);  // by bin number; back = most recently freed
  Stats c GPUPOOL_GUARDED_BY(mu);
  std::vector<BinGrowth> growth GPUPOOL_GUARDED_BY(mu);  // by bin number
  BinGrowth& growth_of(std::size_t bin) GPUPOOL_REQUIRES(mu) {
    if (growth.size() <= bin) growth.resize(bin + 1);
    return growth[bin];
  }

  // Pieces of the arena's range that the program freed, parked here whole
  // (still in use as the range sees them) for the next request of their
  // size from this slot: a hit and a free without the range's lock, which
  // threads would otherwise all meet at (Pool::free_piece). Oldest first.
  // Counted held. A request of this slot's that they cannot serve first
  // returns them to the range (RangeCache::unpark_slot), and a growth of
  // the range and every release policy those of every slot
  // (RangeCache::unpark_all; idle release those old enough), so parking
  // never makes the range map more than it would have, but for the stock.
  //
  // The stock: a slot whose misses for one size come back to back (a loop
  // that frees a piece and at once asks for its size again, doing nothing
  // else in between) keeps up to kParkSlots pieces of that size parked
  // while they wait, taking another from the range rather than waiting
  // (Pool::allocate_range_piece), and waits for the oldest once the stock
  // is full. One synchronization then readies several, and other threads'
  // synchronizations ready them too: the bins' pending growth, for a
  // range. Within a bound of bytes per slot (RangeCache::stock_budget); it
  // goes back to the range as any parked piece does. Training loops' misses
  // are never back to back (bench_replay on every trace: the same memory
  // to the byte).
  static constexpr unsigned kParkSlots = 32;  // with a stock
  static constexpr unsigned kParkKept = 4;    // without
  Block* parked[kParkSlots] GPUPOOL_GUARDED_BY(mu) = {};
  unsigned parked_n GPUPOOL_GUARDED_BY(mu) = 0;
  std::size_t parked_bytes GPUPOOL_GUARDED_BY(mu) = 0;
  std::size_t parked_whole GPUPOOL_GUARDED_BY(mu) = 0;  // their whole granules' bytes
  // Frees that still touch the arena after their piece left the active
  // count (a piece pushed out on its way into the range, the cap): the
  // arena is not destroyed meanwhile (BinnedCache::any_active).
  unsigned in_flight GPUPOOL_GUARDED_BY(mu) = 0;
  std::atomic<unsigned> parked_any{0};  // parked_n, for a look without the lock
  // The slot's misses for the stock: allocations of range pieces whose size
  // the park held only pieces of that the device may still use. Back to
  // back while each is for the same size as the last and comes within
  // kBackToBackNs of the last one's return (the program's own time between
  // them; not this pool's, which threads meeting at the range's lock or at
  // a synchronization would lengthen). A slot stocks after kStockStreak
  // such misses in a row, and stops after as many more that were not (a
  // thread of a busy host is descheduled now and then). While it stocks,
  // misses are rarer the better the stock serves: the gap allowed grows by
  // kBackToBackNs for each piece of that size the park served since the
  // last miss. Only where the slot's share of the growth budget holds a
  // piece of that size (`budget`: RangeCache::stock_budget).
  static constexpr std::uint64_t kBackToBackNs = 10'000;
  static constexpr unsigned kStockStreak = 32;
  std::uint64_t last_miss_ns GPUPOOL_GUARDED_BY(mu) = 0;
  std::uint64_t size_hits GPUPOOL_GUARDED_BY(mu) = 0;  // the park's hits of streak_size
  std::uint64_t size_hits_at_last_miss GPUPOOL_GUARDED_BY(mu) = 0;
  std::size_t streak_size GPUPOOL_GUARDED_BY(mu) = 0;
  unsigned miss_streak GPUPOOL_GUARDED_BY(mu) = 0;
  bool keeps_stock(std::size_t budget) const GPUPOOL_REQUIRES(mu) {
    return miss_streak >= kStockStreak && streak_size != 0 && streak_size <= budget;
  }
  bool stocking(std::size_t want, std::size_t budget) const GPUPOOL_REQUIRES(mu) {
    return keeps_stock(budget) && streak_size == want;
  }
  // Whether a miss at `at` comes back to back with the last one.
  bool back_to_back(std::uint64_t at) const GPUPOOL_REQUIRES(mu) {
    const std::uint64_t hits = miss_streak >= kStockStreak ? size_hits - size_hits_at_last_miss : 0;
    return at - last_miss_ns < kBackToBackNs * (hits + 1);
  }
  // Such a miss for `want` bytes: from `at` until its allocation returned
  // at `done` (the cost clock).
  void missed(std::size_t want, std::uint64_t at, std::uint64_t done) GPUPOOL_REQUIRES(mu) {
    if (want != streak_size) miss_streak = 0;
    if (back_to_back(at)) {
      miss_streak = std::min(miss_streak + 1, 2 * kStockStreak);
    } else {
      miss_streak = miss_streak > kStockStreak ? miss_streak - 1 : 0;
    }
    streak_size = want;
    last_miss_ns = done;
    size_hits_at_last_miss = size_hits;
  }
  // Whether the range would hand out the parked piece `b` whole for `want`
  // bytes: at least `want`, less than `want` + `slack` long.
  static bool serves(const Block* b, std::size_t want, std::size_t slack) {
    return b->size >= want && b->size - want < slack;
  }
  // The parked pieces that would serve `want` but wait for the device: how
  // many, and the oldest one's fence.
  unsigned stocked(std::size_t want, std::size_t slack, std::uint64_t* oldest) const
      GPUPOOL_REQUIRES(mu) {
    unsigned n = 0;
    for (unsigned i = 0; i < parked_n; ++i)
      if (const Block* b = parked[i]; serves(b, want, slack) && b->fence != 0)
        if (n++ == 0) *oldest = b->fence;
    return n;
  }

  static std::size_t whole_granules(const Block* b, std::size_t granule) {
    const Handle from = (b->handle + granule - 1) / granule * granule;
    const Handle to = (b->handle + b->size) / granule * granule;
    return to > from ? to - from : 0;
  }
  // `b` parked; the oldest parked piece pushed out when the park is full:
  // kParkKept pieces, or with a stock kParkSlots and `budget` bytes (the
  // caller returns it to the range).
  [[nodiscard]] Block* park(Block* b, std::size_t granule, std::size_t budget)
      GPUPOOL_REQUIRES(mu) {
    Block* out = nullptr;
    if (parked_n == kParkSlots ||
        (parked_n >= kParkKept && (!keeps_stock(budget) || parked_bytes + b->size > budget)))
      out = unpark_at(0, granule);
    parked[parked_n++] = b;
    parked_bytes += b->size;
    parked_whole += whole_granules(b, granule);
    c.add_held(b->size);
    parked_any.store(parked_n, std::memory_order_relaxed);
    return out;
  }
  // The newest parked piece that serves `want` and that the device is done
  // with, out of the park; or nullptr. A stock's pieces are one size and
  // wait for the device in the order they were freed, so for a slot that
  // stocks `want` (`oldest_first`) the oldest: the newest are the ones
  // still pending, which a scan from the newest would pass every time.
  [[gnu::always_inline]] Block* take_parked(std::size_t want, std::size_t slack, Backend& backend,
                                            std::size_t granule, bool oldest_first)
      GPUPOOL_REQUIRES(mu) {
    auto usable = [&](const Block* b) {
      return serves(b, want, slack) && (b->fence == 0 || backend.reusable(b->fence));
    };
    if (oldest_first) {
      for (unsigned i = 0; i < parked_n; ++i)
        if (usable(parked[i])) return unpark_at(i, granule);
      return nullptr;
    }
    for (unsigned i = parked_n; i-- > 0;)
      if (usable(parked[i])) return unpark_at(i, granule);
    return nullptr;
  }
  Block* unpark_at(unsigned i, std::size_t granule) GPUPOOL_REQUIRES(mu) {
    Block* b = parked[i];
    for (unsigned k = i + 1; k < parked_n; ++k) parked[k - 1] = parked[k];
    parked[--parked_n] = nullptr;
    parked_bytes -= b->size;
    parked_whole -= whole_granules(b, granule);
    c.remove_held(b->size);
    parked_any.store(parked_n, std::memory_order_relaxed);
    return b;
  }

  void add_active(const Block* b) GPUPOOL_REQUIRES(mu) {
    ++c.active_blocks;
    c.active_bytes += b->requested;
    c.peak_active_blocks = std::max(c.peak_active_blocks, c.active_blocks);
    c.peak_active_bytes = std::max(c.peak_active_bytes, c.active_bytes);
  }
  void remove_active(const Block* b) GPUPOOL_REQUIRES(mu) {
    --c.active_blocks;
    c.active_bytes -= b->requested;
  }
  // Room to hold a block of `bin` without allocating in push_held().
  bool room_for(std::size_t bin) noexcept GPUPOOL_REQUIRES(mu) {
    try {
      if (bins.size() <= bin) bins.resize(bin + 1);
    } catch (...) {
      return false;
    }
    return bins[bin].reserve_one();
  }
  // After room_for(b->bin).
  void push_held(Block* b) GPUPOOL_REQUIRES(mu) {
    bins[b->bin].push_back(b);
    c.add_held(b->size);
  }
  void unheld(const Block* b) GPUPOOL_REQUIRES(mu) { c.remove_held(b->size); }
  // A ready block of `bin`, or nullptr; *pending is set when the bin only has
  // blocks whose fence has not passed, and their number added to
  // *pending_blocks. Fences grow with push order, so the oldest block (front)
  // is the most likely to be ready.
  [[gnu::always_inline]] Block* take(std::size_t bin, Backend& backend, bool* pending,
                                     std::size_t* pending_blocks, std::uint64_t* oldest_fence)
      GPUPOOL_REQUIRES(mu) {
    if (bin >= bins.size() || bins[bin].empty()) return nullptr;
    Block* b = take_ready(bins[bin], backend);
    if (!b) {
      *pending = true;
      *pending_blocks += bins[bin].size();
      *oldest_fence = std::min(*oldest_fence, bins[bin].front()->fence);
    }
    return b;
  }
  // A ready held block of the smallest bin in (bin, last] (a request its own
  // bin cannot serve, borrowing a larger block), or nullptr.
  Block* take_larger(std::size_t bin, std::size_t last, Backend& backend) GPUPOOL_REQUIRES(mu) {
    for (std::size_t k = bin + 1; k <= last && k < bins.size(); ++k)
      if (!bins[k].empty())
        if (Block* b = take_ready(bins[k], backend)) return b;
    return nullptr;
  }
  // The newest block of a non-empty bin if the device is done with it, else
  // the oldest if that one is, else nullptr (all pending).
  [[gnu::always_inline]] Block* take_ready(BinQueue& v, Backend& backend) GPUPOOL_REQUIRES(mu) {
    Block* b = v.back();
    if (b->fence == 0 || backend.reusable(b->fence)) {
      v.pop_back();
    } else if (backend.reusable(v.front()->fence)) {
      b = v.front();
      v.pop_front();
    } else {
      return nullptr;
    }
    unheld(b);
    return b;
  }
};

inline Shard& BinnedCache::shard(unsigned i) const { return shards_[i]; }

inline BinnedCache::Found BinnedCache::take(unsigned my, std::size_t bin, std::size_t size,
                                            bool look_past_pending, std::size_t borrow_last) {
  Found f;
  Shard& mine = shards_[my];
  {
    LockGuard lock(mine.mu);
    f.block = mine.take(bin, backend_, &f.pending, &f.pending_blocks, &f.oldest_fence);
    if (f.block) {
      f.block->requested = size;
      ++mine.c.hits;
      mine.add_active(f.block);
      return f;
    }
  }
  take_elsewhere(my, bin, size, look_past_pending, borrow_last, f);
  return f;
}

template <class Keep, class OnHold>
bool BinnedCache::hold(Block* b, Keep&& keep, OnHold&& on_hold) {
  Shard& s = shards_[b->shard];
  LockGuard lock(s.mu);
  s.remove_active(b);
  if (!keep() || !s.room_for(b->bin)) return false;
  on_hold();
  if (b->fence != 0) ++s.c.pending_frees;
  s.push_held(b);
  return true;
}

inline void BinnedCache::take_elsewhere(unsigned my, std::size_t bin, std::size_t size,
                                        bool look_past_pending, std::size_t borrow_last, Found& f) {
  Block* b = nullptr;
  const bool skip_others = f.pending && !look_past_pending;
  for (unsigned i = 1; i < count_ && !b && !skip_others; ++i) {
    Shard& other = shards_[(my + i) & (count_ - 1)];
    LockGuard lock(other.mu);
    b = other.take(bin, backend_, &f.pending, &f.pending_blocks, &f.oldest_fence);
  }
  // Nothing of this size: a held block of a larger bin serves it rather than
  // a fresh one (sizes a program uses in one phase and not the next would
  // otherwise each keep their own blocks).
  if (!b && !f.pending && borrow_last != kNoBorrowing) {
    for (unsigned i = 0; i < count_ && !b; ++i) {
      Shard& s = shards_[(my + i) & (count_ - 1)];
      LockGuard lock(s.mu);
      b = s.take_larger(bin, borrow_last, backend_);
    }
  }
  if (b) {
    b->shard = static_cast<std::uint8_t>(my);
    b->requested = size;
    Shard& mine = shards_[my];
    LockGuard lock(mine.mu);
    ++mine.c.hits;
    mine.add_active(b);
  }
  f.block = b;
}

}  // namespace gpupool::core_detail
