// An arena's internals, shared by the pool's files: its group and caches.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/binned.hpp"
#include "core/cache.hpp"
#include "core/outside.hpp"
#include "core/pool.hpp"
#include "core/ranges.hpp"
#include "core/segments.hpp"

namespace gpupool {

// Arenas drawing on the same memory (one device's, the node's pinned
// memory): the held-byte cap and the out-of-memory release look at them
// together.
struct Arena::Group {
  std::string name;
  core_detail::HeldCap cap;
  std::vector<Arena*> arenas;  // under the arena list's lock (arenas.hpp)
};

inline void Arena::took_memory(std::size_t size) {
  LockGuard lock(slow_mu_);
  ++slow_.backend_allocs;
  slow_.managed_bytes += size;
  slow_.peak_managed_bytes = std::max(slow_.peak_managed_bytes, slow_.managed_bytes);
}

}  // namespace gpupool
