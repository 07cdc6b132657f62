// What the node files share; nothing outside interpose/node uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "interpose/node/registry.hpp"

namespace gpupool::node {

// ask.cpp: asks process `pid`, running as `uid`, to release `bytes` of its
// held memory on `uuid`, over its control socket, by `deadline` (io::mono_ns).
// Returns the bytes it released (0 on any failure, or when it refuses).
std::size_t ask_release(long pid, unsigned uid, const Uuid& uuid, std::size_t bytes,
                        std::uint64_t deadline);

// ask.cpp: asks every target at once (other users' processes), each for up
// to `bytes`, answers awaited until `deadline`. Returns the bytes released.
struct Target {
  long pid = 0;
  unsigned uid = 0;
  std::string name;  // its control socket's abstract name
};
std::size_t ask_release_all(const std::vector<Target>& targets, const Uuid& uuid,
                            std::size_t bytes, std::uint64_t deadline);

// nvml.cpp: the GPU's free and total memory, from NVML (libnvidia-ml.so.1,
// loaded on first use). False when NVML or the device is not available.
bool nvml_memory(const Uuid& uuid, std::uint64_t* free, std::uint64_t* total);
// What NVML says process `pid` uses on the GPU (its contexts, libraries and
// every allocation, pooled or not). False when NVML cannot say (no such
// query, the pid is in another PID namespace).
bool nvml_process_used(const Uuid& uuid, long pid, std::uint64_t* used);
// The pids NVML lists as computing on the GPU, sorted (host pids, also
// for a process in a PID namespace). False when NVML cannot say.
bool nvml_processes(const Uuid& uuid, std::vector<unsigned>* pids);
// fork(): prepare waits until the control thread is out of NVML (and
// keeps it out until parent/child).
void nvml_fork_prepare() noexcept;
void nvml_fork_parent() noexcept;
// A forked child does not use its parent's NVML session.
void nvml_fork_child() noexcept;

}  // namespace gpupool::node
