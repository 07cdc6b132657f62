// The range cache: large requests served by pieces of one reserved address
// range per arena, physical memory mapped into it granule by granule
// (ArenaOptions::expandable; PyTorch's expandable_segments).
//
// The range is address space only (Backend::reserve); its pieces tile it.
// A piece is in use (the program's), free (mapped, held for reuse),
// unmapped (address space with nothing behind it, starting and ending on
// granules) or dead: freed after the program shared it with another process
// (Pool::never_reuse: cuIpcGetMemHandle), which may still map its granules.
// A dead piece is never handed out: its granules are unmapped as soon as no
// piece in use shares them, and only then is its address space used again
// (with new physical memory). A request takes the best ready free piece
// that fits, cut to size from its start (the piece the range grows from
// only when no other fits); a large one (kTopRequest: also at least half
// the largest request asked of the range) the highest ready free piece
// that fits, cut from its end. Without one, the
// granules that serve it with the fewest bytes newly mapped: an unmapped
// piece, joined with the ready free pieces either side of it (growth at
// the range's end is the case of the unmapped piece that ends it). Freed
// pieces merge with their free neighbours, so the pieces never fragment
// across driver allocations: memory one phase of a program freed serves
// the sizes of the next, and memory held is given back granule by granule
// (the release policies' items are the whole granules of free pieces),
// whatever pieces are still in use around it.
//
// Safe reuse: a piece freed while the device may still use it (its fence
// has not passed) is not handed out. When it is the best fit, the pool
// waits for the device (as segments do). When only such pieces would
// serve, in a row once ready, new granules are mapped instead while the
// free pieces that wait for the device hold at most a bound (a
// kPendingShare of what is mapped, and the arena's pending_growth); past
// it, the pool waits once and every pending piece is ready.
//
// Backend calls (reserve, map, unmap) are made under this cache's lock, so
// that no other thread sees a granule half mapped or half given back; the
// lock is taken by nothing the backend calls. Internal to core/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "core/piece_cache.hpp"

namespace gpupool::core_detail {

class BinnedCache;
struct Shard;

// New granules are mapped instead of waiting for the device while the
// pending free pieces hold at most 1/kPendingShare of the mapped bytes
// (replayed: 1/8 takes the MNIST trace to 1.23x, 1/2 to 1.68x, 1/32 to
// 1.37x, where waiting sooner leaves pieces where they do not fit later).
inline constexpr std::size_t kPendingShare = 16;

// Requests of this size and more that are at least half the largest the
// range was asked for lately (a framework's workspaces, freed within a step) are
// cut from the end of the highest ready free piece that fits, not from
// the start of the best fit: the smaller requests, cut from the starts of
// best fits, stay below them, and the hole a workspace leaves at the top
// of the range is not cut up by the next step's smaller pieces (it grows
// at the range's end when a larger one comes). Smaller requests take the
// free piece the range grows from only when no other ready piece fits.
// Replayed, the CNN at batch 128 (H200 traces) takes 1.434x its peak
// active so, 1.842x with best fit for all; at batches 256 and 512, whose
// activations are of workspace sizes, 1.372x and 1.406x, against 2.03x
// and 2.99x from 64 MiB alone (no half of the largest; any share from 0.4
// to 0.75 gives the same; docs/memory.md).
inline constexpr std::size_t kTopRequest = std::size_t{64} << 20;

class RangeCache final : public PieceCache<LockRank::arena_ranges> {
 public:
  // `granule`: what is mapped at a time (a multiple of the backend's);
  // `reserve`: the range's bytes; `min_rest`: a free piece is cut when at
  // least this much is left; `pending_growth`: bytes pending pieces may hold
  // before a request waits rather than map more; `cap`: the group's held
  // bytes (free mapped bytes count); `retired`: the arena's flag (a retired
  // arena's memory went with its context: dropped, never unmapped).
  // `binned`: the arena's shards, where freed pieces are parked
  // (Shard::park).
  RangeCache(Backend& backend, HeldCap& cap, BinnedCache& binned, std::size_t granule,
             std::size_t reserve, std::size_t min_rest, std::size_t pending_growth,
             const std::atomic<bool>& retired, std::uint64_t (*clock)());
  ~RangeCache();

  std::size_t granule() const { return granule_; }
  std::size_t min_rest() const { return min_rest_; }
  // The bytes one slot's stock may add (Shard's header): pending_growth
  // shared among the slots, so that all threads' stocks together map at
  // most that beyond the pieces the program uses.
  std::size_t stock_budget() const;

  // Whether pieces may be parked and taken from the parks: not while the
  // range has dead pieces, whose granules go as soon as no piece in use
  // shares them (a parked piece is in use as the range sees it), nor while
  // a piece is on its way to dying (between dying() and its free(), when
  // another free's reap may have found no dead piece yet). Read under a
  // shard's lock; dying() counts itself before it empties the parks.
  bool parking() const {
    return dyings_.load(std::memory_order_acquire) == 0 &&
           !any_dead_.load(std::memory_order_acquire);
  }
  // A piece is about to be freed dead (never to be reused; its free(),
  // with `reusable` false, follows): no more parking until that free has
  // reaped, and every parked piece into the range, where that free reaps
  // the granules no piece in use shares any more.
  void dying();
  // A piece pushed out of its shard's park (Shard::park) into the range,
  // as free() would have put it there at its own free (its fence and
  // time; held if `keep`, asked under the range's lock); `b` deleted.
  // What went back to the backend is returned (Arena::let_go).
  Held unpark(Block* b, const std::atomic<bool>& keep);
  // Every shard's parked pieces into the range, held: before the range
  // maps more for a request (`hinted`: shards whose park looked empty
  // without their lock are skipped, and the pending pieces of a slot's
  // stock stay: in the range they would serve nothing at once, and the slot
  // would grow its stock again), and before each release policy looks
  // at the range (the Cache calls below: every shard locked, so that a
  // piece parked before stop_holding() cleared the flag is always seen),
  // so that parking never costs memory; only those freed at or before
  // `freed_by_ns` (idle release). Whether there were any. With `keep`
  // (the pool's flag: a growth), as unpark() puts each, what went back to
  // the backend added to *gone.
  bool unpark_all(bool hinted = false, std::uint64_t freed_by_ns = UINT64_MAX,
                  const std::atomic<bool>* keep = nullptr, Held* gone = nullptr);
  // One slot's parked pieces into the range, as free() puts a piece there
  // (held if `keep`, asked under the range's lock; reaped around): before
  // the range serves a request of `want` bytes of that slot's that no
  // piece parked there did, so that the range chooses among the slot's
  // free pieces as without parking (a pending best fit is waited for).
  // Pending pieces smaller than the request stay: they cannot serve it,
  // and in the range they would make later requests of their own size
  // wait, where parked they serve them after the next wait. Other slots'
  // pieces stay (they would go back and forth between threads that miss
  // in turn). What went back to the backend is returned (Arena::let_go).
  Held unpark_slot(unsigned shard, std::size_t want, const std::atomic<bool>& keep);

  // A piece handed to the program.
  struct Cut {
    Handle at = 0;
    std::size_t size = 0;    // 0: none
    std::size_t mapped = 0;  // bytes mapped for it (a growth)
    void* data = nullptr;    // the range's record
  };
  // The best ready free piece for `want` bytes (a multiple of
  // kPieceGranule). None when no ready piece fits; then, on a first
  // attempt, *wait is the fence to wait for rather than map more (pending
  // pieces would serve, and hold more than the bound), else 0.
  Cut take(std::size_t want, bool first_attempt, std::uint64_t* wait);
  // New granules mapped for `want` bytes (the range reserved first if it
  // is not yet). The backend's failure is returned as is (out of memory:
  // the caller releases and retries); *no_room when the range cannot hold
  // it (or cannot be reserved): the caller serves the request otherwise.
  BackendResult grow(std::size_t want, Cut* cut, bool* no_room);

  // The program freed the piece at `at` (fence, at t_ns). Held when
  // `reusable` and `keep` (asked under this cache's lock, so that
  // stop_holding() never misses it); without `keep` its whole granules are
  // unmapped at once. Not `reusable` (another process may map it): dead,
  // its granules unmapped once no piece in use shares them. What was
  // unmapped is returned, to be counted (Arena::let_go). *over_cap: holding
  // it put the group over its cap. Allocates nothing unless there are dead
  // pieces (spare nodes for their splits; a failure only puts those off).
  Held free(Handle at, std::uint64_t fence, std::uint64_t t_ns, bool reusable,
            const std::atomic<bool>& keep, bool* over_cap);
  // The piece at `at` let go without a fence (its memory went with its
  // context, or it is a forked parent's): its whole free granules dropped.
  Held forget(Handle at, std::uint64_t t_ns);

  // Cache: the whole granules of each free piece are an item, unmapped
  // when taken (the Held says so: already given back).
  void offer(Victims order, Offer& best) override;
  Held take_offered(const Offer& offer) override;
  Held take_any() override;
  void take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) override;
  std::size_t releasable_bytes() const override;

 private:
  using FreeSet = std::set<std::pair<std::size_t, Handle>>;  // (size, address): best fit
  enum class State : unsigned char { used, free, unmapped, dead };
  struct Piece {
    std::size_t size = 0;
    State state = State::used;
    std::uint64_t fence = 0;        // free pieces: ready once passed
    std::uint64_t freed_at_ns = 0;  // free pieces: the latest free merged in
    // Every piece owns one node: in free_ while free, in unmapped_ while
    // unmapped, in dead_ while dead, here while in use. A free merges pieces, which only lets
    // nodes go.
    FreeSet::node_type node;
  };
  using Pieces = std::map<Handle, Piece>;

  // Pieces made ahead (both their nodes), so that giving granules back,
  // which may split a free piece in three, allocates nothing.
  static constexpr std::size_t kSpares = 4;
  Pieces::iterator unpark_locked(Block* b) GPUPOOL_REQUIRES(mu_);
  // `s`'s parked pieces freed at or before freed_by_ns, those the device
  // is not done with only from pending_from bytes (none of a slot that
  // keeps a stock, with spare_stock), into the range: held, or with `keep`
  // as unpark() puts them (what went back added to *gone). Whether there
  // were any. Takes s.mu, then mu_.
  bool unpark_shard(Shard& s, std::uint64_t freed_by_ns, std::size_t pending_from,
                    const std::atomic<bool>* keep, Held* gone, bool spare_stock = false);
  void make_spares() GPUPOOL_REQUIRES(mu_);  // may throw
  void refill() GPUPOOL_REQUIRES(mu_);       // make_spares(), or not now
  bool spares_for(Handle at, const Piece& p) const GPUPOOL_REQUIRES(mu_);
  // A piece from the spares, placed at `at`.
  Pieces::iterator place(Handle at, std::size_t size, State state) GPUPOOL_REQUIRES(mu_);

  void add_free(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  void remove_free(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  void add_unmapped(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  void remove_unmapped(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  // Any state: out of its set (in use), or into the set of `s`.
  void detach(Handle at, Piece& p) GPUPOOL_REQUIRES(mu_);
  void attach(Handle at, Piece& p, State s) GPUPOOL_REQUIRES(mu_);
  // Ready: may be handed out (its fence passed, or the device's work
  // ordered after it: Backend::reusable). Done: the device is done with it,
  // so its granules may be unmapped.
  bool ready(const Piece& p) const { return p.fence == 0 || backend_.reusable(p.fence); }
  bool done(const Piece& p) const { return p.fence == 0 || backend_.passed(p.fence); }
  // Merge `it` with its neighbours in the same state (free ones only when
  // as ready as it is, unless the backend orders: Backend::orders); returns
  // the merged piece. Allocates nothing.
  Pieces::iterator merge(Pieces::iterator it) GPUPOOL_REQUIRES(mu_);
  // Merge neighbouring free pieces that are both ready (or, pending_too,
  // whatever their fences: the later one covers the merged piece); whether
  // any merged. Allocates nothing.
  bool coalesce(bool pending_too = false) GPUPOOL_REQUIRES(mu_);
  // The whole granules of a free piece: [*from, *from + bytes).
  std::size_t whole_granules(Handle at, const Piece& p, Handle* from) const GPUPOOL_REQUIRES(mu_);
  // The whole granules of the free piece `it` unmapped (dropped when
  // `drop`); returns them, as a Held already given back, or nothing when
  // there are none or no spare pieces for the split. Allocates nothing.
  Held give_back(Pieces::iterator it, bool drop) GPUPOOL_REQUIRES(mu_);
  // The free piece `it` handed out: cut to `want` when the rest is at
  // least min_rest, the part handed out from its end when `from_end`.
  Cut cut(Pieces::iterator it, std::size_t want, bool from_end) GPUPOOL_REQUIRES(mu_);
  // `want` bytes from the ready free pieces, `best` (the best fit, ready)
  // among them: from the start of `best` (of the next best when `best` is
  // the piece the range grows from), or for a large request (kTopRequest)
  // from the end of the highest ready piece that fits.
  Cut serve(FreeSet::iterator best, std::size_t want) GPUPOOL_REQUIRES(mu_);
  // The free pieces that wait for the device: their bytes, and the fence
  // after which all are ready.
  std::size_t pending_bytes(std::uint64_t* last_fence) const GPUPOOL_REQUIRES(mu_);
  // Dead pieces' granules that no piece in use shares, unmapped (dropped
  // when retired): what went, as one Held already given back. Makes spare
  // nodes first (not failing: what the spares cannot split waits for a
  // later call).
  Held reap() GPUPOOL_REQUIRES(mu_);
  bool reap_one(Handle at, std::size_t* unmapped) GPUPOOL_REQUIRES(mu_);
  // [from, to) (granules, every piece in it free or dead) unmapped and
  // made one unmapped piece; the pieces astride its ends split. Two spares.
  void unmap_span(Handle from, Handle to) GPUPOOL_REQUIRES(mu_);
  // The free or dead piece `it` cut at `at`: the part from `at` is a piece
  // of its own in the same state. One spare.
  Pieces::iterator split(Pieces::iterator it, Handle at) GPUPOOL_REQUIRES(mu_);
  bool fits_once_ready(std::size_t want) const GPUPOOL_REQUIRES(mu_);

  Backend& backend_;
  HeldCap& cap_;
  BinnedCache& binned_;
  const std::size_t granule_, reserve_, min_rest_, pending_growth_;
  const std::atomic<bool>& retired_;
  std::uint64_t (*const clock_)();
  // mu_ (PieceCache's) is taken by nothing the backend calls; the
  // backend's reserve, map, unmap and passed run under it (the header).
  // c_ counts the free pieces.
  Handle base_ GPUPOOL_GUARDED_BY(mu_) = 0;  // 0: not reserved yet
  void* data_ GPUPOOL_GUARDED_BY(mu_) = nullptr;
  bool unreservable_ GPUPOOL_GUARDED_BY(mu_) = false;  // reserve() failed: never again
  // The last kTopWindow requests of kTopRequest or more (a request that
  // waited counted once more): the workspace rule (kTopRequest) compares
  // with the largest of them, what the program asks for lately, so that
  // one huge request early (a checkpoint loaded) does not turn the rule off
  // for the rest of the run.
  static constexpr unsigned kTopWindow = 64;
  std::size_t recent_large_[kTopWindow] GPUPOOL_GUARDED_BY(mu_) = {};
  unsigned recent_next_ GPUPOOL_GUARDED_BY(mu_) = 0;
  std::size_t mapped_ GPUPOOL_GUARDED_BY(mu_) = 0;
  Pieces pieces_ GPUPOOL_GUARDED_BY(mu_);
  FreeSet free_ GPUPOOL_GUARDED_BY(mu_);
  FreeSet unmapped_ GPUPOOL_GUARDED_BY(mu_);
  FreeSet dead_ GPUPOOL_GUARDED_BY(mu_);
  std::vector<Pieces::node_type> spares_ GPUPOOL_GUARDED_BY(mu_);
  std::atomic<bool> any_dead_{false};  // !dead_.empty(), as of the last reap()
  std::atomic<unsigned> dyings_{0};    // dying() calls whose free() has not reaped yet
};

}  // namespace gpupool::core_detail
