// The pool's arenas (arenas.hpp).
#include "core/arenas.hpp"

#include <algorithm>

#include "core/arena.hpp"

namespace gpupool::core_detail {

ArenaList::~ArenaList() = default;

Arena* ArenaList::add(std::unique_ptr<Backend> backend, ArenaOptions options, unsigned shards,
                      std::uint64_t (*clock)()) {
  LockGuard lock(mu_);
  Group* group = nullptr;
  for (auto& g : groups_)
    if (g->name == options.group) group = g.get();
  if (!group) {
    groups_.push_back(std::make_unique<Group>());
    group = groups_.back().get();
    group->name = options.group;
    group->cap.max_held = options.max_held;
  }
  arenas_.push_back(std::unique_ptr<Arena>(
      new Arena(std::move(backend), std::move(options), group, shards, clock)));
  group->arenas.push_back(arenas_.back().get());
  return arenas_.back().get();
}

ArenaList::Pinned::~Pinned() {
  if (list_) list_->unpin(arenas_);
}

// Under the lock, `retired` read included: once its last pin is let go and
// the lock released, another thread's reclaim() may destroy an arena, so
// nothing of it may be read afterwards.
void ArenaList::unpin(std::span<Arena* const> arenas, bool emptied) noexcept {
  bool last_of_retired = false;
  {
    LockGuard lock(mu_);
    for (Arena* a : arenas) {
      if (emptied) a->emptying_ = false;
      if (--a->pins_ == 0 && a->retired()) last_of_retired = true;
    }
  }
  if (!last_of_retired) return;
  try {
    reclaim();
  } catch (...) {
    // The next reclaim() (the control thread's periodic one) takes it.
  }
}

ArenaList::Retiring ArenaList::retire(Arena* arena, bool keep_stats) {
  LockGuard lock(mu_);
  arena->keep_stats_.store(keep_stats, std::memory_order_release);
  ++arena->pins_;
  arena->emptying_ = true;
  arena->retired_.store(true, std::memory_order_release);
  return Retiring(*this, arena);
}

void ArenaList::reclaim() {
  std::vector<std::unique_ptr<Arena>> dead;
  {
    LockGuard lock(mu_);
    // Room first: once an arena leaves the lists nothing may fail.
    try {
      dead.reserve(arenas_.size());
      retired_.reserve(retired_.size() + 1);
    } catch (...) {
      return;  // a later call reclaims it
    }
    for (auto& a : arenas_) {
      if (!a->retired() || a->pins_ != 0) continue;
      if (a->binned().any_active()) continue;
      if (a->counted()) {
        const ArenaOptions& o = a->options();
        auto it = std::find_if(retired_.begin(), retired_.end(), [&](const Retired& r) {
          return r.kind == o.kind && r.device == o.device;
        });
        if (it == retired_.end()) {
          if (retired_.size() == retired_.capacity()) continue;  // next call, with room
          it = retired_.insert(retired_.end(), Retired{o.kind, o.device, 0, {}});
        }
        it->stats += a->stats();
        ++it->arenas;
      }
      std::erase(a->group_->arenas, a.get());
      dead.push_back(std::move(a));
    }
    std::erase(arenas_, nullptr);
    std::erase_if(groups_, [](const std::unique_ptr<Group>& g) { return g->arenas.empty(); });
  }
  // Out of the lists: nothing in the pool reaches them any more. Destroyed
  // without the list's lock (a backend's destructor may take its own).
  PoolObserver* obs = observer_.load(std::memory_order_acquire);
  for (auto& a : dead)
    if (obs) obs->on_arena_destroyed(*a);
}

std::size_t ArenaList::size() const {
  LockGuard lock(mu_);
  return arenas_.size();
}

void ArenaList::add_retired(Stats& t) const {
  LockGuard lock(mu_);
  for (const Retired& r : retired_) t += r.stats;
}

void ArenaList::reset_retired_peaks() {
  LockGuard lock(mu_);
  for (Retired& r : retired_) r.stats.reset_peaks();
}

std::vector<ArenaSnapshot> ArenaList::retired_rows() const {
  std::vector<ArenaSnapshot> out;
  LockGuard lock(mu_);
  for (const Retired& r : retired_) {
    ArenaSnapshot snap;
    snap.name =
        r.kind + ": " + std::to_string(r.arenas) + " destroyed arena" + (r.arenas == 1 ? "" : "s");
    snap.group = "retired";
    snap.kind = r.kind;
    snap.device = r.device;
    snap.retired = true;
    snap.stats = r.stats;
    out.push_back(std::move(snap));
  }
  return out;
}

void ArenaList::fork_child() {
  for (auto& a : arenas_) a->pins_ = a->emptying_ ? 1 : 0;
  mu_.unlock();
}

}  // namespace gpupool::core_detail
