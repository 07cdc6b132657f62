// A device's key: the name every process of the node gives the memory a
// pool group draws on. The node registry (registry.hpp) and release
// requests (socket.hpp) name devices so.
//
//   a GPU's UUID          ordinals differ between processes
//                         (CUDA_VISIBLE_DEVICES), UUIDs do not; NVML knows it
//   kHostMemory           the node's pinned host memory
//   derived_key(identity) a device without a UUID (PoCL's CPU device, an
//                         OpenCL context of several devices): its platform,
//                         name and vendor and the node, hashed
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpupool::wire {

using DeviceKey = std::array<std::uint8_t, 16>;

// The node's pinned host memory, as a device of its own: every process on
// the node draws on the same host memory.
inline constexpr DeviceKey kHostMemory = {'p', 'i', 'n', 'n', 'e', 'd', ' ', 'h',
                                          'o', 's', 't', ' ', 'm', 'e', 'm', 0};

// The key of a device without a UUID: its first bytes mark it as derived,
// the rest are a hash of `identity` (the same text in every process that
// uses the device, gives the same key; FNV-1a, fixed here, so processes of
// different gpupool versions agree).
DeviceKey derived_key(std::string_view identity);
bool is_derived(const DeviceKey& k);
// A GPU's UUID, which NVML can be asked about: neither host memory nor
// derived.
inline bool is_gpu(const DeviceKey& k) { return k != kHostMemory && !is_derived(k); }

// "GPU-" and the UUID's bytes as 8-4-4-4-12 lowercase hex (NVML's
// spelling); "host" for kHostMemory; "opencl-" and 24 hex digits for a
// derived key.
std::string key_text(const DeviceKey& k);
// Accepts key_text's forms (a UUID with or without "GPU-"); false otherwise.
bool parse_key(std::string_view text, DeviceKey* out);

}  // namespace gpupool::wire
