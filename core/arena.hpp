// Arena's internals, shared by the pool's files (pool.cpp, segments.cpp):
// a bin's queue of held blocks, the per-thread shards and the groups.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/lock_rank.hpp"
#include "core/pool.hpp"
#include "core/spin_lock.hpp"

namespace gpupool {

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

// Held and active counts live in the shard a block belongs to, so the hit
// path writes only its own shard. Peaks are per shard: exact when one thread
// allocates, the sum of per-shard peaks (an upper bound) when several do.
struct alignas(64) Arena::Shard {
  Ranked<LockRank::arena_shard, SpinLock> mu;
  std::vector<BinQueue> bins;  // by bin number; back = most recently freed
  Stats c;
  std::vector<BinGrowth> growth;  // by bin number (Pool::grow)
  BinGrowth& growth_of(std::size_t bin) {
    if (growth.size() <= bin) growth.resize(bin + 1);
    return growth[bin];
  }

  void add_active(const Block* b) {
    ++c.active_blocks;
    c.active_bytes += b->requested;
    c.peak_active_blocks = std::max(c.peak_active_blocks, c.active_blocks);
    c.peak_active_bytes = std::max(c.peak_active_bytes, c.active_bytes);
  }
  void remove_active(const Block* b) {
    --c.active_blocks;
    c.active_bytes -= b->requested;
  }
  // Room to hold a block of `bin` without allocating in push_held().
  bool room_for(std::size_t bin) noexcept {
    try {
      if (bins.size() <= bin) bins.resize(bin + 1);
    } catch (...) {
      return false;
    }
    return bins[bin].reserve_one();
  }
  // After room_for(b->bin).
  void push_held(Block* b) {
    bins[b->bin].push_back(b);
    c.add_held(b->size);
  }
  void unheld(const Block* b) { c.remove_held(b->size); }
  // A ready block of `bin`, or nullptr; *pending is set when the bin only has
  // blocks whose fence has not passed, and their number added to
  // *pending_blocks. Fences grow with push order, so the oldest block (front)
  // is the most likely to be ready.
  Block* take(std::size_t bin, Backend& backend, bool* pending, std::size_t* pending_blocks) {
    if (bin >= bins.size() || bins[bin].empty()) return nullptr;
    Block* b = take_ready(bins[bin], backend);
    if (!b) {
      *pending = true;
      *pending_blocks += bins[bin].size();
    }
    return b;
  }
  // A ready held block of the smallest bin in (bin, last] (a request its own
  // bin cannot serve, borrowing a larger block), or nullptr.
  Block* take_larger(std::size_t bin, std::size_t last, Backend& backend) {
    for (std::size_t k = bin + 1; k <= last && k < bins.size(); ++k)
      if (!bins[k].empty())
        if (Block* b = take_ready(bins[k], backend)) return b;
    return nullptr;
  }
  // The newest block of a non-empty bin if the device is done with it, else
  // the oldest if that one is, else nullptr (all pending).
  Block* take_ready(BinQueue& v, Backend& backend) {
    Block* b = v.back();
    if (b->fence == 0 || backend.passed(b->fence)) {
      v.pop_back();
    } else if (backend.passed(v.front()->fence)) {
      b = v.front();
      v.pop_front();
    } else {
      return nullptr;
    }
    unheld(b);
    return b;
  }
};

// Arenas drawing on the same memory. The cap counter is kept only when a cap
// is set, so an uncapped pool has no shared write on its hit path.
struct Arena::Group {
  std::string name;
  std::size_t max_held = SIZE_MAX;
  std::atomic<std::uint64_t> held_bytes{0};
  std::vector<Arena*> arenas;  // under the arena list's lock (arenas.hpp)
  bool capped() const { return max_held != SIZE_MAX; }
  void unhold(std::size_t bytes) {
    if (capped()) held_bytes.fetch_sub(bytes, std::memory_order_relaxed);
  }
};

}  // namespace gpupool
