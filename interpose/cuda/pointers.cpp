#include "interpose/cuda/pointers.hpp"

namespace gpupool::cuda {
namespace {

// Process-wide buffer ids for pooled allocations. The driver's own ids are
// small counters; ours live far above them, so the two never collide, and a
// block handed out again gets a new one (as a new allocation would).
std::atomic<std::uint64_t> g_next_buffer_id{std::uint64_t{1} << 62};

char g_unallocated[64];

}  // namespace

void PtrMap::insert(Handle h, std::size_t size, CtxState* st, unsigned host_flags) {
  auto e = std::make_unique<Entry>(Entry{h, size, st, nullptr, 0, host_flags});
  std::lock_guard rl(ranges_mu_);
  Shard& s = shard(h);
  std::lock_guard sl(s.mu);
  // A stale entry at this address (its context was torn down under us) is
  // replaced: the driver just handed the address out again.
  if (auto it = s.map.find(h); it != s.map.end()) {
    delete it->second;
    s.map.erase(it);
    ranges_.erase(h);
  }
  // Both maps or neither (an insertion that throws leaves no half entry).
  auto [at, inserted] = s.map.emplace(h, e.get());
  try {
    ranges_.emplace(h, e.get());
  } catch (...) {
    s.map.erase(at);
    throw;
  }
  (void)inserted;
  e.release();
}

void PtrMap::erase(Handle h) {
  Entry* e = nullptr;
  {
    std::lock_guard rl(ranges_mu_);
    Shard& s = shard(h);
    std::lock_guard sl(s.mu);
    if (auto it = s.map.find(h); it != s.map.end()) {
      e = it->second;
      s.map.erase(it);
      ranges_.erase(h);
    }
  }
  delete e;
}

// A new buffer id. Each thread takes a range of them at a time: one shared
// counter written by every allocation made allocating threads contend for
// its cache line.
std::uint64_t next_buffer_id() {
  constexpr std::uint64_t kRange = 1024;
  thread_local std::uint64_t next = 0, end = 0;
  if (next == end) {
    next = g_next_buffer_id.fetch_add(kRange, std::memory_order_relaxed);
    end = next + kRange;
  }
  return next++;
}

void PtrMap::activate(Block* b) {
  const std::uint64_t id = next_buffer_id();
  Shard& s = shard(b->handle);
  std::lock_guard sl(s.mu);
  if (auto it = s.map.find(b->handle); it != s.map.end()) {
    it->second->block = b;
    it->second->buffer_id = id;
  }
}

Block* PtrMap::deactivate(Handle h, bool* known) {
  Shard& s = shard(h);
  std::lock_guard sl(s.mu);
  auto it = s.map.find(h);
  if (it == s.map.end()) {
    *known = false;
    return nullptr;
  }
  *known = true;
  Block* b = it->second->block;
  it->second->block = nullptr;
  return b;
}

PtrInfo PtrMap::find(Handle p) {
  PtrInfo info;
  std::lock_guard rl(ranges_mu_);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return info;
  --it;
  Entry* e = it->second;
  if (p - e->handle >= e->size) return info;
  Shard& s = shard(e->handle);
  std::lock_guard sl(s.mu);
  info.found = true;
  info.base = e->handle;
  info.size = e->size;
  info.active = e->block != nullptr;
  info.requested = e->block ? e->block->requested : 0;
  info.buffer_id = e->buffer_id;
  info.host_flags = e->host_flags;
  return info;
}

Block* PtrMap::active_block(Handle p) {
  std::lock_guard rl(ranges_mu_);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return nullptr;
  --it;
  Entry* e = it->second;
  if (p - e->handle >= e->size) return nullptr;
  Shard& s = shard(e->handle);
  std::lock_guard sl(s.mu);
  return e->block;
}

void PtrMap::erase_context(CtxState* st, Pool& pool) {
  // Allocates nothing: it runs after the driver destroyed the context, where
  // failing half-way would leave entries of freed memory behind.
  std::lock_guard rl(ranges_mu_);
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    Entry* e = it->second;
    if (e->st != st) {
      ++it;
      continue;
    }
    Block* active = nullptr;
    {
      Shard& s = shard(e->handle);
      std::lock_guard sl(s.mu);
      active = e->block;
      s.map.erase(e->handle);
    }
    it = ranges_.erase(it);
    delete e;
    if (active) pool.forget(active);
  }
}

void PtrMap::fork_prepare() {
  ranges_mu_.lock();
  for (Shard& s : shards_) s.mu.lock();
}

void PtrMap::fork_parent() {
  for (Shard& s : shards_) s.mu.unlock();
  ranges_mu_.unlock();
}

// Never destroyed: hooks run from atexit handlers and other threads during
// exit, after static destructors.
PtrMap& device_map() {
  static PtrMap* m = new PtrMap;
  return *m;
}

PtrMap& host_map() {
  static PtrMap* m = new PtrMap;
  return *m;
}

CUdeviceptr unallocated_address() { return reinterpret_cast<CUdeviceptr>(&g_unallocated[0]); }

}  // namespace gpupool::cuda
