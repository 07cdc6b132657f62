// gpupool's CUDA state: one record per context (its arenas and its fence
// epoch), and the pointer maps that tell a pooled pointer from one that goes
// straight to the driver.
#pragma once

#include <cuda.h>

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "core/pool.hpp"
#include "interpose/cuda/driver.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::cuda {

// One CUDA context as the pool sees it. Never freed: threads may hold a
// pointer to one (thread-local cache) after it was retired.
struct CtxState {
  CUcontext ctx = nullptr;
  CUdevice dev = 0;
  std::size_t device_total = 0;
  bool primary = false;  // the device's primary context (seen through cuDevicePrimaryCtxRetain)

  // Fences. A block freed while epoch_next == E is safe to reuse once a
  // synchronization of the whole context that *started* after the free has
  // finished: such a synchronization takes s = epoch_next++ (s >= E) and
  // sets epoch_done >= s when it succeeds.
  std::atomic<std::uint64_t> epoch_next{1};
  std::atomic<std::uint64_t> epoch_done{0};

  // Held shared while a backend call may touch this context's memory,
  // exclusively while the context is torn down, so the pool never frees a
  // block the driver has already freed (its address may be reused).
  std::shared_mutex teardown_mu;
  std::atomic<bool> retired{false};

  // Null once retired: the pool destroys retired arenas.
  std::atomic<Arena*> device_arena{nullptr};
  // Pinned arenas by normalised flags (flags | DEVICEMAP, 0..7).
  std::atomic<Arena*> host_arenas[8] = {};
};

// Take s = epoch_next++ before a full-context synchronization and pass it
// here when the synchronization succeeded.
void epoch_completed(CtxState* st, std::uint64_t s);

// Synchronize st's context (pushing it if it is not current) and complete
// its epoch. Used when the pool needs a pending block.
void synchronize_context(CtxState* st);

// The state of the current context, created on first use (create = true).
// nullptr when there is no usable current context (the caller then passes
// the call to the driver, which returns its own error).
CtxState* current_state(const Driver& d, Runtime& rt, bool create);

// The pinned arena of `st` for these (valid) flags, created on first use.
Arena* host_arena(CtxState* st, Runtime& rt, unsigned flags);

// The flags the pinned backend allocates with, for the call being served on
// this thread (set just before Pool::allocate).
void set_host_flags(unsigned flags);

// The primary context of `dev` as we know it (nullptr: none with pooled
// memory). Called by the primary-context hooks.
CtxState* primary_state(CUdevice dev);
void note_primary(CUcontext ctx, CUdevice dev);
// A known, live context state for `ctx`, or nullptr.
CtxState* find_state(CUcontext ctx);

// Drop every block of st from the pool and the pointer maps without freeing
// anything (the driver did). Caller holds st->teardown_mu exclusively.
// keep_stats: its counters stay in the totals (not in a forked child, where
// they are the parent's).
void retire_locked(CtxState* st, Runtime& rt, bool keep_stats = true);

// Sum of held bytes of the device arenas of `dev` (cuMemGetInfo).
std::size_t held_device_bytes(CUdevice dev);

// What the pointer maps know about an address.
struct PtrInfo {
  bool found = false;       // inside a block the pool manages
  bool active = false;      // the program owns it (not held)
  Handle base = 0;
  std::size_t size = 0;     // the driver allocation's size
  std::size_t requested = 0;
  std::uint64_t buffer_id = 0;
  unsigned host_flags = 0;  // pinned: the normalised flags the block was allocated for
};

// A lock for the pointer-map shards: held for a hash lookup or insert only.
// Cheaper than a mutex when uncontended, and fork_prepare() takes all 64 of
// a map's at once (more mutexes than ThreadSanitizer can track per thread).
class SpinLock {
 public:
  void lock() {
    for (unsigned spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) sched_yield();
      }
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

class PtrMap {
 public:
  // Backend side (slow path): the driver allocated / is about to free it.
  void insert(Handle h, std::size_t size, CtxState* st, unsigned host_flags = 0);
  void erase(Handle h);
  // Hit path. activate: the pool handed `b` out. deactivate: the program
  // frees h; *known = false if h is not ours; returns nullptr for a block
  // that is ours but already free (a double free).
  void activate(Block* b);
  Block* deactivate(Handle h, bool* known);
  // Queries on any address inside a block.
  PtrInfo find(Handle p);
  // cuIpcGetMemHandle: the active block containing p is never reused.
  bool mark_no_reuse(Handle p);
  // Context teardown: drop every entry of st, returning its active blocks.
  std::vector<Block*> erase_context(CtxState* st);

  void fork_prepare();
  void fork_parent();

 private:
  struct Entry {
    Handle handle = 0;
    std::size_t size = 0;
    CtxState* st = nullptr;
    Block* block = nullptr;  // non-null while the program owns it
    std::uint64_t buffer_id = 0;
    unsigned host_flags = 0;
  };
  struct alignas(64) Shard {
    SpinLock mu;
    std::unordered_map<Handle, Entry*> map;
  };
  static constexpr unsigned kShards = 64;
  Shard& shard(Handle h) {
    return shards_[static_cast<unsigned>((h * 0x9E3779B97F4A7C15ull) >> 58)];
  }

  Shard shards_[kShards];
  // Ordered view for interior pointers; changes only on the slow path.
  // Lock order: ranges_mu_ before a shard's mu.
  std::mutex ranges_mu_;
  std::map<Handle, Entry*> ranges_;
};

PtrMap& device_map();
PtrMap& host_map();

// A known-unallocated address: queries about pointers that are free from the
// program's point of view (held blocks, rounding padding) are asked about
// this address instead, so the program gets the driver's own answer for
// unallocated memory.
CUdeviceptr unallocated_address();


}  // namespace gpupool::cuda
