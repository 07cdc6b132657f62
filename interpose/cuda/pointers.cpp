#include "interpose/cuda/pointers.hpp"

#include "core/fork_wait.hpp"

namespace gpupool::cuda {
namespace {

// Buffer ids of pooled allocations. The driver's own ids are small
// counters; ours live far above them, so the two never collide. A block
// handed out again gets a new one, as a new allocation would: its driver
// allocation's serial number (taken once, on the slow path) and how many
// times it was handed out, so the hit path writes nothing shared.
constexpr std::uint64_t kIdBase = std::uint64_t{1} << 62;
std::atomic<std::uint64_t> g_next_serial{0};

}  // namespace

std::uint64_t pooled_buffer_id(std::uint64_t serial, std::uint32_t uses) {
  return kIdBase | (serial % (std::uint64_t{1} << 30)) << 32 | uses;
}

std::uint64_t next_serial() { return g_next_serial.fetch_add(1, std::memory_order_relaxed); }

namespace {

std::uint64_t buffer_id(std::uint64_t serial, std::uint32_t uses) {
  return pooled_buffer_id(serial, uses);
}

const char g_unallocated[64] = {};

// A piece of an expandable range (its record is the range's).
bool is_range_piece(const Block* b) {
  return b->split && b->data && static_cast<const PtrMap::Entry*>(b->data)->range;
}

// The program owns `b` through entry `e` from now on: a new buffer id, then
// the block (published last: find() reads the id of the block it sees).
void hand_out(PtrMap::Entry* e, Block* b) {
  e->uses.store(e->uses.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  e->block.store(b, std::memory_order_release);
}

}  // namespace

PtrMap::Entry* PtrMap::insert(Handle h, std::size_t size, CtxState* st, unsigned host_flags) {
  auto e = std::make_unique<Entry>();
  e->handle = h;
  e->size = size;
  e->st = st;
  e->serial = next_serial();
  e->host_flags = host_flags;
  LockGuard rl(ranges_mu_);
  // The driver just gave out [h, h + size): pieces recorded inside it were
  // of memory a context teardown freed (the program's blocks in the window
  // between the driver's teardown and ours, erase_context). Nothing
  // allocates here.
  for (auto it = pieces_.lower_bound(h); it != pieces_.end() && it->first - h < size;) {
    Entry* old = it->second;
    {
      Shard& ps = shard(old->handle);
      LockGuard sl(ps.mu);
      ps.map.erase(old->handle);
    }
    it = pieces_.erase(it);
    delete old;
  }
  Shard& s = shard(h);
  LockGuard sl(s.mu);
  // Both maps or neither: what throws does so before anything changed, or
  // is undone.
  Entry* stale = s.map.find(h);
  s.map.put(h, e.get());
  if (stale) {
    // Its context was torn down while one of its blocks was on its way to
    // the program, and the driver just handed the address out again: the
    // new entry replaces it in both maps. The stale one stays the record of
    // its block, whose drop deletes it (erase).
    ranges_.find(h)->second = e.get();
  } else {
    try {
      ranges_.emplace(h, e.get());
    } catch (...) {
      s.map.erase(h);
      throw;
    }
  }
  return e.release();
}

PtrMap::Entry* PtrMap::range_record(Handle base, std::size_t size, CtxState* st) {
  auto* e = new Entry;
  e->handle = base;
  e->size = size;
  e->st = st;
  e->serial = next_serial();
  e->range = true;
  return e;
}

bool PtrMap::forget_range(Entry* e) {
  if (e->listed.load(std::memory_order_acquire)) return false;
  delete e;
  return true;
}

void PtrMap::erase(Entry* e) {
  {
    LockGuard rl(ranges_mu_);
    Shard& s = shard(e->handle);
    LockGuard sl(s.mu);
    // Not in the maps any more if a newer allocation at its address took
    // its place (insert).
    if (s.map.find(e->handle) == e) {
      s.map.erase(e->handle);
      ranges_.erase(e->handle);
    }
  }
  delete e;
}

void PtrMap::activate(Block* b) {
  if (!b->split) {
    // Its record, alive until the pool releases or drops the block.
    hand_out(static_cast<Entry*>(b->data), b);
    return;
  }
  {
    Shard& s = shard(b->handle);
    LockGuard sl(s.mu);
    Entry* e = s.map.find(b->handle);
    // A piece that starts its segment is answered for by the segment's
    // entry. A range's piece keeps its entry while it is free (deactivate),
    // so the same piece handed out again (parked: core/binned.hpp) takes
    // no process-wide lock. Any other piece entry found here is stale,
    // replaced below.
    if (e && (!e->piece || (e->size == b->size && is_range_piece(b) &&
                            !e->block.load(std::memory_order_relaxed)))) {
      hand_out(e, b);
      return;
    }
  }
  add_piece(b);  // inside its segment: no entry of its own yet
}

// Slow path: a piece handed out inside its segment. Its entry lives while
// the program owns it; held pieces are answered for by the segment's entry.
void PtrMap::add_piece(Block* b) {
  auto e = std::make_unique<Entry>();
  e->handle = b->handle;
  e->size = b->size;
  e->block.store(b, std::memory_order_relaxed);
  e->serial = next_serial();
  e->uses.store(1, std::memory_order_relaxed);
  e->piece = true;
  LockGuard rl(ranges_mu_);
  auto* range = static_cast<Entry*>(b->data);
  if (range && range->range && !range->listed.load(std::memory_order_relaxed)) {
    // The range's first piece handed out: the range joins the maps, so its
    // held and unmapped addresses are answered for as unallocated.
    Shard& rs = shard(range->handle);
    LockGuard sl(rs.mu);
    auto [slot, fresh] = ranges_.emplace(range->handle, range);  // may throw: nothing changed yet
    try {
      rs.map.put(range->handle, range);
    } catch (...) {
      if (fresh) ranges_.erase(slot);
      throw;
    }
    slot->second = range;
    range->listed.store(true, std::memory_order_release);
    if (b->handle == range->handle) {
      hand_out(range, b);  // the piece at its start: answered for by the range's entry
      return;
    }
  }
  auto seg = ranges_.upper_bound(b->handle);
  if (seg == ranges_.begin()) return;  // cannot happen: every segment is recorded
  e->st = std::prev(seg)->second->st;
  e->host_flags = std::prev(seg)->second->host_flags;
  drop_free_pieces(b->handle, b->handle + b->size);
  Shard& s = shard(b->handle);
  LockGuard sl(s.mu);
  auto [slot, fresh] = pieces_.emplace(b->handle, e.get());  // may throw: nothing changed yet
  Entry* const stale = fresh ? nullptr : slot->second;
  try {
    s.map.put(b->handle, e.get());
  } catch (...) {
    if (fresh) pieces_.erase(slot);
    throw;
  }
  slot->second = e.release();
  delete stale;  // a stale piece entry at this address (activate), replaced in both maps
}

// The kept entries of free range pieces (deactivate) that overlap
// [from, to): a new piece cut across them answers for those addresses now.
void PtrMap::drop_free_pieces(Handle from, Handle to) {
  auto it = pieces_.upper_bound(from);
  if (it != pieces_.begin() && std::prev(it)->first + std::prev(it)->second->size > from) --it;
  while (it != pieces_.end() && it->first < to) {
    Entry* e = it->second;
    Shard& s = shard(e->handle);
    LockGuard sl(s.mu);
    if (e->block.load(std::memory_order_acquire)) {  // in use: not this one's to drop
      ++it;
      continue;
    }
    if (s.map.find(e->handle) == e) s.map.erase(e->handle);
    it = pieces_.erase(it);
    delete e;
  }
}

Block* PtrMap::remove_piece(Handle h) {
  Entry* e = nullptr;
  {
    LockGuard rl(ranges_mu_);
    Shard& s = shard(h);
    LockGuard sl(s.mu);
    e = s.map.find(h);
    if (!e || !e->piece) return nullptr;  // a second free of it won the race
    s.map.erase(h);
    pieces_.erase(h);
  }
  Block* b = e->block.load(std::memory_order_acquire);
  delete e;
  return b;
}

Block* PtrMap::deactivate(Handle h, bool* known) {
  {
    Shard& s = shard(h);
    LockGuard sl(s.mu);
    Entry* e = s.map.find(h);
    *known = e != nullptr;
    if (!e) return nullptr;
    Block* b = e->block.load(std::memory_order_acquire);
    // A range's piece keeps its entry, answered for as free, until a piece
    // cut across it replaces it (add_piece) or its context goes: the pool
    // may hand the same piece out again (activate).
    if (!e->piece || (b && is_range_piece(b))) {
      // Cleared only when found: a free of a block already free (a double
      // free) must not undo an activate() racing it, which takes no lock.
      if (b) e->block.store(nullptr, std::memory_order_relaxed);
      return b;
    }
  }
  // A piece's entry goes with its free; freed twice, the second free is not
  // ours (as a freed driver allocation's is not) and the driver answers.
  Block* b = remove_piece(h);
  *known = b != nullptr;
  return b;
}

PtrMap::Entry* PtrMap::containing(Handle p) {
  // A free piece's kept entry (deactivate) answers for nothing: a piece at
  // the range's start, answered for by the range's entry, may cover it
  // (pieces in use never overlap one another or a kept entry they cut
  // across: add_piece drops those).
  auto piece = pieces_.upper_bound(p);
  if (piece != pieces_.begin() &&
      p - std::prev(piece)->second->handle < std::prev(piece)->second->size &&
      std::prev(piece)->second->block.load(std::memory_order_acquire))
    return std::prev(piece)->second;
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return nullptr;
  Entry* e = std::prev(it)->second;
  return p - e->handle < e->size ? e : nullptr;
}

PtrInfo PtrMap::find(Handle p) {
  PtrInfo info;
  LockGuard rl(ranges_mu_);
  Entry* e = containing(p);
  if (!e) return info;
  Shard& s = shard(e->handle);
  LockGuard sl(s.mu);
  const Block* b = e->block.load(std::memory_order_acquire);
  info.found = true;
  info.base = e->handle;
  info.size = e->size;
  info.active = b != nullptr;
  info.requested = b ? b->requested : 0;
  info.shares_allocation = b && b->split && (e->piece || b->size != e->size);
  info.in_range = b && is_range_piece(b);
  info.buffer_id = buffer_id(e->serial, e->uses.load(std::memory_order_relaxed));
  info.host_flags = e->host_flags;
  return info;
}

Block* PtrMap::active_block(Handle p) {
  LockGuard rl(ranges_mu_);
  Entry* e = containing(p);
  if (!e) return nullptr;
  Shard& s = shard(e->handle);
  LockGuard sl(s.mu);
  return e->block.load(std::memory_order_acquire);
}

Block* PtrMap::take_next_locked(CtxState* st, Handle* next_range, Handle* next_piece) {
  for (auto it = ranges_.lower_bound(*next_range); it != ranges_.end();) {
    Entry* e = it->second;
    if (e->st != st) {
      ++it;
      continue;
    }
    Block* b = nullptr;
    {
      Shard& s = shard(e->handle);
      LockGuard sl(s.mu);
      s.map.erase(e->handle);  // never allocates
      b = e->block.load(std::memory_order_acquire);
      e->block.store(nullptr, std::memory_order_relaxed);
    }
    *next_range = it->first + 1;
    it = ranges_.erase(it);
    e->listed.store(false, std::memory_order_release);
    // Not deleted: the entry is the record of its block or segment, deleted
    // when that goes (erase). One the program owns goes now (the caller
    // forgets it); a segment with pieces out goes with its last piece.
    if (b) return b;
  }
  for (auto it = pieces_.lower_bound(*next_piece); it != pieces_.end();) {
    Entry* e = it->second;
    if (e->st != st) {
      ++it;
      continue;
    }
    {
      Shard& s = shard(e->handle);
      LockGuard sl(s.mu);
      s.map.erase(e->handle);  // never allocates
    }
    *next_piece = it->first + 1;
    it = pieces_.erase(it);
    Block* b = e->block.load(std::memory_order_acquire);
    delete e;         // a piece's entry is the map's own
    if (b) return b;  // a piece's entry lives while the program owns it: always
  }
  return nullptr;
}

void PtrMap::erase_context(CtxState* st, Pool& pool) {
  // Allocates nothing: it runs after the driver destroyed the context, where
  // failing half-way would leave entries of freed memory behind. Every
  // entry of st leaves the maps (a later free of one of its addresses is
  // the driver's to answer, and a new allocation there gets its own); the
  // pool forgets each block the program owns outside the map's locks, since
  // forgetting one drops its record (erase) and a piece's may drop its
  // segment's.
  Handle next_range = 0, next_piece = 0;
  for (;;) {
    Block* active = nullptr;
    {
      LockGuard rl(ranges_mu_);
      active = take_next_locked(st, &next_range, &next_piece);
    }
    if (!active) return;
    pool.forget(active);
  }
}

bool PtrMap::fork_prepare(PtrMap& a, PtrMap& b) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  return fork_wait::take(a.ranges_mu_) && fork_wait::take(b.ranges_mu_) && a.shards_.lock_all() &&
         b.shards_.lock_all();
}

void PtrMap::fork_release(PtrMap& a, PtrMap& b) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  b.shards_.unlock_all();
  a.shards_.unlock_all();
  b.ranges_mu_.unlock();
  a.ranges_mu_.unlock();
}

CUdeviceptr unallocated_address() { return reinterpret_cast<CUdeviceptr>(&g_unallocated[0]); }

}  // namespace gpupool::cuda
