// Segments (core/segments.hpp): the pool's path for requests of at least
// ArenaOptions::split_min bytes.
#include "core/arena.hpp"
#include "core/segments.hpp"

#include <memory>
#include <optional>

namespace gpupool {
namespace {

std::size_t round_up(std::size_t n, std::size_t to) {
  return n > SIZE_MAX - to ? SIZE_MAX : (n + to - 1) / to * to;
}

}  // namespace

std::map<Handle, Arena::Segments::Piece>::iterator Arena::Segments::free_piece(
    Handle at, std::uint64_t fence, std::uint64_t t_ns) {
  auto it = pieces.find(at);
  Piece& p = it->second;
  p.fence = fence;
  p.freed_at_ns = t_ns;
  // Fences are ordered: the later of two covers both.
  auto absorb = [](Piece& into, const Piece& from) {
    into.size += from.size;
    into.fence = std::max(into.fence, from.fence);
    into.freed_at_ns = std::max(into.freed_at_ns, from.freed_at_ns);
  };
  if (auto next = std::next(it);
      next != pieces.end() && next->second.segment == p.segment && next->second.free) {
    remove_free(next->first, next->second);
    absorb(p, next->second);
    pieces.erase(next);
  }
  if (it != pieces.begin())
    if (auto prev = std::prev(it); prev->second.segment == p.segment && prev->second.free) {
      remove_free(prev->first, prev->second);
      absorb(prev->second, p);
      pieces.erase(it);
      it = prev;
    }
  add_free(it->first, it->second);
  return it;
}

AllocResult Pool::allocate_split(Arena& a, unsigned my, std::size_t size, std::uint64_t hint) {
  Arena::Segments& sg = *a.segments_;
  Backend& backend = *a.backend_;
  Arena::Shard& mine = a.shards_[my];
  const std::size_t want = round_up(size, kPieceGranule);
  const std::size_t min_rest = a.options_.split_min;
  // Before anything changes: a failure here leaves nothing half-done.
  std::unique_ptr<Block> b(new Block);
  b->requested = size;
  b->arena = &a;
  b->shard = static_cast<std::uint8_t>(my);
  b->split = true;
  b->bin = 0;

  std::optional<BackendResult> fresh;  // a segment allocated instead of waiting
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::size_t pending = 0;  // bytes of free pieces that fit but the device may still use
    bool found = false;
    {
      std::lock_guard lock(sg.mu);
      for (auto it = sg.free_pieces.lower_bound({want, 0}); it != sg.free_pieces.end(); ++it) {
        const Handle at = it->second;
        Arena::Segments::Piece& p = sg.pieces.find(at)->second;
        if (p.fence != 0 && !backend.passed(p.fence)) {
          pending += p.size;
          continue;
        }
        if (sg.whole(at, p)) a.group_->unhold(p.size);
        sg.remove_free(at, p);  // `it` is gone: the loop ends here
        if (p.size - want >= min_rest) {
          try {
            Arena::Segments::Piece rest = Arena::Segments::make_piece(p.size - want, p.segment);
            rest.fence = p.fence;
            rest.freed_at_ns = p.freed_at_ns;
            auto placed = sg.pieces.emplace(at + want, std::move(rest)).first;
            sg.add_free(placed->first, placed->second);
            p.size = want;
          } catch (...) {
            // No memory to split: the whole piece serves.
          }
        }
        b->handle = at;
        b->size = p.size;
        b->data = sg.segments.at(p.segment).data;
        found = true;
        break;
      }
    }
    if (found) {
      {
        std::lock_guard lock(mine.mu);
        ++mine.c.hits;
        mine.add_active(b.get());
      }
      Block* out = b.release();
      if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_allocate(a, *out, true);
      return {out, BackendStatus::ok, 0, true};
    }
    if (pending == 0) break;
    // Only pieces the device may still use fit: a fresh segment, by
    // Pool::grow's rule (its waits so far took at least as long as its
    // growths; the pending bytes and the new ones within pending_growth),
    // or one wait for them all.
    if (attempt == 0 && pending <= a.options_.pending_growth &&
        want <= a.options_.pending_growth - pending) {
      bool mine_to_grow = false;
      {
        std::lock_guard lock(sg.mu);
        if (!sg.growth.growing && sg.growth.credit_ns >= 0) mine_to_grow = sg.growth.growing = true;
      }
      if (mine_to_grow) {
        const std::size_t bytes = std::max(want, std::min(round_up(want, kSegmentGranule),
                                                          a.options_.max_block));
        const std::uint64_t t0 = cost_now();
        BackendResult r = backend.allocate(bytes, hint);
        const std::uint64_t took = cost_now() - t0;
        std::lock_guard lock(sg.mu);
        sg.growth.growing = false;
        if (r.status == BackendStatus::ok) {
          sg.growth.credit_ns -= static_cast<std::int64_t>(took);
          fresh = r;
          break;
        }
      }
    }
    const std::uint64_t t0 = cost_now();
    backend.wait_all();
    const std::uint64_t took = cost_now() - t0;
    {
      std::lock_guard lock(sg.mu);
      sg.growth.credit_ns += static_cast<std::int64_t>(took);
    }
    std::lock_guard lock(mine.mu);
    ++mine.c.fence_waits;
  }

  // A new segment: the request rounded up to whole segment granules, its
  // remainder free for the next requests.
  const std::size_t seg_bytes =
      std::max(want, std::min(round_up(want, kSegmentGranule), a.options_.max_block));
  bool exact = false;
  BackendResult r = fresh ? *fresh : backend_allocate(a, seg_bytes, size, hint, &exact);
  if (r.status != BackendStatus::ok) {
    std::lock_guard lock(mine.mu);
    ++mine.c.misses;
    return {nullptr, r.status, r.error, false};
  }
  const Handle h = r.handle;
  const std::size_t got = exact ? size : seg_bytes;
  std::size_t piece = !exact && got - want >= min_rest ? want : got;
  try {
    Arena::Segments::Piece first = Arena::Segments::make_piece(piece, h);
    std::optional<Arena::Segments::Piece> rest;
    if (piece < got) {
      try {
        rest = Arena::Segments::make_piece(got - piece, h);
        rest->freed_at_ns = now();
      } catch (...) {
        first.size = piece = got;
      }
    }
    std::lock_guard lock(sg.mu);
    sg.segments.emplace(h, Arena::Segments::Segment{got, r.data});
    try {
      sg.pieces.emplace(h, std::move(first));
    } catch (...) {
      sg.segments.erase(h);
      throw;
    }
    if (rest) {
      try {
        auto placed = sg.pieces.emplace(h + piece, std::move(*rest)).first;
        sg.add_free(placed->first, placed->second);
      } catch (...) {
        sg.pieces.at(h).size = piece = got;
      }
    }
  } catch (...) {
    backend.release(h, got);
    throw;
  }
  b->handle = h;
  b->size = piece;
  b->data = r.data;
  {
    std::lock_guard lock(mine.mu);
    ++mine.c.misses;
    mine.add_active(b.get());
  }
  {
    std::lock_guard lock(a.slow_mu_);
    ++a.slow_.backend_allocs;
    a.slow_.managed_bytes += got;
    a.slow_.peak_managed_bytes = std::max(a.slow_.peak_managed_bytes, a.slow_.managed_bytes);
  }
  Block* out = b.release();
  if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_allocate(a, *out, false);
  return {out, BackendStatus::ok, 0, false};
}

void Pool::free_split(Block* b) {
  Arena& a = *b->arena;
  Arena::Segments& sg = *a.segments_;
  const std::uint64_t fence = a.backend_->fence();
  const std::uint64_t t = now();
  {
    Arena::Shard& s = a.shards_[b->shard];
    std::lock_guard lock(s.mu);
    s.remove_active(b);
    if (fence != 0) ++s.c.pending_frees;
  }
  Handle gone = 0;  // a whole segment to release at once (holding stopped)
  std::size_t gone_size = 0;
  bool over_cap = false;
  {
    std::lock_guard lock(sg.mu);
    auto it = sg.free_piece(b->handle, fence, t);
    if (sg.whole(it->first, it->second)) {
      // Checked under the store's lock: stop_holding() clears the flag
      // before its free_held() takes this lock, so it never misses it. A
      // block never to be reused (never_reuse: another process may map
      // it) is its whole segment: it goes back at once.
      if (!b->pooled || !holding_.load(std::memory_order_acquire)) {
        gone = it->first;
        gone_size = it->second.size;
        sg.remove_free(it->first, it->second);
        sg.pieces.erase(it);
        sg.segments.erase(gone);
      } else if (a.group_->capped()) {
        over_cap = a.group_->held_bytes.fetch_add(it->second.size, std::memory_order_relaxed) +
                       it->second.size >
                   a.group_->max_held;
      }
    }
  }
  delete b;
  if (gone) {
    a.backend_->release(gone, gone_size);
    std::lock_guard lock(a.slow_mu_);
    ++a.slow_.backend_frees;
    a.slow_.managed_bytes -= gone_size;
  }
  if (over_cap) enforce_cap(a);
}

// The driver already freed the piece's memory (its context is gone) or it is
// a forked parent's: no backend call but drop, once its segment is all free.
void Pool::forget_split(Block* b) {
  Arena& a = *b->arena;
  Arena::Segments& sg = *a.segments_;
  Handle gone = 0;
  std::size_t gone_size = 0;
  {
    std::lock_guard lock(sg.mu);
    auto it = sg.free_piece(b->handle, 0, now());
    if (sg.whole(it->first, it->second)) {
      gone = it->first;
      gone_size = it->second.size;
      sg.remove_free(it->first, it->second);
      sg.pieces.erase(it);
      sg.segments.erase(gone);
    }
  }
  if (gone) {
    a.backend_->drop(gone, gone_size);
    std::lock_guard lock(a.slow_mu_);
    a.slow_.managed_bytes -= gone_size;
  }
}

std::size_t Pool::release_segments(Arena& a, std::size_t wanted, bool drop,
                                   std::uint64_t freed_by_ns, std::size_t* count) {
  if (!a.segments_) return 0;
  Arena::Segments& sg = *a.segments_;
  std::size_t released = 0;
  while (released < wanted) {
    Handle base = 0;
    std::size_t size = 0;
    {
      std::lock_guard lock(sg.mu);
      for (auto it = sg.free_pieces.rbegin(); it != sg.free_pieces.rend(); ++it) {
        auto p = sg.pieces.find(it->second);
        if (!sg.whole(p->first, p->second) || p->second.freed_at_ns > freed_by_ns) continue;
        base = p->first;
        size = p->second.size;
        sg.remove_free(base, p->second);
        sg.pieces.erase(p);
        sg.segments.erase(base);
        break;
      }
    }
    if (!base) break;
    a.group_->unhold(size);
    if (drop) {
      a.backend_->drop(base, size);
    } else {
      a.backend_->release(base, size);
    }
    {
      std::lock_guard lock(a.slow_mu_);
      if (!drop) ++a.slow_.backend_frees;
      a.slow_.managed_bytes -= size;
    }
    released += size;
    if (count) ++*count;
  }
  return released;
}

std::size_t Pool::largest_free_segment(Arena& a) const {
  if (!a.segments_) return 0;
  Arena::Segments& sg = *a.segments_;
  std::lock_guard lock(sg.mu);
  for (auto it = sg.free_pieces.rbegin(); it != sg.free_pieces.rend(); ++it)
    if (sg.whole(it->second, sg.pieces.find(it->second)->second)) return it->first;
  return 0;
}

std::uint64_t Pool::oldest_free_segment(Arena& a) const {
  std::uint64_t oldest = UINT64_MAX;
  if (!a.segments_) return oldest;
  Arena::Segments& sg = *a.segments_;
  std::lock_guard lock(sg.mu);
  for (const auto& [size, at] : sg.free_pieces) {
    const Arena::Segments::Piece& p = sg.pieces.find(at)->second;
    if (sg.whole(at, p)) oldest = std::min(oldest, p.freed_at_ns);
  }
  return oldest;
}

}  // namespace gpupool
