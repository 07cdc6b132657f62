// What the node files share; nothing outside interpose/node uses it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/lock_rank.hpp"
#include "wire/registry.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::node {

// One pool group on a GPU this process draws on (a GPU may have two: CUDA's
// and OpenCL's). key, group and total never change once added; the watch
// fields are the control thread's alone.
struct Device {
  wire::DeviceKey key{};
  std::string group;
  std::size_t total = 0;
  // The pressure watch: the other processes' use when free memory was last
  // above the threshold (UINT64_MAX: not sampled yet).
  std::uint64_t others_at_ok = UINT64_MAX;
  // The other processes' use when a release was last made for another
  // user's process (UINT64_MAX: none yet); the next is made only once they
  // use more (answer_release).
  std::uint64_t others_at_foreign = UINT64_MAX;
  std::uint64_t held = 0;  // at the last tick
  // Managed bytes at the last publication, and when they last fell (memory
  // went back to the driver: a release, a context gone). 0: never.
  std::uint64_t managed = 0, returned_at = 0;
  // Arrivals: the pids NVML listed on the GPU at the last look, sorted. The
  // first look (again after a time holding nothing) only learns who is
  // there.
  std::vector<unsigned> pids;
  bool pids_looked = false;
  // After an arrival, until then (mono ns), blocks reaching the idle age go
  // back as well: the newcomer may take its memory seconds after it came.
  std::uint64_t arrival_until = 0;
};

// NVML's entry points gpupool calls, once loaded (nvml.cpp declares its
// types: NVML's stable C ABI), and the handles of the devices asked about.
struct nvmlMemory_t;
struct nvmlProcessInfo_v1_t;
struct Nvml {
  bool tried = false;
  bool ok = false;
  // Started in gpupool's own descriptor table: NVML's descriptors are
  // there, so a forked child (which has the program's) cannot use it.
  bool in_private_table = false;
  long pid = 0;  // the process that initialised it
  int (*init)() = nullptr;
  int (*by_uuid)(const char*, void**) = nullptr;
  int (*memory)(void*, nvmlMemory_t*) = nullptr;
  // Optional: without it a process's memory outside the pool counts as
  // the other processes'.
  int (*processes)(void*, unsigned*, nvmlProcessInfo_v1_t*) = nullptr;
  struct Handle {
    wire::DeviceKey uuid;
    void* dev;
  };
  std::vector<Handle> handles;
};

// This process's NVML session (nvml.cpp). A forked child's is new, with the
// child's State: the parent's may be mid-use by a thread the child does
// not have.
struct NvmlSession {
  // fork() waits while the control thread is inside dlopen or NVML, and no
  // new call starts until it is done: a child must not inherit the
  // loader's or NVML's locks mid-call (its own session calls NVML again).
  // A gate of two atomics, not a mutex: only the control thread calls
  // NVML.
  std::atomic<bool> inside{false}, forking{false};
  Ranked<LockRank::node_nvml> mu;
  Nvml nvml GPUPOOL_GUARDED_BY(mu);
  // A forked child's session whose parent had started NVML in its own
  // descriptor table: NVML's state names descriptors this child does not
  // have, so the child does without (a child that uses the GPU again is
  // one that exec'd, and starts afresh).
  bool parents = false;
};

// The room's state (Runtime::node), made with the runtime; never destroyed:
// used during exit. A forked child gets a new one. Nothing is called while
// holding mu: the pool, the driver, NVML, the registry's file and the logger
// are called with it released (its rank: core/lock_rank.hpp).
struct State {
  Ranked<LockRank::node_devices> mu;
  // Stable addresses: the control thread works on a device outside mu.
  std::deque<Device> devices GPUPOOL_GUARDED_BY(mu);
  std::unique_ptr<wire::Registry> registry GPUPOOL_GUARDED_BY(mu);  // set once
  bool registry_tried GPUPOOL_GUARDED_BY(mu) = false;
  std::atomic<bool> publish_now{false};
  // The control thread's:
  std::uint64_t next_publish = 0, next_watch = 0;
  NvmlSession nvml;
};

// node.cpp: the control thread's periodic work (control::NodeWork):
// publish this process's figures, watch the free memory of GPUs it holds
// memory on. Returns when it wants to run next (CLOCK_MONOTONIC ns;
// UINT64_MAX: only when woken).
std::uint64_t tick(Runtime& rt, std::uint64_t now_ns);

// neighbours.cpp: a request from another process, "release <key> <bytes>"
// (control::NodeWork). Releases this process's held blocks on that GPU and
// returns the answer's body. For another user's process (other_user), at
// most what the GPU lacks for the request, and only once the other
// processes have used more of the GPU since the last such release.
std::string answer_release(Runtime& rt, std::string_view args, bool other_user);

// node.cpp: the room's state (every caller runs inside the runtime: a hook,
// its backends, its control thread, its exit handler).
State& state();
// Every live entry of the registry but this process's; an unusable
// registry lists nobody (said once).
std::vector<wire::ProcessEntry> others(wire::Registry* reg);
// The devices and the registry, copied under the lock.
std::vector<Device*> devices(State& s, wire::Registry** reg = nullptr);
// The device of pool group `group`, and the registry; false if none.
bool find_device(State& s, const std::string& group, wire::DeviceKey* key, wire::Registry** reg);
std::uint64_t add_sat(std::uint64_t a, std::uint64_t b);
// The GPU's free and total memory and what the other processes use of it,
// from NVML; false when NVML cannot say.
bool gpu_use(Runtime& rt, const Device& d, std::uint64_t* free, std::uint64_t* total,
             std::uint64_t* others);

// ask.cpp: asks process `pid`, running as `uid`, to release `bytes` of its
// held memory on `key`, over its control socket, by `deadline` (io::mono_ns).
// Returns the bytes it released (0 on any failure, or when it refuses).
std::size_t ask_release(long pid, unsigned uid, const wire::DeviceKey& key, std::size_t bytes,
                        std::uint64_t deadline);

// ask.cpp: asks every target at once (other users' processes), each for up
// to `bytes`, answers awaited until `deadline`. Returns the bytes released.
struct Target {
  long pid = 0;
  unsigned uid = 0;
  std::string name;  // its control socket's abstract name
};
std::size_t ask_release_all(const std::vector<Target>& targets, const wire::DeviceKey& key,
                            std::size_t bytes, std::uint64_t deadline);

// nvml.cpp: the GPU's free and total memory, from NVML (libnvidia-ml.so.1,
// loaded on first use). False when NVML or the device is not available.
bool nvml_memory(NvmlSession& session, const wire::DeviceKey& key, std::uint64_t* free,
                 std::uint64_t* total);
// What NVML says process `pid` uses on the GPU (its contexts, libraries and
// every allocation, pooled or not). False when NVML cannot say (no such
// query, the pid is in another PID namespace).
bool nvml_process_used(NvmlSession& session, const wire::DeviceKey& key, long pid,
                       std::uint64_t* used);
// The pids NVML lists as computing on the GPU, sorted (host pids, also
// for a process in a PID namespace). False when NVML cannot say.
bool nvml_processes(NvmlSession& session, const wire::DeviceKey& key, std::vector<unsigned>* pids);
// fork(): prepare waits until the control thread is out of NVML (and
// keeps it out until parent/child).
void nvml_fork_prepare(NvmlSession& session) noexcept;
void nvml_fork_parent(NvmlSession& session) noexcept;
// A forked child does not use its parent's NVML session: `fresh` (the
// child's State's) does without NVML where the parent's had started it in
// gpupool's descriptor table; a child that could not make a new State
// (fresh null) keeps its parent's, and does without NVML.
void nvml_fork_child(NvmlSession& parents, NvmlSession* fresh) noexcept;

}  // namespace gpupool::node
