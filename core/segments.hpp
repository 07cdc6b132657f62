// The segment cache: large requests served by pieces of larger backend
// allocations.
//
// With ArenaOptions::split_min set, a request of at least that size is not
// rounded to a bin. It takes the smallest free piece that fits (best fit)
// and is ready (its fence passed), and the piece is split when what is left
// is at least split_min; without one, the backend allocates a segment (the
// request rounded up to kSegmentGranule) whose remainder stays free. A freed
// piece merges with its free neighbours, so memory freed by one phase of a
// program serves the sizes of the next (the binned cache keeps a block per
// size ever active at once). A segment goes back to the backend only once
// all of it is free: those are this cache's items for the release policies.
// PyTorch's caching allocator splits its segments the same way; the
// vocabulary here is the pool's (docs/memory.md, "Memory overhead").
//
// Internal to core/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "core/piece_cache.hpp"

namespace gpupool::core_detail {

// Pieces start and end on this (what cuMemAlloc aligns to, and PyTorch's
// smallest block); segments are multiples of kSegmentGranule (the driver's
// own page for device memory, so rounding takes nothing the driver would
// not have taken anyway).
inline constexpr std::size_t kPieceGranule = 512;
inline constexpr std::size_t kSegmentGranule = std::size_t{2} << 20;

class SegmentCache final : public PieceCache<LockRank::arena_segments> {
 public:
  // `cap`: the held bytes of the arena's group, which count wholly free
  // segments; `clock`: the pool's (Pool::now).
  SegmentCache(Backend& backend, HeldCap& cap, std::size_t split_min, std::uint64_t (*clock)());

  // A piece handed to the program: its address, size and segment's record.
  struct Cut {
    Handle at = 0;
    std::size_t size = 0;  // 0: none
    void* data = nullptr;
  };
  // The best ready fit for `want` bytes (a multiple of kPieceGranule), cut
  // to size when the rest is at least split_min. None when no ready piece
  // fits; then, on a first attempt, *wait says whether memory the device may
  // still use would serve the request once it is done with it.
  Cut take(std::size_t want, bool first_attempt, bool* wait);
  // A new segment of `got` bytes from the backend (r): its first piece of
  // `want` bytes (the whole segment when the rest would be under split_min
  // or cannot be recorded), the rest free. If recording it fails, the
  // segment goes back to the backend and the failure on to the caller.
  Cut add_segment(const BackendResult& r, std::size_t got, std::size_t want);
  // The program freed the piece at `at` (fence, at t_ns). When that leaves
  // its segment wholly free, the segment stays held if `keep` (asked under
  // this cache's lock, so that stop_holding() never misses it) and the
  // segment is not larger than the whole cap (it would only push everything
  // else out); *over_cap then says whether holding it put the group over
  // its cap. Otherwise the segment leaves the cache: returned, to be given
  // back. Allocates nothing.
  Held free(Handle at, std::uint64_t fence, std::uint64_t t_ns, bool reusable,
            const std::atomic<bool>& keep, bool* over_cap);
  // The piece at `at` is let go at t_ns without a fence (its memory was
  // freed with its context, or it is a forked parent's): its segment, once
  // wholly free, leaves the cache (returned, to be dropped).
  Held forget(Handle at, std::uint64_t t_ns);

  // Cache: each wholly free segment is an item.
  void offer(Victims order, Offer& best) override;
  Held take_offered(const Offer& offer) override;
  Held take_any() override;
  void take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) override;
  std::size_t releasable_bytes() const override;

 private:
  using FreeSet = std::set<std::pair<std::size_t, Handle>>;  // (size, address): best fit
  struct Segment {
    std::size_t size = 0;
    void* data = nullptr;           // the backend's record (Block::data of its pieces)
    std::size_t used = 0;           // its pieces in the program's hands; 0: it can go back
    std::uint64_t freed_at_ns = 0;  // when `used` last fell to 0
  };
  struct Piece {
    std::size_t size = 0;
    Handle segment = 0;  // its segment's base
    bool free = false;
    std::uint64_t fence = 0;        // free pieces: ready once passed
    std::uint64_t freed_at_ns = 0;  // free pieces: the latest free merged in
    // Every piece owns one node of free_pieces_: in the set while the piece
    // is free, here while it is in use. So a free, which must not fail,
    // allocates nothing: merging only lets pieces go.
    FreeSet::node_type node;
  };

  // A piece with its node (may throw: the allocation path only).
  static Piece make_piece(std::size_t size, Handle segment);
  // The helpers below run under mu_.
  void add_free(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  void remove_free(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  bool ready(const Piece& p) const { return p.fence == 0 || backend_.passed(p.fence); }
  // The used piece at `at` is free now (fence, at t_ns): merged with its
  // free neighbours in the same segment that are as ready as it is (a piece
  // the device may still use would hold back a ready neighbour's bytes
  // until its fence passes). Allocates nothing.
  std::map<Handle, Piece>::iterator free_piece(Handle at, std::uint64_t fence, std::uint64_t t_ns)
      GPUPOOL_REQUIRES(mu_);
  // Merge neighbouring free pieces that are both ready (their fences passed
  // since they were freed). Returns whether any merged.
  bool coalesce() GPUPOOL_REQUIRES(mu_);
  // Whether free pieces in a row in one segment would serve `want` bytes
  // once the device is done with the pending ones among them (the caller
  // found no ready piece that fits).
  bool fits_once_ready(std::size_t want) GPUPOOL_REQUIRES(mu_);
  // The free piece `best` (an entry of free_pieces_) handed out: cut to
  // `want` when the rest is at least split_min.
  Cut cut(FreeSet::iterator best, std::size_t want) GPUPOOL_REQUIRES(mu_);
  // A segment none of whose pieces is in use leaves the maps (its bytes go
  // back to the backend, or are let go, by the caller). Allocates nothing.
  Held erase_segment(Handle base) GPUPOOL_REQUIRES(mu_);

  Backend& backend_;
  HeldCap& cap_;
  const std::size_t split_min_;
  std::uint64_t (*const clock_)();
  // mu_ (PieceCache's) is a leaf: no other lock is taken and no backend
  // call made under it but Backend::passed (the allocation path allocates
  // under it). c_ counts the free pieces (held_blocks, held_bytes, peaks).
  std::map<Handle, Segment> segments_ GPUPOOL_GUARDED_BY(mu_);  // by base
  // Every piece of every segment, by address.
  std::map<Handle, Piece> pieces_ GPUPOOL_GUARDED_BY(mu_);
  FreeSet free_pieces_ GPUPOOL_GUARDED_BY(mu_);
};

}  // namespace gpupool::core_detail
