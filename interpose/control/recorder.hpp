// What gpupool records about the program's allocations, as the pool's one
// observer: allocation sites (GPUPOOL_SITES), the trace (GPUPOOL_TRACE_FILE,
// or started by the program: gpupool_trace_start) and the blocks the
// program holds, for the leak report at exit and gpupool_snapshot_json
// (GPUPOOL_LEAKS). Exists only when one of them is on (made when the
// program starts a trace, if none was).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/pool.hpp"
#include "interpose/control/sites.hpp"
#include "interpose/control/trace.hpp"

namespace gpupool::control {

class Recorder final : public PoolObserver {
 public:
  // Either may be null; never destroyed (allocations go on during exit).
  Recorder(sites::Sites* sites, trace::Tracer* tracer, bool leaks)
      : sites_(sites), tracer_(tracer), tracing_(tracer != nullptr), leaks_(leaks) {}

  void on_allocate(const Arena& arena, const Block& block, Served how) noexcept override;
  void on_free(const Arena& arena, const Block& block) noexcept override;
  void on_arena_destroyed(const Arena& arena) override;

  // The tracer it feeds while tracing: once set, always the same one
  // (restarted, never replaced), so a thread that read it as tracing
  // stopped still writes into a live object (which drops the record).
  void trace_into(trace::Tracer* tracer) {
    tracer_.store(tracer, std::memory_order_release);
    tracing_.store(true, std::memory_order_release);
  }
  void stop_tracing() { tracing_.store(false, std::memory_order_release); }
  bool tracing() const { return tracing_.load(std::memory_order_acquire); }

  // The live blocks (GPUPOOL_LEAKS: the leak report's record) as one JSON
  // object (docs/c-api.md, gpupool_snapshot_json), with their sites named
  // where GPUPOOL_SITES recorded them.
  std::string snapshot_json(long pid);

  // The blocks the program still holds, grouped by allocation site (by pool
  // group without sites), largest first; empty when GPUPOOL_LEAKS is off.
  std::string leak_report(long pid);

  void fork_prepare();
  void fork_parent();
  // The parent's blocks are not the child's (runtime.hpp): forgotten.
  void fork_child();

 private:
  struct Held {
    const Arena* arena;
    std::uint64_t requested, size;
    std::uint32_t site;
  };
  struct Key {
    const Arena* arena;
    std::uint64_t handle;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const {
      return std::hash<std::uint64_t>()(k.handle ^
                                        (reinterpret_cast<std::uintptr_t>(k.arena) << 7));
    }
  };
  // Sharded by handle: allocating threads rarely meet on one lock.
  static constexpr unsigned kShards = 16;
  struct alignas(64) Shard {
    Ranked<LockRank::recorder_shard> mu;
    std::unordered_map<Key, Held, KeyHash> held;
  };
  Shard& shard_of(std::uint64_t handle) { return shards_[(handle >> 8 ^ handle >> 20) % kShards]; }

  sites::Sites* const sites_;
  std::atomic<trace::Tracer*> tracer_;
  std::atomic<bool> tracing_;
  const bool leaks_;
  Shard shards_[kShards];
  std::atomic<std::uint64_t> unrecorded_{0};  // allocations whose block could not be remembered
};

}  // namespace gpupool::control
