// The pointer maps: every block the pool has from the driver, by address,
// and whether the program owns it now. They tell a pooled pointer (freed
// into the pool, answered for in queries) from one that goes straight to
// the driver, for device and pinned memory alike. A piece of a split
// segment (GPUPOOL_SPLIT) that does not start its driver allocation has an
// entry of its own while the program owns it.
//
// An allocation's entry is its backend record (BackendResult::data, so
// Block::data): made when the driver allocates, removed when the pool
// releases or drops the block. A hit reaches it through the block, with no
// lookup and no lock.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/pool.hpp"
#include "interpose/handle_table.hpp"

namespace gpupool::cuda {

struct CtxState;

// What the pointer maps know about an address.
struct PtrInfo {
  bool found = false;   // inside a block the pool manages
  bool active = false;  // the program owns it (not held)
  Handle base = 0;
  std::size_t size = 0;  // the driver allocation's size (a piece's own)
  std::size_t requested = 0;
  // A piece of a split segment that does not have its driver allocation to
  // itself (other pieces share it, now or once it is freed).
  bool shares_allocation = false;
  bool in_range = false;  // a piece of an expandable range (GPUPOOL_SEGMENTS=expandable)
  std::uint64_t buffer_id = 0;
  unsigned host_flags = 0;  // pinned: the normalised flags the block was allocated for
};

class PtrMap {
 public:
  struct Entry;
  // Backend side (slow path): the driver allocated it (returns the record
  // for BackendResult::data) / the pool releases or drops it.
  Entry* insert(Handle h, std::size_t size, CtxState* st, unsigned host_flags = 0);
  void erase(Entry* e);
  // An expandable range's record (Backend::reserve, under the range's lock,
  // which ranks after this map's: so no lock here). It joins the maps with
  // the first piece handed out in it (activate) and leaves them with its
  // context (erase_context). forget_range: the range is given back or
  // dropped; false while it is still in the maps (the caller may not take
  // their locks), where it stays, as the record of address space nobody
  // will be handed again (only a pool destroyed with its context alive,
  // which the interposer never does).
  Entry* range_record(Handle base, std::size_t size, CtxState* st);
  static bool forget_range(Entry* e);
  // Hit path. activate: the pool handed `b` out (may throw for a piece
  // inside its segment, whose entry is made then: the caller gives the
  // block back). deactivate: the program frees h; *known = false if h is
  // not ours; returns nullptr for a block that is ours but already free (a
  // double free).
  void activate(Block* b);
  Block* deactivate(Handle h, bool* known);
  // Queries on any address inside a block.
  PtrInfo find(Handle p);
  // The active block containing p, or nullptr.
  Block* active_block(Handle p);
  // Context teardown: every entry of st leaves the maps, and the pool
  // forgets the blocks of st the program still owns (the driver freed
  // them). Entries of held blocks went when the pool dropped those.
  void erase_context(CtxState* st, Pool& pool);

  // fork(): both maps' locks, in rank order (core/lock_rank.hpp): the
  // ordered views, then the shards.
  static bool fork_prepare(PtrMap& a, PtrMap& b);  // false: gave up (core/fork_wait.hpp)
  static void fork_release(PtrMap& a, PtrMap& b);

  struct Entry {
    Handle handle = 0;
    std::size_t size = 0;
    CtxState* st = nullptr;
    // Non-null while the program owns it. Set by activate() without the
    // shard's lock (the pool has just handed the block to that thread
    // alone); read and cleared under it.
    std::atomic<Block*> block{nullptr};
    std::uint64_t serial = 0;            // of the driver allocation (buffer ids)
    std::atomic<std::uint32_t> uses{0};  // times handed out (buffer ids); activate() writes it
    unsigned host_flags = 0;
    bool piece = false;               // a piece inside a segment: in pieces_, gone when freed
    bool range = false;               // an expandable range's record (range_record)
    std::atomic<bool> listed{false};  // a range record in the maps (under ranges_mu_)
  };

 private:
  void add_piece(Block* b);
  // Takes the entries of st at or after the cursors out of the maps (a
  // piece's deleted, an allocation's left to its block or segment) up to
  // the next one whose block the program owns: that block, or nullptr at
  // the end.
  Block* take_next_locked(CtxState* st, Handle* next_range, Handle* next_piece)
      GPUPOOL_REQUIRES(ranges_mu_);
  Block* remove_piece(Handle h);
  void drop_free_pieces(Handle from, Handle to) GPUPOOL_REQUIRES(ranges_mu_);
  // The entry of the active piece containing p, else of the driver
  // allocation containing it, else nullptr.
  Entry* containing(Handle p) GPUPOOL_REQUIRES(ranges_mu_);
  // A shard's lock is held for one lookup or insert only; fork_prepare()
  // takes them all. 1024 shards (64 KiB a map): sixteen threads' blocks
  // rarely share one, so threads seldom meet at a lock (bench_alloc
  // --scaling measures how far they scale).
  using Shards = ShardedHandleTable<Entry, 10, LockRank::cuda_pointers>;
  using Shard = Shards::Shard;
  Shard& shard(Handle h) { return shards_.shard(h); }

  Shards shards_;
  // Ordered view for interior pointers; changes only on the slow path.
  Ranked<LockRank::cuda_ranges> ranges_mu_;
  std::map<Handle, Entry*> ranges_ GPUPOOL_GUARDED_BY(ranges_mu_);
  // Active pieces inside segments.
  std::map<Handle, Entry*> pieces_ GPUPOOL_GUARDED_BY(ranges_mu_);
};

// Buffer ids (CU_POINTER_ATTRIBUTE_BUFFER_ID) of pooled memory: far above
// the driver's own small counters, new at each hand-out of an allocation
// (serial: the allocation's, from next_serial(); uses: its hand-outs).
std::uint64_t pooled_buffer_id(std::uint64_t serial, std::uint32_t uses);
std::uint64_t next_serial();

// A known-unallocated address: queries about pointers that are free from the
// program's point of view (held blocks, rounding padding) are asked about
// this address instead, so the program gets the driver's own answer for
// unallocated memory.
CUdeviceptr unallocated_address();

}  // namespace gpupool::cuda
