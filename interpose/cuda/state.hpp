// The CUDA room's process state, one object the runtime owns
// (Runtime::cuda, made by the room's part before the runtime is published,
// never destroyed: hooks may run during exit). The hooks that use it have
// the runtime. What the room records before any runtime (the primary
// contexts, the solo rule) stays outside it: docs/globals.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "core/lock_rank.hpp"
#include "interpose/cuda/pointers.hpp"
#include "interpose/runtime.hpp"

namespace gpupool::cuda {

struct AsyncRegistry;
struct PeerAccess;
namespace vmm {
struct Registry;
}
namespace ipc {
struct Registry;
}

struct State {
  // The context registry (contexts.cpp): every record ever made (never
  // freed: threads may hold one in their cache) and the live ones.
  Ranked<LockRank::cuda_contexts> contexts_mu;
  std::vector<CtxState*> all GPUPOOL_GUARDED_BY(contexts_mu);   // append-only
  std::vector<CtxState*> live GPUPOOL_GUARDED_BY(contexts_mu);  // not retired
  // fork()'s prepare took these records' teardown locks (and the registry's
  // lock); fork_held: it took the registry's.
  std::vector<CtxState*> fork_locked;
  bool fork_held = false;
  // Bumped whenever a record is retired: thread caches compare it.
  std::atomic<std::uint64_t> generation{1};
  // The driver gives no context ids (contexts.cpp: turn_off_ids).
  std::atomic<bool> no_ids{false};
  std::atomic<unsigned> ordinals{0};  // the last CtxState::ordinal

  // The pointer maps (pointers.hpp): device memory's and pinned memory's.
  PtrMap device_map, host_map;

  vmm::Registry* vmm = nullptr;    // the virtual memory units (vmm.cpp)
  AsyncRegistry* async = nullptr;  // the managed memory pools (async.cpp)
  ipc::Registry* ipc = nullptr;    // range pieces exported and opened (ipc.cpp)
  PeerAccess* peers = nullptr;     // contexts given peer access (memory.cpp)
};

// The pointer maps of the runtime's state. Inline: on every hit path (one
// load from the runtime the hook has).
inline PtrMap& device_map(const Runtime& rt) { return rt.cuda->device_map; }
inline PtrMap& host_map(const Runtime& rt) { return rt.cuda->host_map; }

}  // namespace gpupool::cuda
