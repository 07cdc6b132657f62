#include "core/pool.hpp"
#include "core/arena.hpp"
#include "core/arenas.hpp"
#include "core/hot_tls.hpp"
#include "core/segments.hpp"
#include "core/spin_lock.hpp"

#include <algorithm>
#include <bit>
#include <ctime>
#include <optional>
#include <thread>

namespace gpupool {


Arena::Arena(std::unique_ptr<Backend> backend, ArenaOptions options, unsigned shards, Group* group)
    : backend_(std::move(backend)),
      options_(std::move(options)),
      group_(group),
      shard_count_(shards),
      shards_(new Shard[shards]),
      segments_(options_.split_min ? new Segments : nullptr) {}

Arena::~Arena() = default;

Stats Arena::stats() const {
  Stats s;
  for (unsigned i = 0; i < shard_count_; ++i) {
    std::lock_guard lock(shards_[i].mu);
    s += shards_[i].c;
  }
  if (segments_) {
    std::lock_guard lock(segments_->mu);
    s += segments_->c;
  }
  std::lock_guard lock(slow_mu_);
  s += slow_;
  return s;
}

namespace {

// Rounds of asking other holders (Backend::relieve) before out-of-memory
// goes back to the program. One: a round already asks every holder, and its
// wait is the bound the program was promised.
constexpr int kRelieveRounds = 1;

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

}  // namespace

// Growth of a bin whose blocks all wait for the device. One wait frees every
// pending block, so a loop that frees and at once reuses a size pays one wait
// per (blocks in the bin) pairs: more blocks, fewer waits. But a fresh block
// costs a driver allocation (H100: ~40 us device, 0.65-190 ms pinned) and a
// wait may cost ~1 us (idle device) or a whole queue (busy one). Ski rental:
// a bin grows only while the time its waits took covers the time its growths
// took (the first growth is free), so growing never costs more than about
// what waiting did: fast when waits are stalls, slowly when they are cheap.
// Bounded in bytes by pending_growth and in count by kMaxPendingBlocks.

static std::uint64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

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
  return arenas_->add(std::move(backend), std::move(options), shard_count_);
}

AllocResult Pool::allocate(Arena* arena, std::size_t size, std::uint64_t hint) {
  Arena& a = *arena;
  Backend& backend = *a.backend_;
  const unsigned my = thread_slot() & (a.shard_count_ - 1);
  Arena::Shard& mine = a.shards_[my];
  const bool pooled = size <= a.options_.max_pooled && size <= a.options_.max_block;
  const std::size_t bin = bins_.bin_number(size);
  if (pooled && a.segments_ && size >= a.options_.split_min) return allocate_split(a, my, size, hint);
  // What a fresh block takes: not needed on a hit.
  auto want_size = [&] {
    return pooled ? std::min(bins_.alloc_size(bin), a.options_.max_block) : size;
  };

  Block* b = nullptr;
  std::optional<BackendResult> fresh;  // a block allocated instead of waiting
  if (pooled) {
    for (int attempt = 0; attempt < 2 && !b; ++attempt) {
      bool pending = false;
      std::size_t pending_blocks = 0;
      bool counted = false;  // b's hit already counted in its own shard
      {
        std::lock_guard lock(mine.mu);
        b = mine.take(bin, backend, &pending, &pending_blocks);
        if (b) {
          b->requested = size;
          ++mine.c.hits;
          mine.add_active(b);
          counted = true;
        }
      }
      // Another thread may hold the block this one needs, unless this
      // thread's own blocks of the size only wait for the device (then its
      // growth or a wait serves it: looking through every other thread's
      // shard on each allocation would make threads meet at their locks).
      const bool own_pending = pending;
      for (unsigned i = 1; i < a.shard_count_ && !b && !(own_pending && attempt == 0); ++i) {
        Arena::Shard& other = a.shards_[(my + i) & (a.shard_count_ - 1)];
        std::lock_guard lock(other.mu);
        b = other.take(bin, backend, &pending, &pending_blocks);
      }
      // Nothing of this size: a held block up to twice as large serves it
      // rather than a fresh one (sizes a program uses in one phase and not
      // the next would otherwise each keep their own blocks).
      if (!b && !pending && borrow_) {
        const std::size_t want = want_size();
        const std::size_t last = bins_.bin_number(want > SIZE_MAX / 2 ? SIZE_MAX : 2 * want);
        for (unsigned i = 0; i < a.shard_count_ && !b; ++i) {
          Arena::Shard& sh = a.shards_[(my + i) & (a.shard_count_ - 1)];
          std::lock_guard lock(sh.mu);
          b = sh.take_larger(bin, last > bin ? last - 1 : bin, backend);
        }
      }
      if (b && !counted) {
        b->shard = static_cast<std::uint8_t>(my);
        b->requested = size;
        std::lock_guard lock(mine.mu);
        ++mine.c.hits;
        mine.add_active(b);
      }
      if (b) a.group_->unhold(b->size);
      if (b || !pending) break;
      // Only blocks the device may still use: grow the bin, or wait for
      // them all (see kMaxPendingBlocks).
      if (attempt == 0 && (fresh = grow(a, my, bin, want_size(), pending_blocks, hint))) break;
      wait_for_pending(a, my, bin);
    }
  }

  if (b) {
    if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_allocate(a, *b, true);
    return {b, BackendStatus::ok, 0, true};
  }

  const std::size_t want = want_size();
  bool exact = false;
  BackendResult r = fresh ? *fresh : backend_allocate(a, want, size, hint, &exact);
  if (r.status != BackendStatus::ok) {
    std::lock_guard lock(mine.mu);
    ++mine.c.misses;
    return {nullptr, r.status, r.error, false};
  }
  try {
    b = new Block;
  } catch (...) {
    // Nothing may be left half-done: the fresh allocation goes back.
    a.backend_->release(r.handle, exact ? size : want, r.data);
    throw;
  }
  b->handle = r.handle;
  b->data = r.data;
  // An exact-size fallback block does not fit its bin: released at free.
  b->size = exact ? size : want;
  b->pooled = pooled && !exact;
  b->requested = size;
  b->arena = arena;
  b->bin = static_cast<std::uint16_t>(bin);
  b->shard = static_cast<std::uint8_t>(my);
  {
    std::lock_guard lock(mine.mu);
    ++mine.c.misses;
    mine.add_active(b);
  }
  took_memory(a, b->size);
  if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_allocate(a, *b, false);
  return {b, BackendStatus::ok, 0, false};
}

// A fresh block for a bin whose `pending_blocks` blocks all wait, if the
// growth rule allows one. Never makes the pool give held memory back: without
// room, the caller waits. (Every pooled block of a bin is `bytes` long: the
// pending ones and the fresh one must fit the budget together.)
std::optional<BackendResult> Pool::grow(Arena& a, unsigned shard, std::size_t bin,
                                        std::size_t bytes, std::size_t pending_blocks,
                                        std::uint64_t hint) {
  if (pending_blocks >= kMaxPendingBlocks ||
      bytes > a.options_.pending_growth / (pending_blocks + 1))
    return std::nullopt;
  Arena::Shard& s = a.shards_[shard];
  {
    std::lock_guard lock(s.mu);
    Arena::BinGrowth& g = s.growth_of(bin);
    if (g.growing || g.credit_ns < 0) return std::nullopt;
    g.growing = true;
  }
  const std::uint64_t t0 = cost_now();
  BackendResult r = a.backend_->allocate(bytes, hint);
  const std::uint64_t took = cost_now() - t0;
  std::lock_guard lock(s.mu);
  Arena::BinGrowth& g = s.growth_of(bin);
  g.growing = false;
  if (r.status != BackendStatus::ok) return std::nullopt;
  g.credit_ns -= static_cast<std::int64_t>(took);
  return r;
}

// One bulk wait; its time is credited to the bin that needed it.
void Pool::wait_for_pending(Arena& a, unsigned shard, std::size_t bin) {
  const std::uint64_t t0 = cost_now();
  a.backend_->wait_all();
  const std::uint64_t took = cost_now() - t0;
  Arena::Shard& s = a.shards_[shard];
  std::lock_guard lock(s.mu);
  ++s.c.fence_waits;
  s.growth_of(bin).credit_ns += static_cast<std::int64_t>(took);
}

// Allocate `bytes` from the backend, releasing held blocks on out-of-memory
// (largest first, this arena's group before others) and retrying; if the
// rounded size still does not fit, try the exact size (*used_exact).
BackendResult Pool::backend_allocate(Arena& a, std::size_t bytes, std::size_t exact,
                                     std::uint64_t hint, bool* used_exact) {
  BackendResult r = a.backend_->allocate(bytes, hint);
  // We cannot know how much is missing: release the largest held block
  // first, then at least as much again each round, so a large request needs
  // few retries and at most twice the missing memory is given back.
  std::size_t released = 0;
  while (r.status == BackendStatus::out_of_memory) {
    const std::size_t now_released = release_for_oom(a, std::max<std::size_t>(released, 1));
    if (now_released == 0) break;
    released += now_released;
    {
      std::lock_guard lock(a.slow_mu_);
      ++a.slow_.oom_retries;
    }
    r = a.backend_->allocate(bytes, hint);
  }
  // Nothing more of ours to release: other holders of the same memory may
  // release theirs (a bounded wait, a few rounds at most).
  for (int round = 0; round < kRelieveRounds && r.status == BackendStatus::out_of_memory &&
                      a.backend_->relieve(bytes);
       ++round) {
    {
      std::lock_guard lock(a.slow_mu_);
      ++a.slow_.oom_retries;
    }
    r = a.backend_->allocate(bytes, hint);
  }
  if (r.status == BackendStatus::out_of_memory && exact < bytes) {
    r = a.backend_->allocate(exact, hint);
    *used_exact = r.status == BackendStatus::ok;
  }
  return r;
}

std::size_t Pool::release_for_oom(Arena& arena, std::size_t wanted) {
  // Tiers: this arena, its group, everything else.
  const ArenaList::Pinned live = arenas_->pin([](const Arena& x) { return !x.retired(); });
  std::vector<std::vector<Arena*>> tiers(3);
  for (Arena* x : live) {
    tiers[x == &arena ? 0 : x->group_ == arena.group_ ? 1 : 2].push_back(x);
  }
  std::size_t released = 0;
  for (auto& tier : tiers) {
    released += release_largest(tier, wanted - released);
    if (released >= wanted) break;
  }
  return released;
}

std::size_t Pool::release_group(const std::string& group, std::size_t wanted) {
  const ArenaList::Pinned mine =
      arenas_->pin([&](const Arena& x) { return !x.retired() && x.group_->name == group; });
  return release_largest(mine.arenas(), wanted);
}

// The arenas are pinned (ArenaList::Pinned). Takes at most what the arenas held
// when it started: blocks the program frees meanwhile are not chased (a
// program that keeps freeing would otherwise keep the caller, the control
// thread answering a request, releasing for as long as it runs).
std::size_t Pool::release_largest(const std::vector<Arena*>& arenas, std::size_t wanted) {
  std::size_t held_at_start = 0;
  for (Arena* x : arenas) held_at_start += x->releasable_bytes();
  wanted = std::min(wanted, held_at_start);
  std::size_t released = 0;
  while (released < wanted) {
    // Find the largest held block.
    Arena* best_arena = nullptr;
    unsigned best_shard = 0;
    std::size_t best_bin = 0, best_size = 0;
    bool best_segment = false;  // a wholly free segment of best_arena
    for (Arena* x : arenas) {
      if (const std::size_t seg = largest_free_segment(*x); seg > best_size) {
        best_arena = x, best_size = seg, best_segment = true;
      }
      for (unsigned i = 0; i < x->shard_count_; ++i) {
        Arena::Shard& s = x->shards_[i];
        std::lock_guard lock(s.mu);
        for (std::size_t bin = s.bins.size(); bin-- > 0;)
          if (!s.bins[bin].empty()) {
            if (s.bins[bin].back()->size > best_size) {
              best_arena = x, best_shard = i, best_bin = bin, best_segment = false;
              best_size = s.bins[bin].back()->size;
            }
            break;
          }
      }
    }
    if (!best_arena) break;
    if (best_segment) {  // the largest wholly free one, whichever it is now
      released += release_segments(*best_arena, 1, /*drop=*/false);
      continue;
    }
    Block* victim = nullptr;
    {
      Arena::Shard& s = best_arena->shards_[best_shard];
      std::lock_guard lock(s.mu);
      if (best_bin < s.bins.size() && !s.bins[best_bin].empty()) {
        victim = s.bins[best_bin].front();  // oldest: least likely still pending
        s.bins[best_bin].pop_front();
        s.unheld(victim);
      }
    }
    if (!victim) continue;  // raced with a hit; look again
    best_arena->group_->unhold(victim->size);
    released += victim->size;
    release_block(victim);
  }
  return released;
}

// Driver memory came into the pool.
void Pool::took_memory(Arena& a, std::size_t size) {
  std::lock_guard lock(a.slow_mu_);
  ++a.slow_.backend_allocs;
  a.slow_.managed_bytes += size;
  a.slow_.peak_managed_bytes = std::max(a.slow_.peak_managed_bytes, a.slow_.managed_bytes);
}

// Driver memory leaves the pool: given back (release), or only forgotten
// (drop: the driver freed it with its context, or it is a forked parent's).
void Pool::give_back(Arena& a, Handle h, std::size_t size, void* data, bool drop) {
  if (drop) {
    a.backend_->drop(h, size, data);
  } else {
    a.backend_->release(h, size, data);
  }
  std::lock_guard lock(a.slow_mu_);
  if (!drop) ++a.slow_.backend_frees;
  a.slow_.managed_bytes -= size;
}

void Pool::release_block(Block* b) {
  give_back(*b->arena, b->handle, b->size, b->data, /*drop=*/false);
  delete b;
}

void Pool::drop_block(Block* b) {
  give_back(*b->arena, b->handle, b->size, b->data, /*drop=*/true);
  delete b;
}

void Pool::free(Block* b) {
  Arena& a = *b->arena;
  if (a.retired()) return forget(b);
  if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_free(a, *b);
  if (b->split) return free_split(b);

  Backend& backend = *a.backend_;
  Arena::Shard& s = a.shards_[b->shard];
  bool held = false, over_cap = false;
  // A block larger than the whole cap would only push everything else out.
  if (b->pooled && a.group_->capped() && b->size > a.group_->max_held) b->pooled = false;
  if (b->pooled) {
    b->fence = backend.fence();
    b->freed_at_ns = now();
  }
  {
    std::lock_guard lock(s.mu);
    s.remove_active(b);
    // Checked under the shard lock so that a concurrent stop_holding(), whose
    // free_held() takes this lock after clearing the flag, never misses it.
    // Without room to hold it (the allocation for it failed), the block is
    // released instead: a free never fails.
    if (b->pooled && holding_.load(std::memory_order_acquire) && s.room_for(b->bin)) {
      // Counted before the block is published: once in the bin, another
      // thread may take it (and subtract) or release it (and delete it).
      if (a.group_->capped())
        over_cap = a.group_->held_bytes.fetch_add(b->size, std::memory_order_relaxed) + b->size >
                   a.group_->max_held;
      if (b->fence != 0) ++s.c.pending_frees;
      s.push_held(b);
      held = true;
    }
  }
  // From here on `b` may belong to another thread.
  if (!held) return release_block(b);
  if (over_cap) enforce_cap_nothrow(a);
}

// A free must not fail: were it to throw, the hook would hand the pointer to
// the driver, which would free memory the pool still holds (with splitting,
// other blocks' too). Without memory to look at the group, the cap waits
// for the next free.
void Pool::enforce_cap_nothrow(Arena& arena) noexcept {
  try {
    enforce_cap(arena);
  } catch (...) {
  }
}

// Release the group's oldest held blocks until it is back under its cap.
void Pool::enforce_cap(Arena& arena) {
  Group& g = *arena.group_;
  const ArenaList::Pinned members = arenas_->pin([&](const Arena& x) { return x.group_ == &g; });
  while (g.held_bytes.load(std::memory_order_relaxed) > g.max_held) {
    Arena* oa = nullptr;
    unsigned oshard = 0;
    std::size_t obin = 0;
    std::uint64_t oldest = UINT64_MAX;
    bool segment = false;  // the oldest is a wholly free segment of oa
    for (Arena* x : members) {
      if (x->retired()) continue;
      if (const std::uint64_t t = oldest_free_segment(*x); t < oldest) {
        oldest = t, oa = x, segment = true;
      }
      for (unsigned i = 0; i < x->shard_count_; ++i) {
        Arena::Shard& s = x->shards_[i];
        std::lock_guard lock(s.mu);
        for (std::size_t bin = 0; bin < s.bins.size(); ++bin)
          if (!s.bins[bin].empty() && s.bins[bin].front()->freed_at_ns < oldest) {
            oldest = s.bins[bin].front()->freed_at_ns;
            oa = x, oshard = i, obin = bin, segment = false;
          }
      }
    }
    if (!oa) return;
    if (segment) {
      std::size_t n = 0;
      release_segments(*oa, 1, /*drop=*/false, oldest, &n);
      std::lock_guard lock(oa->slow_mu_);
      oa->slow_.trims += n;
      continue;
    }
    Block* victim = nullptr;
    {
      Arena::Shard& s = oa->shards_[oshard];
      std::lock_guard lock(s.mu);
      if (obin < s.bins.size() && !s.bins[obin].empty()) {
        victim = s.bins[obin].front();
        s.bins[obin].pop_front();
        s.unheld(victim);
      }
    }
    if (!victim) continue;
    g.held_bytes.fetch_sub(victim->size, std::memory_order_relaxed);
    {
      std::lock_guard lock(oa->slow_mu_);
      ++oa->slow_.trims;
    }
    release_block(victim);
  }
}

void Pool::forget(Block* b) {
  Arena& a = *b->arena;
  // The block's end, as for a free: the driver freed it (with its context)
  // or the program released it where no driver call is made. Not for a
  // forked child's copy of its parent's block.
  if (a.counted())
    if (auto* obs = observer_.load(std::memory_order_acquire)) obs->on_free(a, *b);
  const bool retired = a.retired();
  if (b->split) {
    forget_split(b);
  } else {
    give_back(a, b->handle, b->size, b->data, /*drop=*/true);
  }
  // The last touch of the arena: once no block is active, reclaim() may
  // destroy a retired one.
  {
    Arena::Shard& s = a.shards_[b->shard];
    std::lock_guard lock(s.mu);
    s.remove_active(b);
  }
  delete b;
  if (retired) reclaim();
}

// Take every held block of the arena out of its shards and hand each to
// `dispose` (release to the backend, or drop when the driver already freed it).
// One block at a time, so that nothing is allocated (this runs when a
// context is torn down, where failing half-way is not an option).
void Pool::empty_held(Arena* arena, void (Pool::*dispose)(Block*)) {
  for (unsigned i = 0; i < arena->shard_count_; ++i) {
    Arena::Shard& s = arena->shards_[i];
    for (;;) {
      Block* b = nullptr;
      {
        std::lock_guard lock(s.mu);
        for (auto& q : s.bins)
          if (!q.empty()) {
            b = q.back();
            q.pop_back();
            s.unheld(b);
            break;
          }
      }
      if (!b) break;
      arena->group_->unhold(b->size);
      (this->*dispose)(b);
    }
  }
  release_segments(*arena, SIZE_MAX, /*drop=*/dispose == &Pool::drop_block);
}

void Pool::retire_arena(Arena* arena, bool keep_stats) {
  // Once retired with no block active, the arena may be destroyed by a
  // reclaim() on another thread (the control thread's periodic check, a
  // free): pinned, not while it is being emptied. The last touch is the
  // unpin, which destroys it when nothing else keeps it.
  arenas_->retire(arena, keep_stats);
  empty_held(arena, &Pool::drop_block);
  arenas_->unpin(arena);
}

void Pool::reclaim() { arenas_->reclaim(); }

void Pool::release_held(Arena* arena) {
  if (!arena->retired()) empty_held(arena, &Pool::release_block);
}

void Pool::free_held() {
  for (Arena* a : arenas_->pin([](const Arena&) { return true; })) release_held(a);
}

void Pool::stop_holding() {
  holding_.store(false, std::memory_order_seq_cst);
  free_held();
}

std::size_t Pool::trim_idle(std::uint64_t now) {
  if (options_.release_after_ns == 0 || now < options_.release_after_ns) return 0;
  std::size_t blocks = 0;
  release_freed_by(nullptr, now - options_.release_after_ns, &blocks);
  return blocks;
}

std::size_t Pool::release_idle(const std::string& group, std::uint64_t idle_ns,
                               std::size_t* blocks) {
  const std::uint64_t t = now();
  if (t < idle_ns) return 0;
  return release_freed_by(&group, t - idle_ns, blocks);
}

// Held blocks and wholly free segments freed at or before `freed_by_ns`,
// of every arena or of `group`'s: taken out under each shard's lock, then
// released largest first with no pool lock held (the program allocates
// meanwhile). Counted as trims. Returns the bytes; *blocks gets how many.
std::size_t Pool::release_freed_by(const std::string* group, std::uint64_t freed_by_ns,
                                   std::size_t* blocks) {
  std::size_t bytes = 0, n = 0;
  const ArenaList::Pinned live = arenas_->pin(
      [&](const Arena& a) { return !a.retired() && (!group || a.group_->name == *group); });
  std::vector<Block*> old;
  for (Arena* a : live) {
    std::size_t segments = 0;
    bytes += release_segments(*a, SIZE_MAX, /*drop=*/false, freed_by_ns, &segments);
    if (segments) {
      std::lock_guard lock(a->slow_mu_);
      a->slow_.trims += segments;
    }
    n += segments;
    for (unsigned i = 0; i < a->shard_count_; ++i) {
      Arena::Shard& s = a->shards_[i];
      std::lock_guard lock(s.mu);
      if (s.c.held_blocks == 0) continue;  // the common case once a second: no walk
      for (auto& v : s.bins) {
        // Oldest first in each bin.
        auto end = v.begin();
        while (end != v.end() && (*end)->freed_at_ns <= freed_by_ns) ++end;
        for (auto it = v.begin(); it != end; ++it) {
          s.unheld(*it);
          old.push_back(*it);
        }
        v.pop_front(static_cast<std::size_t>(end - v.begin()));
      }
    }
  }
  std::stable_sort(old.begin(), old.end(), [](const Block* x, const Block* y) { return x->size > y->size; });
  for (Block* b : old) {
    Arena& a = *b->arena;
    a.group_->unhold(b->size);
    {
      std::lock_guard lock(a.slow_mu_);
      ++a.slow_.trims;
    }
    bytes += b->size;
    release_block(b);
    ++n;
  }
  if (blocks) *blocks = n;
  return bytes;
}

Stats Pool::totals() const {
  Stats t;
  arenas_->add_retired(t);
  for (Arena* a : arenas_->pin([](const Arena& a) { return a.counted(); })) t += a->stats();
  return t;
}

std::size_t Pool::arena_count() const { return arenas_->size(); }

std::size_t Arena::releasable_bytes() const {
  std::size_t n = 0;
  for (unsigned i = 0; i < shard_count_; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].c.held_bytes;
  }
  if (segments_) {
    std::lock_guard lock(segments_->mu);
    for (const auto& [base, seg] : segments_->segments)
      if (seg.used == 0) n += seg.size;
  }
  return n;
}

std::size_t Pool::group_releasable(const std::string& group) const {
  std::size_t n = 0;
  for (Arena* a : arenas_->pin([&](const Arena& a) { return !a.retired() && a.group_->name == group; }))
    n += a->releasable_bytes();
  return n;
}

Stats Pool::group_totals(const std::string& group) const {
  Stats s;
  for (Arena* a : arenas_->pin([&](const Arena& a) { return !a.retired() && a.group_->name == group; }))
    s += a->stats();
  return s;
}

std::vector<ArenaSnapshot> Pool::snapshot(std::size_t max_bins) const {
  std::vector<ArenaSnapshot> out = arenas_->retired_rows();
  // Not a forked child's copies of its parent's arenas.
  for (Arena* a : arenas_->pin([](const Arena& a) { return a.counted(); })) {
    ArenaSnapshot snap;
    snap.name = a->options_.name;
    snap.group = a->options_.group;
    snap.kind = a->options_.kind;
    snap.device = a->options_.device;
    snap.retired = a->retired();
    snap.stats = a->stats();
    std::vector<BinSnapshot> bins;
    for (unsigned i = 0; i < a->shard_count_; ++i) {
      Arena::Shard& s = a->shards_[i];
      std::lock_guard lock(s.mu);
      if (bins.size() < s.bins.size()) bins.resize(s.bins.size());
      for (std::size_t bin = 0; bin < s.bins.size(); ++bin)
        for (Block* b : s.bins[bin]) {
          bins[bin].alloc_size = b->size;
          ++bins[bin].held_blocks;
          bins[bin].held_bytes += b->size;
        }
    }
    std::erase_if(bins, [](const BinSnapshot& b) { return b.held_blocks == 0; });
    std::sort(bins.begin(), bins.end(),
              [](const BinSnapshot& x, const BinSnapshot& y) { return x.held_bytes > y.held_bytes; });
    if (bins.size() > max_bins) bins.resize(max_bins);
    snap.bins = std::move(bins);
    out.push_back(std::move(snap));
  }
  return out;
}

// Every lock of the pool, in rank order (core/lock_rank.hpp): the list's,
// then each kind of arena lock for every arena at once.
void Pool::fork_prepare() {
  lock_rank::entering_fork();
  arenas_->fork_prepare();
  const auto& all = arenas_->locked_arenas();
  for (auto& a : all) a->slow_mu_.lock();
  for (auto& a : all)
    for (unsigned i = 0; i < a->shard_count_; ++i) a->shards_[i].mu.lock();
  for (auto& a : all)
    if (a->segments_) a->segments_->mu.lock();
}

void Pool::unlock_arenas() {
  const auto& all = arenas_->locked_arenas();
  for (auto& a : all)
    if (a->segments_) a->segments_->mu.unlock();
  for (auto& a : all)
    for (unsigned i = 0; i < a->shard_count_; ++i) a->shards_[i].mu.unlock();
  for (auto& a : all) a->slow_mu_.unlock();
}

void Pool::fork_parent() {
  unlock_arenas();
  arenas_->fork_parent();
  lock_rank::leaving_fork();
}

void Pool::fork_child() {
  // A growth in flight belonged to a thread the child does not have, and so
  // did any pin of an arena (ArenaList::fork_child).
  for (auto& a : arenas_->locked_arenas())
    for (unsigned i = 0; i < a->shard_count_; ++i)
      for (auto& g : a->shards_[i].growth) g.growing = false;
  unlock_arenas();
  arenas_->fork_child();
  lock_rank::leaving_fork();
}

}  // namespace gpupool
