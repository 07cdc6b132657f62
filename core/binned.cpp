// The binned cache (binned.hpp): its slow side.
#include "core/binned.hpp"

#include "core/fork_wait.hpp"

namespace gpupool::core_detail {

BinnedCache::BinnedCache(Backend& backend, unsigned shards)
    : backend_(backend), count_(shards), shards_(new Shard[shards]) {}

BinnedCache::~BinnedCache() = default;

namespace {

Held held(Block* b) { return {b->handle, b->size, b->data, b}; }

}  // namespace

// Largest: each shard's largest non-empty bin (its blocks are of one size).
// Oldest: the front (oldest) block of each bin.
void BinnedCache::offer(Victims order, Offer& best) {
  for (unsigned i = 0; i < count_; ++i) {
    Shard& s = shards_[i];
    LockGuard lock(s.mu);
    auto consider = [&](std::size_t bin) GPUPOOL_REQUIRES(s.mu) {
      const Block* b = order == Victims::largest ? s.bins[bin].back() : s.bins[bin].front();
      if (best.beaten_by(order, b->size, b->freed_at_ns))
        best = {this, b->size, b->freed_at_ns, {i, bin}};
    };
    if (order == Victims::largest) {
      for (std::size_t bin = s.bins.size(); bin-- > 0;)
        if (!s.bins[bin].empty()) {
          consider(bin);
          break;
        }
    } else {
      for (std::size_t bin = 0; bin < s.bins.size(); ++bin)
        if (!s.bins[bin].empty()) consider(bin);
    }
  }
}

// The oldest block of the offered bin: the least likely to be still pending.
Held BinnedCache::take_offered(const Offer& offer) {
  Shard& s = shards_[offer.place[0]];
  const std::size_t bin = offer.place[1];
  LockGuard lock(s.mu);
  if (bin >= s.bins.size() || s.bins[bin].empty()) return {};
  Block* b = s.bins[bin].front();
  s.bins[bin].pop_front();
  s.unheld(b);
  return held(b);
}

Held BinnedCache::take_any() {
  for (unsigned i = 0; i < count_; ++i) {
    Shard& s = shards_[i];
    LockGuard lock(s.mu);
    for (auto& q : s.bins)
      if (!q.empty()) {
        Block* b = q.back();
        q.pop_back();
        s.unheld(b);
        return held(b);
      }
  }
  return {};
}

void BinnedCache::take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) {
  for (unsigned i = 0; i < count_; ++i) {
    Shard& s = shards_[i];
    LockGuard lock(s.mu);
    if (s.c.held_blocks == 0) continue;  // the common case once a second: no walk
    for (auto& v : s.bins) {
      // Oldest first in each bin.
      auto end = v.begin();
      while (end != v.end() && (*end)->freed_at_ns <= freed_by_ns) ++end;
      if (end == v.begin()) continue;
      // Room first: once a block leaves its bin nothing may fail.
      make_room(out, static_cast<std::size_t>(end - v.begin()));
      for (auto it = v.begin(); it != end; ++it) {
        s.unheld(*it);
        out.push_back(held(*it));
      }
      v.pop_front(static_cast<std::size_t>(end - v.begin()));
    }
  }
}

std::size_t BinnedCache::releasable_bytes() const {
  std::size_t n = 0;
  for (unsigned i = 0; i < count_; ++i) {
    Shard& s = shards_[i];
    LockGuard lock(s.mu);
    // Parked pieces: what of them would go back once in the range (the
    // range gives back whole granules only).
    n += s.c.held_bytes - s.parked_bytes + s.parked_whole;
  }
  return n;
}

void BinnedCache::add_counters(Stats& s) const {
  for (unsigned i = 0; i < count_; ++i) {
    LockGuard lock(shards_[i].mu);
    s += shards_[i].c;
  }
}

void BinnedCache::reset_peaks() {
  for (unsigned i = 0; i < count_; ++i) {
    LockGuard lock(shards_[i].mu);
    shards_[i].c.reset_peaks();
  }
}

bool BinnedCache::any_active() const {
  for (unsigned i = 0; i < count_; ++i) {
    LockGuard lock(shards_[i].mu);
    if (shards_[i].c.active_blocks != 0 || shards_[i].in_flight != 0) return true;
  }
  return false;
}

void BinnedCache::add_bins(std::vector<BinSnapshot>& bins) const {
  for (unsigned i = 0; i < count_; ++i) {
    Shard& s = shards_[i];
    LockGuard lock(s.mu);
    if (bins.size() < s.bins.size()) bins.resize(s.bins.size());
    for (std::size_t bin = 0; bin < s.bins.size(); ++bin)
      for (Block* b : s.bins[bin]) {
        bins[bin].alloc_size = b->size;
        ++bins[bin].held_blocks;
        bins[bin].held_bytes += b->size;
      }
  }
}

// fork(): every shard at once (the analysis cannot follow locks taken in a
// loop; the parent's and child's handlers release them).
bool BinnedCache::lock_all() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (unsigned i = 0; i < count_; ++i)
    if (!fork_wait::take(shards_[i].mu)) return false;
  return true;
}

void BinnedCache::unlock_all() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (unsigned i = 0; i < count_; ++i) shards_[i].mu.unlock();
}

// fork()'s child, every shard's lock held (lock_all).
void BinnedCache::forget_growth() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (unsigned i = 0; i < count_; ++i) {
    for (BinGrowth& g : shards_[i].growth) g.growing = false;
    shards_[i].in_flight = 0;  // a parent's thread's, on its way into the range
  }
}

}  // namespace gpupool::core_detail
