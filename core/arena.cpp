// An arena (pool.hpp): its caches and its counters of backend calls.
#include "core/arena.hpp"

#include <algorithm>

namespace gpupool {

using namespace core_detail;

Arena::Arena(std::unique_ptr<Backend> backend, ArenaOptions options, Group* group, unsigned shards,
             std::uint64_t (*clock)())
    : backend_(std::move(backend)),
      options_(std::move(options)),
      group_(group),
      binned_(*backend_, shards) {
  if (options_.split_min && options_.expandable && backend_->granule()) {
    const std::size_t g = backend_->granule();
    const std::size_t granule = std::max(g, (options_.granule + g - 1) / g * g);
    // Address space is cheap: twice what the device offers (a 64-bit
    // space holds it), so the pieces' holes seldom stop a growth.
    const std::size_t reserve = 2 * std::min(options_.max_block, std::size_t{1} << 40);
    ranges_ =
        std::make_unique<RangeCache>(*backend_, group->cap, binned_, granule, reserve,
                                     options_.split_min, options_.pending_growth, retired_, clock);
  } else if (options_.split_min) {
    segments_ = std::make_unique<SegmentCache>(*backend_, group->cap, options_.split_min, clock);
  }
  // The release policies see a wholly free segment (or free granules)
  // before held blocks of the same size or age.
  if (segments_) caches_[cache_count_++] = segments_.get();
  if (ranges_) caches_[cache_count_++] = ranges_.get();
  caches_[cache_count_++] = &binned_;
  if (HeldOutside* o = backend_->outside()) {
    outside_ = std::make_unique<OutsideCache>(*o, retired_);
    caches_[cache_count_++] = outside_.get();
  }
}

Arena::~Arena() = default;

Stats Arena::stats() const {
  Stats s;
  binned_.add_counters(s);
  if (segments_) segments_->add_counters(s);
  if (ranges_) ranges_->add_counters(s);
  if (outside_) outside_->add_counters(s);
  LockGuard lock(slow_mu_);
  s += slow_;
  return s;
}

std::size_t Arena::releasable_bytes() const {
  std::size_t n = 0;
  for (const Cache* c : caches()) n += c->releasable_bytes();
  return n;
}

void Arena::give_back(Handle h, std::size_t size, void* data, bool drop) {
  if (drop) {
    backend_->drop(h, size, data);
  } else {
    backend_->release(h, size, data);
  }
  LockGuard lock(slow_mu_);
  if (!drop) ++slow_.backend_frees;
  slow_.managed_bytes -= size;
}

void Arena::let_go(const Held& item, bool drop) {
  if (item.outside) {  // given back already, and never in the cap's count
    if (item.size) count(&Stats::backend_frees);
    return;
  }
  if (item.unmapped) {  // given back (or dropped) already, out of the cap's count
    LockGuard lock(slow_mu_);
    if (!drop) ++slow_.backend_frees;
    slow_.managed_bytes -= item.size;
    return;
  }
  group_->cap.unhold(item.size);
  give_back(item.handle, item.size, item.data, drop);
  delete item.block;
}

void Arena::reset_peaks() {
  for (Cache* c : caches()) c->reset_peaks();
  LockGuard lock(slow_mu_);
  slow_.reset_peaks();
}

void Arena::count(std::uint64_t Stats::*counter, std::uint64_t n) {
  LockGuard lock(slow_mu_);
  slow_.*counter += n;
}

}  // namespace gpupool
