// The OpenCL room's process state, one object the runtime owns
// (Runtime::opencl, made by the room's part before the runtime is
// published, never destroyed: hooks may run during exit). Hooks reach it
// through state(): there is none before the runtime, without it
// (GPUPOOL_DISABLE=1), or in an inert forked child (runtime.hpp), and then
// the calls go to the implementation alone, as they did when nothing was
// recorded.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "interpose/handle_table.hpp"
#include "interpose/opencl/api.hpp"
#include "interpose/runtime.hpp"

namespace gpupool::ocl {

struct Ctx;
struct Queue;
struct Buffer;
struct SvmBlock;
class UnpooledBackend;

// Handle -> record maps, sharded so unrelated calls do not share a lock
// (each map's shards have a rank of their own: fork() takes them all).
template <class K, class V, LockRank R>
class HandleMap {
 public:
  V* find(K k) {
    auto& s = shards_.shard(key(k));
    LockGuard lock(s.mu);
    return s.map.find(key(k));
  }
  void put(K k, V* v) {
    auto& s = shards_.shard(key(k));
    LockGuard lock(s.mu);
    s.map.put(key(k), v);
  }
  V* take(K k) {
    auto& s = shards_.shard(key(k));
    LockGuard lock(s.mu);
    return s.map.erase(key(k));
  }
  bool lock_all() { return shards_.lock_all(); }  // false: gave up (core/fork_wait.hpp)
  void unlock_all() { shards_.unlock_all(); }

 private:
  static std::uintptr_t key(K k) { return reinterpret_cast<std::uintptr_t>(k); }
  ShardedHandleTable<V, 4, R> shards_;
};

// A buffer the implementation made for the program in a closed context of
// a process that inherited it (unpooled.hpp), and its arena.
struct Noted {
  Arena* arena;
  UnpooledBackend* backend;
  std::size_t size;
  std::uint32_t refs;
};
// An arena made for such buffers (the pool owns it and its backend):
// retired once its context is finished and none of its buffers is noted.
struct UnpooledArena {
  Arena* arena;
  UnpooledBackend* backend;
  std::size_t noted = 0;  // its buffers in Unpooled::buffers
  bool context_finished = false;
};
struct Unpooled {
  Ranked<LockRank::opencl_unpooled> mu;
  std::unordered_map<cl_mem, Noted> buffers GPUPOOL_GUARDED_BY(mu);
  std::vector<UnpooledArena> arenas GPUPOOL_GUARDED_BY(mu);
  // This process noted a buffer: the retain and release hooks look.
  std::atomic<bool> any{false};
};

struct State {
  // Contexts (contexts.cpp): the program's by handle, and every record
  // alive, whether the program still has the context or not (fork() locks
  // and renews them all).
  Ranked<LockRank::opencl_contexts> contexts_mu;
  std::unordered_map<cl_context, std::shared_ptr<Ctx>> contexts GPUPOOL_GUARDED_BY(contexts_mu);
  Ranked<LockRank::opencl_records> records_mu;
  std::vector<Ctx*> records GPUPOOL_GUARDED_BY(records_mu);
  // fork()'s prepare took the locks (contexts.cpp), and the records' whose.
  bool fork_held = false;
  std::vector<Ctx*> fork_locked;
  std::atomic<std::uint64_t> ordinals{0};  // the last Ctx::ordinal
  // Changes whenever a context record stops serving buffer requests
  // (contexts_generation()).
  std::atomic<std::uint64_t> generation{1};
  HandleMap<cl_command_queue, Queue, LockRank::opencl_queues> queues;

  // Buffers (buffers.cpp), and their destructor callbacks' locks, a few for
  // all records (so fork() can take them all).
  HandleMap<cl_mem, Buffer, LockRank::opencl_buffers> buffers;
  static constexpr std::size_t kCallbackLocks = 16;
  Ranked<LockRank::opencl_callbacks> callback_locks[kCallbackLocks];

  HandleMap<void*, SvmBlock, LockRank::opencl_svm> svm;  // svm.cpp

  Unpooled unpooled;  // unpooled.cpp
};

// The room's state; nullptr when there is no runtime (above).
inline State* state() {
  Runtime* rt = runtime_if_started();
  return rt ? rt->opencl : nullptr;
}

}  // namespace gpupool::ocl
