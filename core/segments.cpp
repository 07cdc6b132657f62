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

// Fences are ordered: the later of two covers both.
void Arena::Segments::absorb(Piece& into, const Piece& from) {
  into.size += from.size;
  into.fence = std::max(into.fence, from.fence);
  into.freed_at_ns = std::max(into.freed_at_ns, from.freed_at_ns);
}

std::map<Handle, Arena::Segments::Piece>::iterator Arena::Segments::free_piece(
    Handle at, std::uint64_t fence, std::uint64_t t_ns, Backend& backend) {
  auto it = pieces.find(at);
  Piece& p = it->second;
  p.fence = fence;
  p.freed_at_ns = t_ns;
  const bool is_ready = ready(p, backend);
  auto mergeable = [&](const Piece& n) {
    return n.segment == p.segment && n.free && ready(n, backend) == is_ready;
  };
  if (auto next = std::next(it); next != pieces.end() && mergeable(next->second)) {
    remove_free(next->first, next->second);
    absorb(p, next->second);
    pieces.erase(next);
  }
  if (it != pieces.begin())
    if (auto prev = std::prev(it); mergeable(prev->second)) {
      remove_free(prev->first, prev->second);
      absorb(prev->second, p);
      pieces.erase(it);
      it = prev;
    }
  add_free(it->first, it->second);
  return it;
}

bool Arena::Segments::coalesce(Backend& backend) {
  bool merged = false;
  for (auto it = pieces.begin(); it != pieces.end();) {
    auto next = std::next(it);
    if (next == pieces.end()) break;
    Piece& p = it->second;
    Piece& n = next->second;
    if (p.free && n.free && n.segment == p.segment && ready(p, backend) && ready(n, backend)) {
      remove_free(it->first, p);
      remove_free(next->first, n);
      absorb(p, n);
      pieces.erase(next);
      add_free(it->first, p);
      merged = true;
      continue;  // p may take the next one too
    }
    it = next;
  }
  return merged;
}

bool Arena::Segments::fits_once_ready(std::size_t want, Backend& backend, std::size_t* pending) {
  bool fits = false;
  std::size_t run = 0;  // bytes of the free pieces in a row so far, in one segment
  Handle run_segment = 0;
  *pending = 0;
  for (const auto& [at, p] : pieces) {
    if (!p.free) {
      run = 0;
      continue;
    }
    if (!ready(p, backend)) *pending += p.size;
    if (run == 0 || p.segment != run_segment) run = 0, run_segment = p.segment;
    run += p.size;
    fits = fits || run >= want;
  }
  return fits && *pending != 0;
}

void* Arena::Segments::erase_segment(Handle base) {
  for (auto it = pieces.find(base); it != pieces.end() && it->second.segment == base;) {
    remove_free(it->first, it->second);
    it = pieces.erase(it);
  }
  auto seg = segments.find(base);
  void* data = seg->second.data;
  segments.erase(seg);
  return data;
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

  for (int attempt = 0; attempt < 2; ++attempt) {
    bool wait = false;  // memory the device may still use would serve: wait for it
    bool found = false;
    {
      std::lock_guard lock(sg.mu);
      // The best fit among the ready pieces; else, once, the ready
      // neighbours merged (pieces freed apart, ready since) and again.
      auto fit = sg.free_pieces.end(), best = fit;
      for (int pass = 0; pass < 2 && best == sg.free_pieces.end(); ++pass) {
        if (pass == 1 && !sg.coalesce(backend)) break;
        fit = sg.free_pieces.lower_bound({want, 0});
        for (auto it = fit; it != sg.free_pieces.end(); ++it)
          if (Arena::Segments::ready(sg.pieces.find(it->second)->second, backend)) {
            best = it;
            break;
          }
      }
      // The best fit waits for the device: wait for it too, rather than cut
      // a larger ready piece. Pieces then land where they would without
      // fences; cut from larger free pieces, the sizes a program reuses
      // would scatter, and a request that needs one of those whole later
      // finds it cut up and takes a new segment (the CNN at batch 128 on the
      // H100 took 2.10x peak active so with a tenth larger allowed, 1.43x
      // without; scripts/h100-memory.sh, and bench_replay --sync-gap).
      if (attempt == 0 && best != sg.free_pieces.end() && best->first > fit->first) {
        best = sg.free_pieces.end();
        wait = true;
      }
      // None ready fits, but free pieces in a row would once the device is
      // done with them.
      std::size_t pending = 0;
      // (After a wait, what is still pending came since: no second wait.)
      if (attempt == 0 && best == sg.free_pieces.end() && !wait)
        wait = sg.fits_once_ready(want, backend, &pending);
      if (best != sg.free_pieces.end()) {
        const Handle at = best->second;
        Arena::Segments::Piece& p = sg.pieces.find(at)->second;
        Arena::Segments::Segment& seg = sg.segments.at(p.segment);
        if (seg.used++ == 0) a.group_->unhold(seg.size);
        sg.remove_free(at, p);
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
        b->data = seg.data;
        found = true;
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
    if (!wait) break;
    // No growth here (GPUPOOL_PENDING_GROWTH is the binned sizes'): a wait
    // makes every pending piece ready at once, and splitting is for taking
    // less memory.
    backend.wait_all();
    std::lock_guard lock(mine.mu);
    ++mine.c.fence_waits;
  }

  // A new segment: the request rounded up to whole segment granules, its
  // remainder free for the next requests.
  const std::size_t seg_bytes =
      std::max(want, std::min(round_up(want, kSegmentGranule), a.options_.max_block));
  bool exact = false;
  BackendResult r = backend_allocate(a, seg_bytes, size, hint, &exact);
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
    sg.segments.emplace(h, Arena::Segments::Segment{got, r.data, 1, 0});
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
    backend.release(h, got, r.data);
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
  took_memory(a, got);
  Block* out = b.release();
  if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_allocate(a, *out, false);
  return {out, BackendStatus::ok, 0, false};
}

void Pool::free_split(Block* b) {
  Arena& a = *b->arena;
  Arena::Segments& sg = *a.segments_;
  const std::uint64_t fence = a.backend_->fence();
  const std::uint64_t t = now();
  Handle gone = 0;  // a whole segment to release at once (holding stopped)
  std::size_t gone_size = 0;
  void* gone_data = nullptr;
  bool over_cap = false;
  {
    std::lock_guard lock(sg.mu);
    auto it = sg.free_piece(b->handle, fence, t, *a.backend_);
    Arena::Segments::Segment& seg = sg.segments.at(it->second.segment);
    if (--seg.used == 0) {
      seg.freed_at_ns = t;
      // Checked under the store's lock: stop_holding() clears the flag
      // before its free_held() takes this lock, so it never misses it. A
      // block never to be reused (never_reuse: another process may map
      // it) is its whole segment: it goes back at once.
      // A segment larger than the whole cap would only push everything
      // else out (as a binned block would).
      if (!b->pooled || !holding_.load(std::memory_order_acquire) ||
          (a.group_->capped() && seg.size > a.group_->max_held)) {
        gone = it->second.segment;
        gone_size = seg.size;
        gone_data = sg.erase_segment(gone);
      } else if (a.group_->capped()) {
        over_cap = a.group_->held_bytes.fetch_add(seg.size, std::memory_order_relaxed) + seg.size >
                   a.group_->max_held;
      }
    }
  }
  if (gone) give_back(a, gone, gone_size, gone_data, /*drop=*/false);
  if (over_cap) enforce_cap_nothrow(a);
  // The last touch of the arena, as in forget(): once no block is active, a
  // retired arena may be destroyed by another thread.
  {
    Arena::Shard& s = a.shards_[b->shard];
    std::lock_guard lock(s.mu);
    s.remove_active(b);
    if (fence != 0) ++s.c.pending_frees;
  }
  delete b;
}

// The driver already freed the piece's memory (its context is gone) or it is
// a forked parent's: no backend call but drop, once its segment is all free.
void Pool::forget_split(Block* b) {
  Arena& a = *b->arena;
  Arena::Segments& sg = *a.segments_;
  Handle gone = 0;
  std::size_t gone_size = 0;
  void* gone_data = nullptr;
  {
    std::lock_guard lock(sg.mu);
    auto it = sg.free_piece(b->handle, 0, now(), *a.backend_);
    Arena::Segments::Segment& seg = sg.segments.at(it->second.segment);
    if (--seg.used == 0) {
      gone = it->second.segment;
      gone_size = seg.size;
      gone_data = sg.erase_segment(gone);
    }
  }
  if (gone) give_back(a, gone, gone_size, gone_data, /*drop=*/true);
}

std::size_t Pool::release_segments(Arena& a, std::size_t wanted, bool drop,
                                   std::uint64_t freed_by_ns, std::size_t* count) {
  if (!a.segments_) return 0;
  Arena::Segments& sg = *a.segments_;
  std::size_t released = 0;
  while (released < wanted) {
    Handle base = 0;
    std::size_t size = 0;
    void* data = nullptr;
    {
      std::lock_guard lock(sg.mu);
      for (const auto& [at, seg] : sg.segments)
        if (seg.used == 0 && seg.freed_at_ns <= freed_by_ns && seg.size > size) {
          base = at;
          size = seg.size;
        }
      if (base) data = sg.erase_segment(base);
    }
    if (!base) break;
    a.group_->unhold(size);
    give_back(a, base, size, data, drop);
    released += size;
    if (count) ++*count;
  }
  return released;
}

std::size_t Pool::largest_free_segment(Arena& a) const {
  if (!a.segments_) return 0;
  Arena::Segments& sg = *a.segments_;
  std::lock_guard lock(sg.mu);
  std::size_t largest = 0;
  for (const auto& [at, seg] : sg.segments)
    if (seg.used == 0) largest = std::max(largest, seg.size);
  return largest;
}

std::uint64_t Pool::oldest_free_segment(Arena& a) const {
  std::uint64_t oldest = UINT64_MAX;
  if (!a.segments_) return oldest;
  Arena::Segments& sg = *a.segments_;
  std::lock_guard lock(sg.mu);
  for (const auto& [at, seg] : sg.segments)
    if (seg.used == 0) oldest = std::min(oldest, seg.freed_at_ns);
  return oldest;
}

}  // namespace gpupool
