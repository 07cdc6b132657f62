// A GPU's UUID, the name every process of the node gives it: ordinals
// differ between processes (CUDA_VISIBLE_DEVICES), UUIDs do not. The node
// registry (registry.hpp) and release requests (socket.hpp) name devices so.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpupool::wire {

using Uuid = std::array<std::uint8_t, 16>;

// The node's pinned host memory, as a device of its own: every process on
// the node draws on the same host memory.
inline constexpr Uuid kHostMemory = {'p', 'i', 'n', 'n', 'e', 'd', ' ', 'h',
                                     'o', 's', 't', ' ', 'm', 'e', 'm', 0};

// NVML's spelling: "GPU-" and the bytes as 8-4-4-4-12 lowercase hex; "host"
// for kHostMemory.
std::string uuid_text(const Uuid& u);
// Accepts uuid_text's forms, with or without "GPU-"; false otherwise.
bool parse_uuid(std::string_view text, Uuid* out);

}  // namespace gpupool::wire
