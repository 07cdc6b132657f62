// The release policies (release.hpp).
#include "core/release.hpp"

#include <algorithm>
#include <vector>

#include "core/arena.hpp"

namespace gpupool {
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

std::size_t release_freed_by(std::span<Arena* const> arenas, std::uint64_t freed_by_ns,
                             std::size_t* items) {
  struct Old {
    Arena* arena;
    Held item;
  };
  std::vector<Old> old;
  std::vector<Held> found;
  for (Arena* a : arenas)
    for (Cache* c : a->caches()) {
      found.clear();
      c->take_freed_by(freed_by_ns, found);
      for (const Held& item : found) old.push_back({a, item});
    }
  std::stable_sort(old.begin(), old.end(),
                   [](const Old& x, const Old& y) { return x.item.size > y.item.size; });
  std::size_t bytes = 0;
  for (const Old& o : old) {
    o.arena->count(&Stats::trims);
    bytes += o.item.size;
    o.arena->let_go(o.item, /*drop=*/false);
  }
  if (items) *items = old.size();
  return bytes;
}

// We cannot know how much is missing: release the largest held item first,
// then at least as much again each round, so a large request needs few
// retries and at most twice the missing memory is given back.
BackendResult allocate_releasing(ArenaList& arenas, Arena& arena, std::size_t bytes,
                                 std::size_t exact, std::uint64_t hint, bool* used_exact) {
  Backend& backend = arena.backend();
  BackendResult r = backend.allocate(bytes, hint);
  std::size_t released = 0;
  while (r.status == BackendStatus::out_of_memory) {
    const std::size_t now_released =
        release_for_oom(arenas, arena, std::max<std::size_t>(released, 1));
    if (now_released == 0) break;
    released += now_released;
    arena.count(&Stats::oom_retries);
    r = backend.allocate(bytes, hint);
  }
  // Nothing more of ours to release: other holders of the same memory may
  // release theirs (a bounded wait).
  for (int round = 0; round < kRelieveRounds && r.status == BackendStatus::out_of_memory &&
                      backend.relieve(bytes);
       ++round) {
    arena.count(&Stats::oom_retries);
    r = backend.allocate(bytes, hint);
  }
  if (r.status == BackendStatus::out_of_memory && exact < bytes) {
    r = backend.allocate(exact, hint);
    *used_exact = r.status == BackendStatus::ok;
  }
  return r;
}

}  // namespace gpupool
