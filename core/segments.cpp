// The segment cache (segments.hpp).
#include "core/segments.hpp"

#include <algorithm>
#include <optional>

namespace gpupool::core_detail {

SegmentCache::SegmentCache(Backend& backend, HeldCap& cap, std::size_t split_min,
                           std::uint64_t (*clock)())
    : backend_(backend), cap_(cap), split_min_(split_min), clock_(clock) {}

SegmentCache::Piece SegmentCache::make_piece(std::size_t size, Handle segment) {
  FreeSet one;
  one.emplace(size, segment);
  Piece p;
  p.size = size;
  p.segment = segment;
  p.node = one.extract(one.begin());
  return p;
}

void SegmentCache::add_free(Handle at, Piece& p) {
  p.free = true;
  p.node.value() = {p.size, at};
  free_pieces_.insert(std::move(p.node));
  c_.add_held(p.size);
}

void SegmentCache::remove_free(Handle at, Piece& p) {
  p.free = false;
  p.node = free_pieces_.extract({p.size, at});
  c_.remove_held(p.size);
}

// Fences are ordered: the later of two covers both.
std::map<Handle, SegmentCache::Piece>::iterator SegmentCache::free_piece(Handle at,
                                                                         std::uint64_t fence,
                                                                         std::uint64_t t_ns) {
  auto it = pieces_.find(at);
  Piece& p = it->second;
  p.fence = fence;
  p.freed_at_ns = t_ns;
  const bool is_ready = ready(p);
  const Handle segment = p.segment;
  it = merge_neighbours(
      pieces_, it,
      [&](const Piece& n) { return n.segment == segment && n.free && ready(n) == is_ready; },
      [&](Handle key, Piece& n) GPUPOOL_REQUIRES(mu_) { remove_free(key, n); });
  add_free(it->first, it->second);
  return it;
}

bool SegmentCache::coalesce() {
  return coalesce_free(
      pieces_,
      [&](const Piece& p, const Piece& n) {
        return p.free && n.free && n.segment == p.segment && ready(p) && ready(n);
      },
      [&](Handle at, Piece& p) GPUPOOL_REQUIRES(mu_) { remove_free(at, p); },
      [&](Handle at, Piece& p) GPUPOOL_REQUIRES(mu_) { add_free(at, p); });
}

bool SegmentCache::fits_once_ready(std::size_t want) {
  bool fits = false;
  std::size_t run = 0;  // bytes of the free pieces in a row so far, in one segment
  Handle run_segment = 0;
  std::size_t pending = 0;
  for (const auto& [at, p] : pieces_) {
    if (!p.free) {
      run = 0;
      continue;
    }
    if (!ready(p)) pending += p.size;
    if (run == 0 || p.segment != run_segment) run = 0, run_segment = p.segment;
    run += p.size;
    fits = fits || run >= want;
  }
  return fits && pending != 0;
}

Held SegmentCache::erase_segment(Handle base) {
  for (auto it = pieces_.find(base); it != pieces_.end() && it->second.segment == base;) {
    remove_free(it->first, it->second);
    it = pieces_.erase(it);
  }
  auto seg = segments_.find(base);
  const Held gone{base, seg->second.size, seg->second.data, nullptr};
  segments_.erase(seg);
  return gone;
}

SegmentCache::Cut SegmentCache::take(std::size_t want, bool first_attempt, bool* wait) {
  LockGuard lock(mu_);
  // The best fit among the ready pieces; else, once, the ready neighbours
  // merged (pieces freed apart, ready since) and again.
  auto fit = free_pieces_.end(), best = fit;
  for (int pass = 0; pass < 2 && best == free_pieces_.end(); ++pass) {
    if (pass == 1 && !coalesce()) break;
    fit = free_pieces_.lower_bound({want, 0});
    for (auto it = fit; it != free_pieces_.end(); ++it)
      if (ready(pieces_.find(it->second)->second)) {
        best = it;
        break;
      }
  }
  // After a wait, what is still pending came since: no second wait.
  if (!first_attempt) return best == free_pieces_.end() ? Cut{} : cut(best, want);
  // The best fit waits for the device: wait for it too, rather than cut a
  // larger ready piece. Pieces then land where they would without fences;
  // cut from larger free pieces, the sizes a program reuses would scatter,
  // and a request that needs one of those whole later finds it cut up and
  // takes a new segment (the CNN at batch 128 on the H100 took 2.10x peak
  // active so with a tenth larger allowed, 1.43x without;
  // scripts/h100-memory.sh, and bench_replay --sync-gap).
  if (best != free_pieces_.end() && best->first > fit->first) {
    *wait = true;
    return {};
  }
  // None ready fits, but free pieces in a row would once the device is done
  // with them.
  if (best == free_pieces_.end()) {
    *wait = fits_once_ready(want);
    return {};
  }
  return cut(best, want);
}

SegmentCache::Cut SegmentCache::cut(FreeSet::iterator best, std::size_t want) {
  const Handle at = best->second;
  Piece& p = pieces_.find(at)->second;
  Segment& seg = segments_.at(p.segment);
  if (seg.used++ == 0) cap_.unhold(seg.size);
  remove_free(at, p);
  if (p.size - want >= split_min_) {
    try {
      Piece rest = make_piece(p.size - want, p.segment);
      rest.fence = p.fence;
      rest.freed_at_ns = p.freed_at_ns;
      auto placed = pieces_.emplace(at + want, std::move(rest)).first;
      add_free(placed->first, placed->second);
      p.size = want;
    } catch (...) {
      // No memory to split: the whole piece serves.
    }
  }
  return {at, p.size, seg.data};
}

SegmentCache::Cut SegmentCache::add_segment(const BackendResult& r, std::size_t got,
                                            std::size_t want) {
  const Handle h = r.handle;
  std::size_t piece = got - want >= split_min_ ? want : got;
  try {
    Piece first = make_piece(piece, h);
    std::optional<Piece> rest;
    if (piece < got) {
      try {
        rest = make_piece(got - piece, h);
        rest->freed_at_ns = clock_();
      } catch (...) {
        first.size = piece = got;
      }
    }
    LockGuard lock(mu_);
    segments_.emplace(h, Segment{got, r.data, 1, 0});
    try {
      pieces_.emplace(h, std::move(first));
    } catch (...) {
      segments_.erase(h);
      throw;
    }
    if (rest) {
      try {
        auto placed = pieces_.emplace(h + piece, std::move(*rest)).first;
        add_free(placed->first, placed->second);
      } catch (...) {
        pieces_.at(h).size = piece = got;
      }
    }
  } catch (...) {
    backend_.release(h, got, r.data);
    throw;
  }
  return {h, piece, r.data};
}

Held SegmentCache::free(Handle at, std::uint64_t fence, std::uint64_t t_ns, bool reusable,
                        const std::atomic<bool>& keep, bool* over_cap) {
  LockGuard lock(mu_);
  auto it = free_piece(at, fence, t_ns);
  Segment& seg = segments_.at(it->second.segment);
  if (--seg.used != 0) return {};
  seg.freed_at_ns = t_ns;
  if (!reusable || !keep.load(std::memory_order_acquire) || cap_.too_large(seg.size))
    return erase_segment(it->second.segment);
  *over_cap = cap_.hold(seg.size);
  return {};
}

Held SegmentCache::forget(Handle at, std::uint64_t t_ns) {
  LockGuard lock(mu_);
  auto it = free_piece(at, 0, t_ns);
  Segment& seg = segments_.at(it->second.segment);
  if (--seg.used != 0) return {};
  return erase_segment(it->second.segment);
}

// Largest: the largest wholly free segment (the first of equals by
// address). Oldest: the one freed first, the largest of those freed at once.
void SegmentCache::offer(Victims order, Offer& best) {
  LockGuard lock(mu_);
  const Segment* mine = nullptr;
  Handle base = 0;
  for (const auto& [at, seg] : segments_) {
    if (seg.used != 0) continue;
    const bool better =
        !mine || (order == Victims::largest
                      ? seg.size > mine->size
                      : seg.freed_at_ns < mine->freed_at_ns ||
                            (seg.freed_at_ns == mine->freed_at_ns && seg.size > mine->size));
    if (better) mine = &seg, base = at;
  }
  if (mine && best.beaten_by(order, mine->size, mine->freed_at_ns))
    best = {this, mine->size, mine->freed_at_ns, {base, 0}};
}

// The offered segment, if it is still wholly free.
Held SegmentCache::take_offered(const Offer& offer) {
  LockGuard lock(mu_);
  const Handle base = offer.place[0];
  auto seg = segments_.find(base);
  if (seg == segments_.end() || seg->second.used != 0) return {};
  return erase_segment(base);
}

// The largest wholly free segment.
Held SegmentCache::take_any() {
  LockGuard lock(mu_);
  Handle base = 0;
  std::size_t size = 0;
  for (const auto& [at, seg] : segments_)
    if (seg.used == 0 && seg.size > size) base = at, size = seg.size;
  return base ? erase_segment(base) : Held{};
}

void SegmentCache::take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) {
  LockGuard lock(mu_);
  for (auto it = segments_.begin(); it != segments_.end();) {
    const Handle base = it->first;
    const bool old = it->second.used == 0 && it->second.freed_at_ns <= freed_by_ns;
    ++it;  // erase_segment erases the entry
    if (!old) continue;
    // Room first: once the segment leaves the maps nothing may fail.
    make_room(out, 1);
    out.push_back(erase_segment(base));
  }
}

std::size_t SegmentCache::releasable_bytes() const {
  LockGuard lock(mu_);
  std::size_t n = 0;
  for (const auto& [base, seg] : segments_)
    if (seg.used == 0) n += seg.size;
  return n;
}

}  // namespace gpupool::core_detail
