// The release policies (release.hpp).
#include "core/release.hpp"

#include <algorithm>
#include <vector>

#include "core/arena.hpp"

namespace gpupool::core_detail {
namespace {

// Rounds of asking other holders (Backend::relieve) before out-of-memory
// goes back to the program. One: a round already asks every holder, and its
// wait is the bound the program was promised.
constexpr int kRelieveRounds = 1;

// The victim out of its cache and given back; its bytes, 0 when another
// thread took it first (a hit).
std::size_t release(const Victim& v) {
  const Held item = v.offer.cache->take_offered(v.offer);
  if (item.size) v.arena->let_go(item, /*drop=*/false);
  return item.size;
}

// Tiers: this arena, its group, everything else.
std::size_t release_for_oom(ArenaList& list, Arena& arena, std::size_t wanted) {
  const ArenaList::Pinned live = list.pin([](const Arena& a) { return !a.retired(); });
  std::vector<Arena*> tiers[3];
  for (Arena* a : live) tiers[a == &arena ? 0 : &a->group() == &arena.group() ? 1 : 2].push_back(a);
  std::size_t released = 0;
  for (auto& tier : tiers) {
    released += release_largest(tier, wanted - released);
    if (released >= wanted) break;
  }
  return released;
}

}  // namespace

Victim pick_victim(std::span<Arena* const> arenas, Victims order) {
  Victim v;
  for (Arena* a : arenas) {
    if (a->retired()) continue;
    const Cache* before = v.offer.cache;
    for (Cache* c : a->caches()) c->offer(order, v.offer);
    if (v.offer.cache != before) v.arena = a;
  }
  return v;
}

std::size_t release_largest(std::span<Arena* const> arenas, std::size_t wanted) {
  std::size_t held_at_start = 0;
  for (const Arena* a : arenas) held_at_start += a->releasable_bytes();
  wanted = std::min(wanted, held_at_start);
  std::size_t released = 0;
  while (released < wanted) {
    const Victim v = pick_victim(arenas, Victims::largest);
    if (!v.arena) break;
    released += release(v);  // 0: raced with a hit; look again
  }
  return released;
}

void release_over_cap(HeldCap& cap, std::span<Arena* const> members) {
  while (cap.over()) {
    const Victim v = pick_victim(members, Victims::oldest);
    if (!v.arena) return;
    if (release(v)) v.arena->count(&Stats::trims);
  }
}

// Main's order: each arena's segments while it is scanned, then the blocks
// of all of them.
std::size_t release_freed_by(std::span<Arena* const> arenas, std::uint64_t freed_by_ns,
                             std::size_t* items) {
  std::size_t bytes = 0, n = 0;
  auto trim = [&](Arena& a, const Held& item) {
    a.count(&Stats::trims);
    bytes += item.size;
    ++n;
    a.let_go(item, /*drop=*/false);
  };
  auto larger = [](const Held& x, const Held& y) { return x.size > y.size; };
  struct Old {
    Arena* arena;
    Held item;
  };
  std::vector<Old> blocks;  // of the arenas scanned so far
  std::vector<Held> found;  // taken out of `scanned`, not yet in `blocks`
  Arena* scanned = nullptr;
  // What was taken out goes back even when an allocation fails half-way:
  // out of its cache, an item is nobody's.
  auto give_back_taken = [&] {
    for (const Held& item : found) trim(*scanned, item);
    found.clear();
    std::stable_sort(blocks.begin(), blocks.end(),
                     [&](const Old& x, const Old& y) { return larger(x.item, y.item); });
    for (const Old& o : blocks) trim(*o.arena, o.item);
    blocks.clear();
  };
  try {
    for (Arena* a : arenas) {
      // Checked at use, as pick_victim does: what a retired arena holds is
      // its driver's.
      if (a->retired()) continue;
      scanned = a;
      if (a->segments() || a->ranges()) {
        if (SegmentCache* sg = a->segments()) sg->take_freed_by(freed_by_ns, found);
        if (RangeCache* rg = a->ranges()) rg->take_freed_by(freed_by_ns, found);
        // Out of `found` before the first is given back, so that a backend
        // that throws cannot have one given back twice.
        std::vector<Held> segments = std::move(found);
        found.clear();
        // Largest first; of equals, the lowest address.
        std::stable_sort(segments.begin(), segments.end(), larger);
        for (const Held& item : segments) trim(*a, item);
      }
      a->binned().take_freed_by(freed_by_ns, found);
      if (a->outside()) a->outside()->take_freed_by(freed_by_ns, found);
      if (blocks.capacity() - blocks.size() < found.size())
        blocks.reserve(std::max(blocks.size() + found.size(), 2 * blocks.capacity()));
      for (const Held& item : found) blocks.push_back({a, item});
      found.clear();
    }
  } catch (...) {
    give_back_taken();
    throw;
  }
  give_back_taken();
  if (items) *items = n;
  return bytes;
}

// We cannot know how much is missing: release the largest held item first,
// then at least as much again each round, so a large request needs few
// retries and at most twice the missing memory is given back.
BackendResult allocate_releasing(ArenaList& arenas, Arena& arena, std::size_t bytes,
                                 std::size_t exact, std::uint64_t hint, bool* used_exact) {
  Backend& backend = arena.backend();
  BackendResult r =
      retry_releasing(arenas, arena, bytes, [&] { return backend.allocate(bytes, hint); });
  if (r.status == BackendStatus::out_of_memory && exact < bytes) {
    r = backend.allocate(exact, hint);
    *used_exact = r.status == BackendStatus::ok;
  }
  return r;
}

BackendResult retry_releasing(ArenaList& arenas, Arena& arena, std::size_t bytes,
                              const std::function<BackendResult()>& attempt) {
  Backend& backend = arena.backend();
  BackendResult r = attempt();
  std::size_t released = 0;
  while (r.status == BackendStatus::out_of_memory) {
    const std::size_t now_released =
        release_for_oom(arenas, arena, std::max<std::size_t>(released, 1));
    if (now_released == 0) break;
    released += now_released;
    arena.count(&Stats::oom_retries);
    r = attempt();
  }
  // Nothing more of ours to release: other holders of the same memory may
  // release theirs (a bounded wait).
  for (int round = 0;
       round < kRelieveRounds && r.status == BackendStatus::out_of_memory && backend.relieve(bytes);
       ++round) {
    arena.count(&Stats::oom_retries);
    r = attempt();
  }
  return r;
}

}  // namespace gpupool::core_detail
