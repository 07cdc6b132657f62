// Segments: large requests served by pieces of larger backend allocations.
//
// With ArenaOptions::split_min set, a request of at least that size is not
// rounded to a bin. It takes the smallest free piece that fits (best fit)
// and is ready (its fence passed), and the piece is split when what is left
// is at least split_min; without one, the backend allocates a segment (the
// request rounded up to kSegmentGranule) whose remainder stays free. A freed
// piece merges with its free neighbours, so memory freed by one phase of a
// program serves the sizes of the next (the binned pool keeps a block per
// size ever active at once). A segment goes back to the backend only once
// all of it is free. PyTorch's caching allocator splits its segments the
// same way; the vocabulary here is the pool's (docs/memory.md, "Memory overhead").
//
// Internal to core/: pool.cpp and segments.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>

#include "core/lock_rank.hpp"
#include "core/pool.hpp"

namespace gpupool {

// Pieces start and end on this (what cuMemAlloc aligns to, and PyTorch's
// smallest block); segments are multiples of kSegmentGranule (the driver's
// own page for device memory, so rounding takes nothing the driver would
// not have taken anyway).
inline constexpr std::size_t kPieceGranule = 512;
inline constexpr std::size_t kSegmentGranule = std::size_t{2} << 20;

struct Arena::Segments {
  using FreeSet = std::set<std::pair<std::size_t, Handle>>;  // (size, address): best fit
  struct Segment {
    std::size_t size = 0;
    void* data = nullptr;         // the backend's record (Block::data of its pieces)
    std::size_t used = 0;         // its pieces in the program's hands; 0: it can go back
    std::uint64_t freed_at_ns = 0;  // when `used` last fell to 0
  };
  struct Piece {
    std::size_t size = 0;
    Handle segment = 0;  // its segment's base
    bool free = false;
    std::uint64_t fence = 0;        // free pieces: ready once passed
    std::uint64_t freed_at_ns = 0;  // free pieces: the latest free merged in
    // Every piece owns one node of free_pieces: in the set while the piece
    // is free, here while it is in use. So a free, which must not fail,
    // allocates nothing: merging only lets pieces go.
    FreeSet::node_type node;
  };

  // A leaf: no other lock is taken and no backend call made under it but
  // Backend::passed (the allocation path allocates under it).
  Ranked<LockRank::arena_segments> mu;
  std::map<Handle, Segment> segments;  // by base
  std::map<Handle, Piece> pieces;      // every piece of every segment, by address
  FreeSet free_pieces;
  // Held counters of the free pieces (held_blocks, held_bytes and their
  // peaks); hits, misses and active counts are the shards'.
  Stats c;

  // A piece with its node (may throw: the allocation path only).
  static Piece make_piece(std::size_t size, Handle segment) {
    FreeSet one;
    one.emplace(size, segment);
    Piece p;
    p.size = size;
    p.segment = segment;
    p.node = one.extract(one.begin());
    return p;
  }
  void add_free(Handle at, Piece& p) {
    p.free = true;
    p.node.value() = {p.size, at};
    free_pieces.insert(std::move(p.node));
    c.add_held(p.size);
  }
  void remove_free(Handle at, Piece& p) {
    p.free = false;
    p.node = free_pieces.extract({p.size, at});
    c.remove_held(p.size);
  }
  static void absorb(Piece& into, const Piece& from);  // `from`, its right neighbour, merged in
  static bool ready(const Piece& p, Backend& backend) {
    return p.fence == 0 || backend.passed(p.fence);
  }
  // The used piece at `at` is free now (fence, at t_ns): merged with its
  // free neighbours in the same segment that are as ready as it is (a piece
  // the device may still use would hold back a ready neighbour's bytes
  // until its fence passes). Allocates nothing.
  std::map<Handle, Piece>::iterator free_piece(Handle at, std::uint64_t fence, std::uint64_t t_ns,
                                              Backend& backend);
  // Merge neighbouring free pieces that are both ready (their fences passed
  // since they were freed). Returns whether any merged.
  bool coalesce(Backend& backend);
  // Whether free pieces in a row in one segment would serve `want` bytes
  // once the device is done with the pending ones among them (the caller
  // found no ready piece that fits); *pending: bytes of all pending pieces.
  bool fits_once_ready(std::size_t want, Backend& backend, std::size_t* pending);
  // A segment none of whose pieces is in use leaves the maps (its bytes go
  // back to the backend, or are let go, by the caller). Allocates nothing.
  // Returns the segment's backend record, for its release or drop.
  void* erase_segment(Handle base);
};

}  // namespace gpupool
