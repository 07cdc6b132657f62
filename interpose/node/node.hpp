// gpupool as a neighbour on a shared GPU: memory it holds is free memory for
// every process on the node.
//
//   node.cpp       this process's devices, publishing, and releasing for others:
//                  on request (another gpupool process ran out), and when the
//                  GPU's free memory runs low because others allocate (pressure)
//   ask.cpp        asking the other gpupool processes, over their control sockets
//   nvml.cpp       the GPU's free memory, from NVML loaded at run time
//
// The node registry's file, what each gpupool process holds per GPU, is
// wire/registry.* (`gpupool ps` reads it too).
//
// The CUDA and OpenCL rooms tell which pool group draws on which GPU
// (add_device); the control thread calls tick() and answers requests
// (answer_release).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "wire/uuid.hpp"

namespace gpupool {
struct Runtime;
namespace node {

// The room's state (node.cpp), made by the runtime's create(); never
// destroyed.
struct State;
State* new_state();

// The pool group `group` allocates device memory of the GPU `uuid`, of
// `total` bytes. Called when a context (CUDA) or a pool group (OpenCL) is
// first seen; repeats are ignored.
void add_device(Runtime& rt, const wire::Uuid& uuid, const std::string& group, std::size_t total);

// The control thread's periodic work: publish this process's figures,
// watch the free memory of GPUs it holds memory on. Returns when it wants
// to run next (CLOCK_MONOTONIC ns; UINT64_MAX: only when woken).
std::uint64_t tick(Runtime& rt, std::uint64_t now_ns);

// An allocation on `group`'s GPU ran out of memory and this process holds
// nothing more there: ask the other gpupool processes holding the most on
// that GPU to release, within GPUPOOL_NEIGHBOUR_WAIT. True when another
// process gave memory back meanwhile (asked or not), so that trying the
// allocation again may succeed. Any thread; takes no pool lock.
bool ask_neighbours(const std::string& group, std::size_t bytes);

// Bytes the other gpupool processes hold on `group`'s GPU (what one request
// would make free; cuMemGetInfo counts it).
std::size_t others_held(const std::string& group);

// A request from another process: "release <uuid> <bytes>". Releases this
// process's held blocks on that GPU and returns the answer's body. For
// another user's process (other_user), at most what the GPU lacks for the
// request, and only once the other processes have used more of the GPU
// since the last such release.
std::string answer_release(Runtime& rt, std::string_view args, bool other_user);

// Exit: the registry slot is given back.
void at_exit() noexcept;

}  // namespace node
}  // namespace gpupool
