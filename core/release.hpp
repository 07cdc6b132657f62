// The release policies: what the pool gives back to the backends, and in
// which order, when a backend is out of memory, a group is over its cap,
// held memory has been idle, or another process asks. Each works on the
// items of some arenas' caches (cache.hpp) and is small enough to read on
// its own; one victim picker serves them all. Internal to core/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include "core/arenas.hpp"
#include "core/cache.hpp"

namespace gpupool::core_detail {

// The item of the arenas' caches that comes first in `order` (retired
// arenas left out), and its arena; none: arena == nullptr. Arenas in order,
// and in each its caches (Arena::caches): the first of equals wins.
struct Victim {
  Arena* arena = nullptr;
  Offer offer;
};
Victim pick_victim(std::span<Arena* const> arenas, Victims order);

// Out of memory: the largest items first, until at least `wanted` bytes
// are given back or as many as the arenas held when it started (what the
// program frees meanwhile is not chased: a program that keeps freeing
// would keep the caller, the control thread answering another process,
// releasing for as long as it runs). Returns the bytes.
std::size_t release_largest(std::span<Arena* const> arenas, std::size_t wanted);

// The cap: the oldest items of the group's arenas, until it holds no more
// than its cap. Counted as trims.
void release_over_cap(HeldCap& cap, std::span<Arena* const> members);

// Idleness: every item freed at or before `freed_by_ns`, given back with no
// pool lock held (the program allocates meanwhile), in main's order: each
// arena's wholly free segments as it is scanned, largest first; then the
// held blocks of all the arenas, largest first (taken out of their bins
// first). An allocation that fails half-way loses nothing: what was taken
// out is given back before the failure goes on. Counted as trims. Returns
// the bytes; *items gets how many.
std::size_t release_freed_by(std::span<Arena* const> arenas, std::uint64_t freed_by_ns,
                             std::size_t* items);

// `bytes` from the arena's backend, the out-of-memory way: held items are
// released (largest first: this arena's, then its group's, then every
// other's) and the allocation retried; then other holders of the memory are
// asked (Backend::relieve); then, if the rounded size still does not fit,
// the `exact` size is tried (*used_exact).
BackendResult allocate_releasing(ArenaList& arenas, Arena& arena, std::size_t bytes,
                                 std::size_t exact, std::uint64_t hint, bool* used_exact);
// `attempt` (what takes `bytes` of the arena's backend: an allocation, a
// range's growth) retried the out-of-memory way, as above, but for the
// exact size.
BackendResult retry_releasing(ArenaList& arenas, Arena& arena, std::size_t bytes,
                              const std::function<BackendResult()>& attempt);

}  // namespace gpupool::core_detail
