// The pool that every backend plugs into.
//
// An Arena is one set of interchangeable blocks: one backend instance (a CUDA
// context's device memory, pinned memory of one flag set, one OpenCL context +
// flags + properties). Arenas that draw on the same memory share a group: the
// held-byte cap and out-of-memory release look at the group first.
//
// An arena keeps what the program frees in its caches (core/cache.hpp): the
// binned cache (binned.hpp), whose shards, one per thread slot, each have
// their own lock, bins and counters, so threads that allocate and free the
// same sizes do not share a lock or a written cache line (the hit path); and,
// when splitting is on, the segment cache for large requests (segments.hpp).
// The release policies (release.hpp) decide what goes back to the backend.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/bins.hpp"
#include "core/cache.hpp"
#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "core/stats.hpp"

namespace gpupool {

class Arena;

// Shards per arena, at most (Block::shard is 8 bits). Always a power of two,
// so a thread's shard is its slot masked, not divided (a division on every
// allocation was a tenth of the pool's hit-path samples on the stand-in).
inline constexpr unsigned kMaxShards = 64;

// One allocation handed out by the pool. The pool owns it; the backend's
// handle stays valid while the block is active.
// One cache line: blocks of different threads must not share a line.
struct alignas(64) Block {
  Handle handle = 0;
  std::size_t size = 0;       // what the backend allocated
  std::size_t requested = 0;  // what the program asked for (while active)
  Arena* arena = nullptr;
  // The backend's own record of the allocation (BackendResult::data), so a
  // hit reaches it without a lookup by handle.
  void* data = nullptr;
  // Pool-internal (Pool::never_reuse() is the backends' way to clear pooled).
  std::uint64_t fence = 0;
  std::uint64_t freed_at_ns = 0;
  std::uint16_t bin = 0;   // < BinScheme::bin_count() (at most 16385)
  std::uint8_t shard = 0;  // < kMaxShards
  bool pooled = true;      // false: released at free (too large, exact-size fallback)
  // A piece of a segment or of a range (ArenaOptions::split_min): `handle`
  // may lie inside a driver allocation or mapping shared with other
  // pieces; `size` is the piece's.
  bool split = false;
};
static_assert(sizeof(Block) == 64);

struct PoolOptions {
  unsigned leading_bits = 4;
  bool hold = true;                    // false: start with holding stopped
  std::uint64_t release_after_ns = 0;  // 0: keep held blocks however long
  // A request whose bin has no held block takes one from a larger bin (less
  // than twice its size) before asking the backend. Off by default: the
  // excess of a borrowed block cannot be released while it is active, so a
  // program that fills the device would run out of memory sooner.
  bool borrow_larger = false;
  unsigned shards =
      0;  // 0: one per hardware thread; rounded up to a power of two, at most kMaxShards
  std::uint64_t (*clock)() = nullptr;  // monotonic ns for held-block ages; tests inject one
  // Precise monotonic ns for what backend calls cost (the growth rule below);
  // CLOCK_MONOTONIC by default, tests inject one.
  std::uint64_t (*cost_clock)() = nullptr;
};

struct ArenaOptions {
  std::string name;
  std::string group;
  std::string kind;
  std::string device;  // what it draws on, the same in every process: a GPU's UUID, "host"
  std::size_t max_block = SIZE_MAX;   // largest size the backend can allocate (bin clamp)
  std::size_t max_pooled = SIZE_MAX;  // larger requests are allocated exactly and released at free
  std::size_t max_held =
      SIZE_MAX;  // cap on held bytes of the whole group (first arena's value wins)
  // When a bin holds only blocks whose fence has not passed, it may grow by a
  // fresh block instead of waiting: while those blocks and the new one fit in
  // this many bytes, fewer than kMaxPendingBlocks wait, and the bin's waits
  // so far took at least as long as its growths (pool.cpp, Pool::grow).
  std::size_t pending_growth = 0;
  // 0: off. Requests of at least this many bytes (and at most max_pooled)
  // are served by pieces of larger backend allocations, segments, split
  // and merged as PyTorch's caching allocator does (core/segments.hpp): no
  // binned rounding, and sizes of one phase reuse another's memory. Only
  // for backends whose handles are addresses (handle + offset is the
  // piece) and whose fences are ordered (passed(f) implies passed(g) for
  // every g <= f). A segment goes back to the backend only when all of it
  // is free.
  std::size_t split_min = 0;
  // With split_min set and a backend that maps granules (Backend::granule),
  // those requests are served by pieces of one reserved address range
  // instead, its physical memory mapped and unmapped a granule at a time
  // (core/ranges.hpp): held memory goes back granule by granule whatever
  // pieces are still in use around it. Without such a backend, segments.
  bool expandable = false;
  // The range's granule: at least the backend's, rounded up to a multiple
  // of it (0: the backend's).
  std::size_t granule = 0;
};

// At most this many blocks of one bin wait for the device at a time. A loop
// that frees and at once reuses a size waits once per this many pairs when
// nothing else synchronizes (a context synchronize, 0.6-2.7 us on an idle
// H100, and its bookkeeping): the more blocks, the less that wait costs
// per pair. pending_growth bounds the bytes.
inline constexpr std::size_t kMaxPendingBlocks = 256;

struct AllocResult {
  Block* block = nullptr;
  BackendStatus status = BackendStatus::error;
  int error = 0;
  bool hit = false;
};

// How an allocation was served: by a held block or free piece (hit), by
// the backend (miss), or by memory its driver keeps outside the pool (a
// driver's memory pool: whether that reused memory it kept or grew is not
// known per allocation; Pool::note_outside_allocate).
enum class Served : unsigned char { miss, hit, outside };

// Sees every allocation and free (the trace file). Called outside pool locks.
class PoolObserver {
 public:
  virtual ~PoolObserver() = default;
  // Must not throw: the pool is mid-operation.
  virtual void on_allocate(const Arena& arena, const Block& block, Served how) noexcept = 0;
  virtual void on_free(const Arena& arena, const Block& block) noexcept = 0;
  // The arena is about to be destroyed: nothing refers to it afterwards.
  // Called, with no pool lock held, by whichever call lets go of the last
  // thing keeping a retired arena: the free or forget of its last active
  // block, retire_arena, reclaim(), or the end of a call that used several
  // arenas (totals(), snapshot(), free_held(), an out-of-memory or cap
  // release inside allocate() or free()...). So on any thread that calls
  // the pool, with whatever locks that caller holds: it (and a Backend's
  // destructor) must not take a lock a caller of the pool may hold.
  virtual void on_arena_destroyed(const Arena& /*arena*/) {}
};

// core/'s own types (core_detail): the pool's inside, not the shim's.
namespace core_detail {

class SegmentCache;
class RangeCache;
class OutsideCache;
class ArenaList;
struct Shard;

// The binned cache (core/binned.hpp has its shards and its hit path): here
// so that an arena holds it in place, one load fewer on the hit path.
class BinnedCache final : public Cache {
 public:
  BinnedCache(Backend& backend, unsigned shards);
  ~BinnedCache();

  unsigned shard_count() const { return count_; }
  inline Shard& shard(unsigned i) const;

  // What a request found: a ready block (its hit counted in the requesting
  // thread's shard), or none, and then whether its bin has blocks that only
  // wait for the device, and how many.
  struct Found {
    Block* block = nullptr;
    bool pending = false;
    std::size_t pending_blocks = 0;
    std::uint64_t oldest_fence = UINT64_MAX;  // of the pending blocks' queues' oldest
  };
  static constexpr std::size_t kNoBorrowing = SIZE_MAX;
  // A held block of `bin` for a request of `size` from shard `my`: its own
  // shard's first. Other shards' only when `look_past_pending` or its own
  // has none waiting (another thread may hold the block this one needs;
  // when its own blocks of the size only wait for the device, a growth or a
  // wait serves it instead: looking through every other thread's shard on
  // each allocation would make threads meet at their locks). Then, when no
  // block of the bin waits and `borrow_last` is not kNoBorrowing, the
  // smallest ready block of the bins up to borrow_last.
  [[gnu::always_inline]] inline Found take(unsigned my, std::size_t bin, std::size_t size,
                                           bool look_past_pending, std::size_t borrow_last);

  // A block the program freed: no longer active, and held in its shard's
  // bin if `keep()` says so, asked under the shard's lock (so that
  // stop_holding(), which clears the flag before it empties the shards,
  // never misses one). `on_hold()` runs before the block is published:
  // once in the bin, another thread may take it. False when it is not held
  // (also without memory for its place in the bin): the caller releases it.
  template <class Keep, class OnHold>
  bool hold(Block* b, Keep&& keep, OnHold&& on_hold);

  // Cache: each held block is an item; take_any() takes the newest block
  // of the first non-empty bin.
  void offer(Victims order, Offer& best) override;
  Held take_offered(const Offer& offer) override;
  Held take_any() override;
  void take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) override;
  std::size_t releasable_bytes() const override;
  void add_counters(Stats& s) const override;
  // Every shard's peaks: the per-thread peaks whose sum the stats show.
  void reset_peaks() override;

  // Whether any block of the arena (pieces of segments too: their counts
  // are the shards') is in the program's hands.
  bool any_active() const;
  // Held bytes and blocks per bin, for Pool::snapshot: added to `bins`
  // (indexed by bin number).
  void add_bins(std::vector<BinSnapshot>& bins) const;

  // fork(): every shard's lock taken (false: the wait gave up,
  // core/fork_wait.hpp), and released; a growth in flight, or a parked
  // piece on its way into the range, belonged to a thread the child does
  // not have.
  bool lock_all();
  void unlock_all();
  void forget_growth();

 private:
  // The rest of take(): other shards, then borrowing. Forced inline: it is
  // on the miss path.
  [[gnu::always_inline]] inline void take_elsewhere(unsigned my, std::size_t bin, std::size_t size,
                                                    bool look_past_pending, std::size_t borrow_last,
                                                    Found& f);

  Backend& backend_;
  unsigned count_;
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace core_detail

// One backend instance's blocks. Created by Pool::add_arena, owned by the
// pool. A retired arena is destroyed once none of its blocks is active and
// no pool-wide operation uses it: its counters are kept in the pool's
// retired totals (Pool::reclaim).
class Arena {
 public:
  ~Arena();
  const ArenaOptions& options() const { return options_; }
  Backend& backend() const { return *backend_; }
  bool retired() const { return retired_.load(std::memory_order_acquire); }
  Stats stats() const;
  // Held bytes the pool could give back now: held blocks, and segments none
  // of whose pieces is in use (free pieces of a partly used segment are
  // held but stay until the program frees the rest).
  std::size_t releasable_bytes() const;

  // The rest is core/'s own (the types are in core/arena.hpp).
  struct Group;
  Group& group() const { return *group_; }
  core_detail::BinnedCache& binned() { return binned_; }
  const core_detail::BinnedCache& binned() const { return binned_; }
  // When options().split_min != 0: one of the two.
  core_detail::SegmentCache* segments() const { return segments_.get(); }
  core_detail::RangeCache* ranges() const { return ranges_.get(); }
  // When the backend keeps memory outside the pool (Backend::outside).
  core_detail::OutsideCache* outside() const { return outside_.get(); }
  // Its caches, in the order the release policies look at them.
  std::span<core_detail::Cache* const> caches() const { return {caches_, cache_count_}; }
  // false once retired without its counters (a forked child's copy of its
  // parent's arena): its blocks and counters are the parent's, so neither
  // the stats nor the observer see them.
  bool counted() const { return keep_stats_.load(std::memory_order_acquire); }
  // Backend memory comes into the arena, or leaves it: given back
  // (release), or only forgotten (drop: the driver freed it with its
  // context, or it is a forked parent's).
  inline void took_memory(std::size_t size);  // (arena.hpp)
  void give_back(Handle h, std::size_t size, void* data, bool drop);
  // An item taken out of one of its caches: no longer held, given back (or
  // dropped), its block deleted.
  void let_go(const core_detail::Held& item, bool drop);
  // Every peak of its caches and counters down to its current value.
  void reset_peaks();
  // Adds to one of its slow-path counters (trims, oom_retries, ...).
  void count(std::uint64_t Stats::*counter, std::uint64_t n = 1);
  bool lock_counters() GPUPOOL_TRY_ACQUIRE(true, slow_mu_) {  // fork()
    return fork_wait::take(slow_mu_);
  }
  void unlock_counters() GPUPOOL_RELEASE(slow_mu_) { slow_mu_.unlock(); }

 private:
  friend class core_detail::ArenaList;
  Arena(std::unique_ptr<Backend> backend, ArenaOptions options, Group* group, unsigned shards,
        std::uint64_t (*clock)());

  std::unique_ptr<Backend> backend_;
  ArenaOptions options_;
  Group* group_;
  core_detail::BinnedCache binned_;
  std::unique_ptr<core_detail::SegmentCache> segments_;
  std::unique_ptr<core_detail::RangeCache> ranges_;
  std::unique_ptr<core_detail::OutsideCache> outside_;
  core_detail::Cache* caches_[3];
  std::size_t cache_count_ = 0;
  std::atomic<bool> retired_{false};
  std::atomic<bool> keep_stats_{true};
  // Pool-wide operations using the arena outside the arena list's lock, and
  // retire_arena while it empties it: reclaim() destroys only an arena with
  // none (ArenaList::Pinned). Under the arena list's lock.
  unsigned pins_ = 0;
  bool emptying_ = false;  // one of the pins is retire_arena's (ArenaList::fork_child)
  // Slow-path counters (backend calls).
  mutable Ranked<LockRank::arena_counters> slow_mu_;
  Stats slow_ GPUPOOL_GUARDED_BY(slow_mu_);
};

// A call that allocates, frees, retires, gives held memory back or reads
// counters may destroy retired arenas nothing keeps any more, on the
// caller's thread, and tell the observer (PoolObserver::on_arena_destroyed).
class Pool {
 public:
  explicit Pool(PoolOptions options = {});
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  const BinScheme& bins() const { return bins_; }

  Arena* add_arena(std::unique_ptr<Backend> backend, ArenaOptions options);

  // `hint` goes to the backend if it allocates (Backend::allocate).
  AllocResult allocate(Arena* arena, std::size_t size, std::uint64_t hint = 0);
  void free(Block* block);
  // An active block that must reach the backend when freed, never to be
  // handed out again (e.g. another process may have it mapped). A piece of
  // a split segment only when it is its whole segment.
  void never_reuse(Block* block) { block->pooled = false; }

  // The driver already freed the arena's memory (context destroyed): drop its
  // held blocks without releasing them; later frees of its active blocks are
  // dropped too (forget()). Once none is active the arena is destroyed and
  // its counters join the retired totals (keep_stats; a forked child drops
  // its parent's). The caller must not use `arena` afterwards.
  void retire_arena(Arena* arena, bool keep_stats = true);
  // Drop one active block without releasing it.
  void forget(Block* block);  // the observer sees it as a free (a counted arena's)
  // Destroy retired arenas with no active block. Never waits: an arena a
  // pool-wide operation (free_held, a snapshot, the control thread's
  // publishing...) uses meanwhile is destroyed when that operation lets go
  // of it.
  void reclaim();
  // Release the held blocks of one arena (e.g. its context is going away).
  void release_held(Arena* arena);

  // Release held blocks of the arenas of `group` (the memory one device
  // offers), largest first and the oldest of a size first, until at least
  // `wanted` bytes are released or as many as were held when it started
  // (blocks freed meanwhile stay held); returns the bytes released.
  std::size_t release_group(const std::string& group, std::size_t wanted);

  // PyOpenCL's controls.
  void free_held();
  void stop_holding();
  bool holding() const { return holding_.load(std::memory_order_relaxed); }

  // Release blocks held unused for longer than release_after; returns how many.
  std::size_t trim_idle(std::uint64_t now_ns);
  // Release `group`'s blocks held unused for at least `idle_ns`, largest
  // first (a process arrived on the GPU); returns the bytes, *blocks how many.
  std::size_t release_idle(const std::string& group, std::uint64_t idle_ns,
                           std::size_t* blocks = nullptr);
  std::uint64_t release_after_ns() const { return options_.release_after_ns; }

  Stats totals() const;
  // Every peak (peak_*), of every arena, its per-thread shards and the
  // destroyed arenas' rows, down to its current value, as PyTorch's
  // reset_peak_memory_stats does; the other counters go on.
  void reset_peaks();
  // The counters of the live arenas of one group (no per-bin walk: cheap
  // enough to call every few milliseconds).
  Stats group_totals(const std::string& group) const;
  std::size_t group_releasable(const std::string& group) const;  // Arena::releasable_bytes, summed
  // One row per arena, and one per kind for the destroyed retired arenas
  // carrying their counters, so the rows always add up to totals().
  std::vector<ArenaSnapshot> snapshot(std::size_t max_bins_per_arena = 8) const;
  std::size_t arena_count() const;  // arenas not yet destroyed

  void set_observer(PoolObserver* observer) {
    observer_.store(observer, std::memory_order_release);
  }
  bool observed() const { return observer_.load(std::memory_order_relaxed) != nullptr; }

  // An allocation the program made, and its free, of memory that `arena`'s
  // driver keeps outside the pool (Backend::outside: a driver's memory
  // pool), told to the observer as the pool's own are (trace, sites, leak
  // report); the stats count that memory through HeldOutside. `handle`
  // must be unique among the arena's allocations the observer was told of
  // and not of their free; the caller tells nothing of a retired arena.
  void note_outside_allocate(Arena& arena, Handle handle, std::size_t size);
  void note_outside_free(Arena& arena, Handle handle, std::size_t size);

  // fork(): take every lock before, release in the parent, reset in the child,
  // so a child never inherits a lock held by a thread that does not exist there.
  // false: a wait gave up (core/fork_wait.hpp); what was taken is journaled.
  bool fork_prepare();
  void fork_parent();
  void fork_child();

  // CLOCK_MONOTONIC_COARSE: block ages need milliseconds, not a syscall.
  static std::uint64_t now_ns();
  std::uint64_t now() const { return options_.clock ? options_.clock() : now_ns(); }

 private:
  std::uint64_t cost_now() const;  // options_.cost_clock, else CLOCK_MONOTONIC

  // The program's calls (pool.cpp). The hit path stays inlined into
  // allocate() (tests/bench/bench_pool measures it).
  [[gnu::always_inline]] inline AllocResult allocate_block(Arena& a, unsigned shard,
                                                           std::size_t size, bool pooled,
                                                           std::uint64_t hint);
  std::optional<BackendResult> grow(Arena& a, unsigned shard, std::size_t bin, std::size_t bytes,
                                    std::size_t pending_blocks, std::uint64_t hint);
  void wait_for_pending(Arena& a, unsigned shard, std::size_t bin);
  // A wait for the device (`wait()`), counted in shard `s`: fence_waits and
  // fence_wait_ns; what it took on the cost clock.
  template <class Wait>
  std::uint64_t counted_wait(core_detail::Shard& s, Wait&& wait);
  AllocResult allocate_piece(Arena& a, unsigned shard, std::size_t size, std::uint64_t hint);
  AllocResult allocate_range_piece(Arena& a, unsigned shard, std::size_t size, std::uint64_t hint);
  void free_piece(Block* b);
  void enforce_cap_nothrow(Arena& arena) noexcept;
  // Pool-wide (pool_wide.cpp).
  void empty(Arena& arena, bool drop);
  void unlock_arenas();  // fork_parent and fork_child

  PoolOptions options_;
  BinScheme bins_;
  unsigned shard_count_;
  std::atomic<bool> holding_;
  const bool borrow_;
  std::atomic<PoolObserver*> observer_{nullptr};
  std::unique_ptr<core_detail::ArenaList> arenas_;  // (core/arenas.hpp)
};

}  // namespace gpupool
