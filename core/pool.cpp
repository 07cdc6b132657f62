// The pool (pool.hpp): what the program's calls do. allocate() serves a
// request from the binned cache (binned.hpp) or, for large ones when
// splitting is on, the segment cache (segments.hpp); what neither holds
// comes from the backend, through the out-of-memory policy (release.hpp).
// free() gives memory back to its cache, and the cap policy trims what is
// over. The pool-wide operations are in pool_wide.cpp.
#include "core/pool.hpp"

#include <algorithm>
#include <bit>
#include <ctime>
#include <memory>
#include <optional>
#include <thread>

#include "core/arena.hpp"
#include "core/arenas.hpp"
#include "core/hot_tls.hpp"
#include "core/release.hpp"

namespace gpupool {

using namespace core_detail;
namespace {

// A thread's slot picks its shard (the slot's low bits). A new thread takes the
// lowest free slot and gives it back when it exits, so threads alive at the
// same time land on different shards however many came and went before (a
// counter put every other new thread on the main thread's shard with two
// shards). Lock-free, so fork() cannot leave the table locked; threads past
// the table's size share slots, as they would share shards anyway.
constexpr unsigned kSlotWords = 4;
std::atomic<std::uint64_t> g_slots_used[kSlotWords];

unsigned take_slot() {
  for (unsigned w = 0; w < kSlotWords; ++w) {
    std::uint64_t used = g_slots_used[w].load(std::memory_order_relaxed);
    while (~used) {
      const unsigned bit = static_cast<unsigned>(std::countr_one(used));
      if (g_slots_used[w].compare_exchange_weak(used, used | (std::uint64_t{1} << bit),
                                                std::memory_order_acq_rel))
        return w * 64 + bit;
    }
  }
  static std::atomic<unsigned> overflow{0};
  return overflow.fetch_add(1, std::memory_order_relaxed);
}

// The slot is taken at a thread's first allocation and given back by a
// thread_local with a destructor, which is only touched then: reading one
// costs a TLS lookup and an initialisation check on every call, a plain
// thread_local one lookup.
struct SlotRelease {
  unsigned value = 0;
  ~SlotRelease() {
    if (value < kSlotWords * 64)
      g_slots_used[value / 64].fetch_and(~(std::uint64_t{1} << (value % 64)),
                                         std::memory_order_release);
  }
};
GPUPOOL_HOT_TLS unsigned t_slot_plus_one = 0;  // 0: none taken yet

[[gnu::noinline]] unsigned first_slot() {
  thread_local SlotRelease release;
  release.value = take_slot();
  t_slot_plus_one = release.value + 1;
  return release.value;
}

unsigned thread_slot() {
  const unsigned s = t_slot_plus_one;
  return s ? s - 1 : first_slot();
}

unsigned default_shards() { return std::thread::hardware_concurrency(); }

std::uint64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

std::size_t round_up(std::size_t n, std::size_t to) {
  return n > SIZE_MAX - to ? SIZE_MAX : (n + to - 1) / to * to;
}

// A block that is not held goes back to the backend.
void release_block(Block* b) {
  b->arena->give_back(b->handle, b->size, b->data, /*drop=*/false);
  delete b;
}

}  // namespace

std::uint64_t Pool::now_ns() { return clock_ns(CLOCK_MONOTONIC_COARSE); }

std::uint64_t Pool::cost_now() const {
  return options_.cost_clock ? options_.cost_clock() : clock_ns(CLOCK_MONOTONIC);
}

Pool::Pool(PoolOptions options)
    : options_(options),
      bins_(std::clamp(options.leading_bits, 1u, BinScheme::kMaxLeadingBits)),
      shard_count_(std::bit_ceil(
          std::clamp(options.shards ? options.shards : default_shards(), 1u, kMaxShards))),
      holding_(options.hold),
      borrow_(options.borrow_larger),
      arenas_(std::make_unique<ArenaList>(observer_)) {}

Pool::~Pool() {
  // The pool is destroyed only in tests; a preloaded runtime is never
  // destroyed. Give held memory back, leave active blocks to their owners.
  free_held();
}

Arena* Pool::add_arena(std::unique_ptr<Backend> backend, ArenaOptions options) {
  return arenas_->add(std::move(backend), std::move(options), shard_count_,
                      options_.clock ? options_.clock : &Pool::now_ns);
}

// From the binned cache: a held block of the request's bin (or, borrowing,
// of a larger one), else a fresh block of the bin's size (the exact size
// when the request is not pooled).
AllocResult Pool::allocate_block(Arena& a, unsigned my, std::size_t size, bool pooled,
                                 std::uint64_t hint) {
  const std::size_t bin = bins_.bin_number(size);
  // What a fresh block takes: not needed on a hit.
  auto want_size = [&] {
    return pooled ? std::min(bins_.alloc_size(bin), a.options().max_block) : size;
  };
  std::optional<BackendResult> fresh;  // a block allocated instead of waiting
  if (pooled) {
    // A held block less than twice the size serves when its own bin has none.
    std::size_t borrow_last = BinnedCache::kNoBorrowing;
    if (borrow_) {
      const std::size_t want = want_size();
      const std::size_t last = bins_.bin_number(want > SIZE_MAX / 2 ? SIZE_MAX : 2 * want);
      borrow_last = last > bin ? last - 1 : bin;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      const BinnedCache::Found f = a.binned().take(my, bin, size, attempt != 0, borrow_last);
      if (f.block) {
        a.group().cap.unhold(f.block->size);
        return {f.block, BackendStatus::ok, 0, true};
      }
      if (!f.pending) break;
      // Only blocks the device may still use: the device made to wait for
      // the oldest (Backend::order_after), else grow the bin, or wait for
      // them all (see kMaxPendingBlocks).
      if (attempt == 0 && a.backend().order_after(f.oldest_fence)) continue;
      if (attempt == 0 && (fresh = grow(a, my, bin, want_size(), f.pending_blocks, hint))) break;
      wait_for_pending(a, my, bin);
    }
  }

  const std::size_t want = want_size();
  bool exact = false;
  const BackendResult r =
      fresh ? *fresh : allocate_releasing(*arenas_, a, want, size, hint, &exact);
  Shard& mine = a.binned().shard(my);
  if (r.status != BackendStatus::ok) {
    LockGuard lock(mine.mu);
    ++mine.c.misses;
    return {nullptr, r.status, r.error, false};
  }
  Block* b = nullptr;
  try {
    b = new Block;
  } catch (...) {
    // Nothing may be left half-done: the fresh allocation goes back.
    a.backend().release(r.handle, exact ? size : want, r.data);
    throw;
  }
  b->handle = r.handle;
  b->data = r.data;
  // An exact-size fallback block does not fit its bin: released at free.
  b->size = exact ? size : want;
  b->pooled = pooled && !exact;
  b->requested = size;
  b->arena = &a;
  b->bin = static_cast<std::uint16_t>(bin);
  b->shard = static_cast<std::uint8_t>(my);
  {
    LockGuard lock(mine.mu);
    ++mine.c.misses;
    mine.add_active(b);
  }
  a.took_memory(b->size);
  return {b, BackendStatus::ok, 0, false};
}

AllocResult Pool::allocate(Arena* arena, std::size_t size, std::uint64_t hint) {
  Arena& a = *arena;
  const unsigned my = thread_slot() & (shard_count_ - 1);
  const ArenaOptions& o = a.options();
  const bool pooled = size <= o.max_pooled && size <= o.max_block;
  const bool piece = pooled && o.split_min && size >= o.split_min;
  const AllocResult r = piece && a.ranges()     ? allocate_range_piece(a, my, size, hint)
                        : piece && a.segments() ? allocate_piece(a, my, size, hint)
                                                : allocate_block(a, my, size, pooled, hint);
  if (r.block)
    if (auto* obs = observer_.load(std::memory_order_acquire))
      obs->on_allocate(a, *r.block, r.hit ? Served::hit : Served::miss);
  return r;
}

// A fresh block of `bytes` for a bin whose `pending_blocks` blocks all wait
// for the device, or none, and the caller waits. One wait frees every
// pending block, so a loop that frees and at once reuses a size pays one
// wait per (blocks in the bin) pairs: more blocks, fewer waits. But a fresh
// block costs a driver allocation (H100: ~40 us device, 0.65-190 ms pinned)
// and a wait may cost ~1 us (idle device) or a whole queue (busy one). Ski
// rental: a bin grows only while the time its waits took covers the time
// its growths took (the first growth is free), so growing never costs more
// than about what waiting did: fast when waits are stalls, slowly when they
// are cheap. Bounded in bytes by pending_growth (the pending blocks and the
// fresh one together: every pooled block of a bin is `bytes` long) and in
// count by kMaxPendingBlocks. Never makes the pool give held memory back.
std::optional<BackendResult> Pool::grow(Arena& a, unsigned shard, std::size_t bin,
                                        std::size_t bytes, std::size_t pending_blocks,
                                        std::uint64_t hint) {
  if (pending_blocks >= kMaxPendingBlocks ||
      bytes > a.options().pending_growth / (pending_blocks + 1))
    return std::nullopt;
  Shard& s = a.binned().shard(shard);
  {
    LockGuard lock(s.mu);
    BinGrowth& g = s.growth_of(bin);
    if (g.growing || g.credit_ns < 0) return std::nullopt;
    g.growing = true;
  }
  const std::uint64_t t0 = cost_now();
  BackendResult r = a.backend().allocate(bytes, hint);
  const std::uint64_t took = cost_now() - t0;
  LockGuard lock(s.mu);
  BinGrowth& g = s.growth_of(bin);
  g.growing = false;
  if (r.status != BackendStatus::ok) return std::nullopt;
  g.credit_ns -= static_cast<std::int64_t>(took);
  return r;
}

template <class Wait>
std::uint64_t Pool::counted_wait(Shard& s, Wait&& wait) {
  const std::uint64_t t0 = cost_now();
  wait();
  const std::uint64_t took = cost_now() - t0;
  LockGuard lock(s.mu);
  ++s.c.fence_waits;
  s.c.fence_wait_ns += took;
  return took;
}

// One bulk wait; its time is credited to the bin that needed it.
void Pool::wait_for_pending(Arena& a, unsigned shard, std::size_t bin) {
  Shard& s = a.binned().shard(shard);
  const std::uint64_t took = counted_wait(s, [&] { a.backend().wait_all(); });
  LockGuard lock(s.mu);
  s.growth_of(bin).credit_ns += static_cast<std::int64_t>(took);
}

// The block a piece of a segment or of a range is handed out as, made
// before anything changes (a failure to make it leaves nothing half-done).
static std::unique_ptr<Block> new_piece(Arena& a, unsigned my, std::size_t size) {
  std::unique_ptr<Block> b(new Block);
  b->requested = size;
  b->arena = &a;
  b->shard = static_cast<std::uint8_t>(my);
  b->split = true;
  b->bin = 0;
  return b;
}

// From the segment cache: a piece of a held segment, else of a new one.
AllocResult Pool::allocate_piece(Arena& a, unsigned my, std::size_t size, std::uint64_t hint) {
  SegmentCache& sg = *a.segments();
  Shard& mine = a.binned().shard(my);
  const std::size_t want = round_up(size, kPieceGranule);
  // Before anything changes: a failure here leaves nothing half-done.
  std::unique_ptr<Block> b = new_piece(a, my, size);

  SegmentCache::Cut cut;
  for (int attempt = 0; attempt < 2; ++attempt) {
    bool wait = false;  // memory the device may still use would serve: wait for it
    cut = sg.take(want, attempt == 0, &wait);
    if (cut.size || !wait) break;
    // No growth here (GPUPOOL_PENDING_GROWTH is the binned sizes'): a wait
    // makes every pending piece ready at once, and splitting is for taking
    // less memory.
    counted_wait(mine, [&] { a.backend().wait_all(); });
  }
  const bool hit = cut.size != 0;
  std::size_t got = 0;  // a new segment's bytes
  if (!hit) {
    // A new segment: the request rounded up to whole segment granules, its
    // remainder free for the next requests.
    const std::size_t seg_bytes =
        std::max(want, std::min(round_up(want, kSegmentGranule), a.options().max_block));
    bool exact = false;
    const BackendResult r = allocate_releasing(*arenas_, a, seg_bytes, size, hint, &exact);
    if (r.status != BackendStatus::ok) {
      LockGuard lock(mine.mu);
      ++mine.c.misses;
      return {nullptr, r.status, r.error, false};
    }
    got = exact ? size : seg_bytes;
    cut = sg.add_segment(r, got, exact ? got : want);
  }
  b->handle = cut.at;
  b->size = cut.size;
  b->data = cut.data;
  {
    LockGuard lock(mine.mu);
    ++(hit ? mine.c.hits : mine.c.misses);
    mine.add_active(b.get());
  }
  if (!hit) a.took_memory(got);
  return {b.release(), BackendStatus::ok, 0, hit};
}

// From the range cache: a ready free piece, else granules mapped for it
// (or, where the range has no room, a block of its bin).
AllocResult Pool::allocate_range_piece(Arena& a, unsigned my, std::size_t size,
                                       std::uint64_t hint) {
  RangeCache& rg = *a.ranges();
  Shard& mine = a.binned().shard(my);
  const std::size_t want = round_up(size, kPieceGranule);
  // When the slot's park had only pending pieces of this size (a miss the
  // stock is for), on the cost clock (read only then): its streak
  // (Shard::missed).
  std::uint64_t missed_at = 0;
  bool missed = false;
  // The device made to wait for the piece's old work where the backend can
  // (Backend::order_after), else the program, here.
  auto wait_for = [&](std::uint64_t fence) {
    if (a.backend().order_after(fence)) return;
    counted_wait(mine, [&] { a.backend().wait_for(fence); });
  };
  bool stock = false;  // another piece for the slot's stock
  const std::size_t budget = rg.stock_budget();
  // At most one wait here: one that did not ready the piece (a context
  // with a sticky error fails its synchronizations) leaves it to the
  // range's path, which then maps more.
  for (bool waited = false;; waited = true) {
    std::uint64_t oldest = 0;
    {
      // A piece this slot parked, whole: the range's lock is not taken.
      LockGuard lock(mine.mu);
      if (!rg.parking()) break;
      if (Block* p = mine.take_parked(want, rg.min_rest(), a.backend(), rg.granule(),
                                      mine.stocking(want, budget))) {
        p->requested = size;
        ++mine.c.hits;
        if (want == mine.streak_size) ++mine.size_hits;
        mine.add_active(p);
        a.group().cap.unhold(p->size);
        if (missed) mine.missed(want, missed_at, cost_now());
        return {p, BackendStatus::ok, 0, true};
      }
      if (mine.stocked(want, rg.min_rest(), &oldest) == 0) break;
      if (!missed) missed_at = cost_now(), missed = true;
      if (waited) break;
      // Where the device is made to wait instead (Backend::orders), the
      // parked piece costs the host nothing: no stock.
      if (!a.backend().orders()) {
        if (!mine.stocking(want, budget)) break;
        // Back to back (a miss after a pause takes nothing more), with room
        // in the park for one more once the program frees it, and in the
        // budget.
        if (mine.back_to_back(missed_at) && mine.parked_n < Shard::kParkSlots &&
            mine.parked_bytes + want <= budget) {
          stock = true;
          break;
        }
      }
    }
    // The stock's oldest piece waited for, as the range would, and the
    // stock kept.
    wait_for(oldest);
  }
  std::unique_ptr<Block> b = new_piece(a, my, size);

  RangeCache::Cut cut;
  auto take = [&] {
    for (int attempt = 0; attempt < 2; ++attempt) {
      std::uint64_t wait = 0;  // pending pieces would serve, and hold more than the bound
      cut = rg.take(want, attempt == 0, &wait);
      if (cut.size || !wait) break;
      wait_for(wait);
    }
  };
  if (stock) {
    // A ready piece of the range, else new granules; the parked pieces stay.
    std::uint64_t none = 0;
    cut = rg.take(want, /*first_attempt=*/false, &none);
    LockGuard lock(mine.mu);
    ++mine.c.stock_growths;
  } else {
    if (const Held gone = rg.unpark_slot(my, want, holding_); gone.size)
      a.let_go(gone, /*drop=*/false);
    take();
    // Before mapping more: the pieces parked in every slot, back in the range.
    if (!cut.size) {
      Held gone;
      const bool any = rg.unpark_all(/*hinted=*/true, UINT64_MAX, &holding_, &gone);
      if (gone.size) a.let_go(gone, /*drop=*/false);
      if (any) take();
    }
  }
  if (!cut.size) {
    bool no_room = false;
    const BackendResult r = retry_releasing(*arenas_, a, round_up(want, rg.granule()),
                                            [&] { return rg.grow(want, &cut, &no_room); });
    if (no_room) return allocate_block(a, my, size, /*pooled=*/true, hint);
    if (r.status != BackendStatus::ok) {
      LockGuard lock(mine.mu);
      ++mine.c.misses;
      return {nullptr, r.status, r.error, false};
    }
  }
  // A piece that took no new granule is a hit, however it was found.
  const bool hit = cut.mapped == 0;
  b->handle = cut.at;
  b->size = cut.size;
  b->data = cut.data;
  {
    LockGuard lock(mine.mu);
    ++(hit ? mine.c.hits : mine.c.misses);
    mine.add_active(b.get());
    if (missed) mine.missed(want, missed_at, cost_now());
  }
  if (!hit) a.took_memory(cut.mapped);
  return {b.release(), BackendStatus::ok, 0, hit};
}

void Pool::free(Block* b) {
  Arena& a = *b->arena;
  if (a.retired()) return forget(b);
  if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_free(a, *b);
  if (b->split) return free_piece(b);

  HeldCap& cap = a.group().cap;
  // A block larger than the whole cap would only push everything else out.
  if (b->pooled && cap.too_large(b->size)) b->pooled = false;
  if (b->pooled) {
    b->fence = a.backend().fence();
    b->freed_at_ns = now();
  }
  bool over_cap = false;
  // Without room to hold it (the allocation for it failed), the block is
  // released instead: a free never fails.
  const bool held = a.binned().hold(
      b, [&] { return b->pooled && holding_.load(std::memory_order_acquire); },
      [&] { over_cap = cap.hold(b->size); });
  // From here on `b` may belong to another thread.
  if (!held) return release_block(b);
  if (over_cap) enforce_cap_nothrow(a);
}

void Pool::free_piece(Block* b) {
  Arena& a = *b->arena;
  const std::uint64_t fence = a.backend().fence();
  const std::uint64_t t = now();
  bool over_cap = false;
  if (RangeCache* rg = a.ranges(); rg && !b->pooled) {
    // Never to be reused: no piece may stay parked in its granules.
    rg->dying();
  } else if (rg) {
    // A range's piece that may be handed out again is parked whole in its
    // slot's shard (Shard::park), under the one lock its active count takes.
    b->fence = fence;
    b->freed_at_ns = t;
    Shard& s = a.binned().shard(b->shard);
    Block* out = nullptr;
    bool parked = false;
    {
      LockGuard lock(s.mu);
      // Asked under the shard's lock, as for a binned block: stop_holding()
      // clears the flag before it empties the parks (every shard locked),
      // and RangeCache::dying() likewise.
      if (holding_.load(std::memory_order_acquire) && rg->parking()) {
        s.remove_active(b);
        if (fence != 0) ++s.c.pending_frees;
        out = s.park(b, rg->granule(), rg->stock_budget());
        parked = true;
        over_cap = a.group().cap.hold(b->size);
        if (out || over_cap) ++s.in_flight;  // the arena is touched below
      }
    }
    if (parked) {
      if (!out && !over_cap) return;
      if (out)
        if (const Held gone = rg->unpark(out, holding_); gone.size) a.let_go(gone, /*drop=*/false);
      if (over_cap) enforce_cap_nothrow(a);
      LockGuard lock(s.mu);
      --s.in_flight;
      return;
    }
  }
  // A block never to be reused (never_reuse: another process may map it) is
  // its whole segment: it goes back at once, as when holding stopped.
  // A range's piece: its whole granules are unmapped at once.
  if (RangeCache* rg = a.ranges()) {
    if (const Held gone = rg->free(b->handle, fence, t, b->pooled, holding_, &over_cap); gone.size)
      a.let_go(gone, /*drop=*/false);
  } else if (const Held gone =
                 a.segments()->free(b->handle, fence, t, b->pooled, holding_, &over_cap);
             gone.size) {
    a.give_back(gone.handle, gone.size, gone.data, /*drop=*/false);
  }
  if (over_cap) enforce_cap_nothrow(a);
  // The last touch of the arena, as in forget(): once no block is active, a
  // retired arena may be destroyed by another thread.
  {
    Shard& s = a.binned().shard(b->shard);
    LockGuard lock(s.mu);
    s.remove_active(b);
    if (fence != 0) ++s.c.pending_frees;
  }
  delete b;
}

namespace {
// A stand-in block: the observer reads handle, sizes and arena; the pool
// keeps nothing of it (the driver holds the memory).
Block outside_block(Arena& a, Handle handle, std::size_t size) {
  Block b;
  b.handle = handle;
  b.size = b.requested = size;
  b.arena = &a;
  return b;
}
}  // namespace

void Pool::note_outside_allocate(Arena& a, Handle handle, std::size_t size) {
  if (a.counted())
    if (auto* obs = observer_.load(std::memory_order_acquire))
      obs->on_allocate(a, outside_block(a, handle, size), Served::outside);
}

void Pool::note_outside_free(Arena& a, Handle handle, std::size_t size) {
  if (a.counted())
    if (auto* obs = observer_.load(std::memory_order_acquire))
      obs->on_free(a, outside_block(a, handle, size));
}

void Pool::forget(Block* b) {
  Arena& a = *b->arena;
  // The block's end, as for a free: the driver freed it (with its context)
  // or the program released it where no driver call is made. Not for a
  // forked child's copy of its parent's block.
  if (a.counted())
    if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_free(a, *b);
  const bool retired = a.retired();
  if (!b->split) {
    a.give_back(b->handle, b->size, b->data, /*drop=*/true);
  } else if (RangeCache* rg = a.ranges()) {
    if (const Held gone = rg->forget(b->handle, now()); gone.size) a.let_go(gone, /*drop=*/true);
  } else if (const Held gone = a.segments()->forget(b->handle, now()); gone.size) {
    // The driver already freed the piece's memory, or it is a forked
    // parent's: no backend call but drop, once its segment is all free.
    a.give_back(gone.handle, gone.size, gone.data, /*drop=*/true);
  }
  // The last touch of the arena: once no block is active, reclaim() may
  // destroy a retired one.
  {
    Shard& s = a.binned().shard(b->shard);
    LockGuard lock(s.mu);
    s.remove_active(b);
  }
  delete b;
  if (retired) reclaim();
}

// A free must not fail: were it to throw, the hook would hand the pointer to
// the driver, which would free memory the pool still holds (with splitting,
// other blocks' too). Without memory to look at the group, the cap waits
// for the next free.
void Pool::enforce_cap_nothrow(Arena& arena) noexcept {
  try {
    Arena::Group& g = arena.group();
    const ArenaList::Pinned members =
        arenas_->pin([&](const Arena& a) { return &a.group() == &g; });
    release_over_cap(g.cap, members.arenas());
  } catch (...) {
  }
}

}  // namespace gpupool
