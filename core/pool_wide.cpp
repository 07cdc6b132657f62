// The pool (pool.hpp): what the runtime asks of it as a whole. Arenas
// retired and reclaimed, held memory given back (PyOpenCL's controls, the
// idle trim, another process's request), the counters, fork. Each works on
// pinned arenas (arenas.hpp), so none waits for another.
#include <algorithm>
#include <string>
#include <vector>

#include "core/arena.hpp"
#include "core/arenas.hpp"
#include "core/fork_wait.hpp"
#include "core/pool.hpp"
#include "core/release.hpp"

namespace gpupool {

using namespace core_detail;
namespace {

bool live(const Arena& a) { return !a.retired(); }

// The live arenas of `group`, pinned. A retired arena's memory is its
// driver's: whoever uses one checks again that it is live (it may retire
// meanwhile), as main did.
ArenaList::Pinned pin_group(ArenaList& arenas, const std::string& group) {
  return arenas.pin([&](const Arena& a) { return live(a) && a.group().name == group; });
}

}  // namespace

void Pool::retire_arena(Arena* arena, bool keep_stats) {
  // Once retired with no block active, the arena may be destroyed by a
  // reclaim() on another thread (the control thread's periodic check, a
  // free): pinned while it is emptied. The last touch is the end of
  // `retiring` (a drop that throws included), which destroys it when
  // nothing else keeps it.
  const ArenaList::Retiring retiring = arenas_->retire(arena, keep_stats);
  empty(*arena, /*drop=*/true);
}

void Pool::reclaim() { arenas_->reclaim(); }

// Every item held by the arena's caches, given back (or let go: the driver
// already freed it). Blocks first, as main's empty_held did (the release
// policies look at segments first: Arena::caches). One at a time, so that
// nothing is allocated (this runs when a context is torn down, where
// failing half-way is not an option).
void Pool::empty(Arena& arena, bool drop) {
  auto empty_cache = [&](Cache& c) {
    for (Held item; (item = c.take_any()).size;) arena.let_go(item, drop);
  };
  empty_cache(arena.binned());
  if (arena.segments()) empty_cache(*arena.segments());
  if (arena.ranges()) empty_cache(*arena.ranges());
  if (arena.outside()) empty_cache(*arena.outside());
}

void Pool::release_held(Arena* arena) {
  if (!arena->retired()) empty(*arena, /*drop=*/false);
}

void Pool::free_held() {
  for (Arena* a : arenas_->pin(live)) release_held(a);
}

void Pool::stop_holding() {
  holding_.store(false, std::memory_order_seq_cst);
  free_held();
}

std::size_t Pool::release_group(const std::string& group, std::size_t wanted) {
  return release_largest(pin_group(*arenas_, group).arenas(), wanted);
}

std::size_t Pool::trim_idle(std::uint64_t now) {
  if (options_.release_after_ns == 0 || now < options_.release_after_ns) return 0;
  std::size_t blocks = 0;
  release_freed_by(arenas_->pin(live).arenas(), now - options_.release_after_ns, &blocks);
  return blocks;
}

std::size_t Pool::release_idle(const std::string& group, std::uint64_t idle_ns,
                               std::size_t* blocks) {
  const std::uint64_t t = now();
  if (t < idle_ns) return 0;
  std::size_t n = 0;
  const std::size_t bytes = release_freed_by(pin_group(*arenas_, group).arenas(), t - idle_ns, &n);
  if (blocks) *blocks = n;
  return bytes;
}

// Pinned before the retired totals are read: an arena destroyed before the
// pin is in them by then, and a pinned one cannot be destroyed until the
// pin goes, so each is counted once (the counters never go backwards).
Stats Pool::totals() const {
  const ArenaList::Pinned counted = arenas_->pin([](const Arena& a) { return a.counted(); });
  Stats t;
  arenas_->add_retired(t);
  for (Arena* a : counted) t += a->stats();
  return t;
}

// Pinned first, as totals(): a counted arena is reset, or destroyed before
// the pin and so in the retired rows by then.
void Pool::reset_peaks() {
  const ArenaList::Pinned counted = arenas_->pin([](const Arena& a) { return a.counted(); });
  arenas_->reset_retired_peaks();
  for (Arena* a : counted) a->reset_peaks();
}

std::size_t Pool::arena_count() const { return arenas_->size(); }

std::size_t Pool::group_releasable(const std::string& group) const {
  std::size_t n = 0;
  for (Arena* a : pin_group(*arenas_, group))
    if (live(*a)) n += a->releasable_bytes();
  return n;
}

Stats Pool::group_totals(const std::string& group) const {
  Stats s;
  for (Arena* a : pin_group(*arenas_, group))
    if (live(*a)) s += a->stats();
  return s;
}

// Pinned first, as totals().
std::vector<ArenaSnapshot> Pool::snapshot(std::size_t max_bins) const {
  // Not a forked child's copies of its parent's arenas.
  const ArenaList::Pinned counted = arenas_->pin([](const Arena& a) { return a.counted(); });
  std::vector<ArenaSnapshot> out = arenas_->retired_rows();
  for (Arena* a : counted) {
    ArenaSnapshot snap;
    snap.name = a->options().name;
    snap.group = a->options().group;
    snap.kind = a->options().kind;
    snap.device = a->options().device;
    snap.retired = a->retired();
    snap.stats = a->stats();
    std::vector<BinSnapshot> bins;
    a->binned().add_bins(bins);
    std::erase_if(bins, [](const BinSnapshot& b) { return b.held_blocks == 0; });
    std::sort(bins.begin(), bins.end(), [](const BinSnapshot& x, const BinSnapshot& y) {
      return x.held_bytes > y.held_bytes;
    });
    if (bins.size() > max_bins) bins.resize(max_bins);
    snap.bins = std::move(bins);
    out.push_back(std::move(snap));
  }
  return out;
}

// Every lock of the pool, in rank order (core/lock_rank.hpp): the list's,
// then each kind of arena lock for every arena at once. The handlers take
// locks in one function and let go of them in another, and every arena's
// at once: out of the thread-safety analysis's sight. A wait that gives up
// (core/fork_wait.hpp) ends it: what it took is in the fork's journal.
bool Pool::fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  lock_rank::entering_fork();
  fork_wait::journal([](void*) { lock_rank::leaving_fork(); }, nullptr);
  if (!arenas_->fork_prepare()) return false;
  const auto& all = arenas_->locked_arenas();
  for (auto& a : all)
    if (!a->lock_counters()) return false;
  for (auto& a : all)
    if (!a->binned().lock_all()) return false;
  for (auto& a : all)
    if (a->segments() && !a->segments()->lock()) return false;
  for (auto& a : all)
    if (a->ranges() && !a->ranges()->lock()) return false;
  return true;
}

void Pool::unlock_arenas() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  const auto& all = arenas_->locked_arenas();
  for (auto& a : all)
    if (a->ranges()) a->ranges()->unlock();
  for (auto& a : all)
    if (a->segments()) a->segments()->unlock();
  for (auto& a : all) a->binned().unlock_all();
  for (auto& a : all) a->unlock_counters();
}

void Pool::fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  unlock_arenas();
  arenas_->fork_parent();
  lock_rank::leaving_fork();
}

void Pool::fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  // A growth in flight belonged to a thread the child does not have, and so
  // did any pin of an arena (ArenaList::fork_child).
  for (auto& a : arenas_->locked_arenas()) a->binned().forget_growth();
  unlock_arenas();
  arenas_->fork_child();
  lock_rank::leaving_fork();
}

}  // namespace gpupool
