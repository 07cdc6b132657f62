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
// (add_device); when it starts, the room gives the control thread its work
// (control::NodeWork: tick and answer_release, node/internal.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "wire/device_key.hpp"

namespace gpupool {
struct Runtime;
namespace node {

// The room's state (internal.hpp), made by the runtime's create(); never
// destroyed. The room's parts of the process's life are in runtime.hpp's
// table (node::kPart: node.cpp).
struct State;

// The pool group `group` allocates memory of the device `key` (a GPU's
// UUID, host memory, or a key derived for a device without a UUID:
// wire/device_key.hpp), of `total` bytes. Called when a context (CUDA) or a pool group (OpenCL) is
// first seen; repeats are ignored.
void add_device(Runtime& rt, const wire::DeviceKey& key, const std::string& group,
                std::size_t total);

// An allocation on `group`'s GPU ran out of memory and this process holds
// nothing more there: ask the other gpupool processes holding the most on
// that GPU to release, within GPUPOOL_NEIGHBOUR_WAIT. True when another
// process gave memory back meanwhile (asked or not), so that trying the
// allocation again may succeed. Any thread; takes no pool lock.
bool ask_neighbours(const std::string& group, std::size_t bytes);

// Bytes the other gpupool processes hold on `group`'s GPU (what one request
// would make free; cuMemGetInfo counts it).
std::size_t others_held(const std::string& group);

}  // namespace node
}  // namespace gpupool
