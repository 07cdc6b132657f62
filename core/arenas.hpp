// The pool's arenas: their list and groups, how long each lives, and the
// counters of those destroyed. Internal to core/.
//
// An arena is used outside the list's lock by the thread that allocates
// from it or frees one of its blocks (its creator's to guarantee until it
// retires the arena, then its active blocks'), by retire_arena while it
// empties it, and by pool-wide operations (free_held, a snapshot, a
// release for another process, out of memory...) that work through many
// arenas. The last two pin the arenas they use (a count taken and let go
// under the list's lock, held only for that); reclaim() destroys a retired
// arena only when no block of it is active and nothing pins it, and whoever
// lets go of a retired arena's last pin reclaims it then. So no one waits
// for anyone to finish: a reclaim never waits for a pool-wide operation to
// end, and an arena goes as soon as the last user lets go of it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "core/pool.hpp"

namespace gpupool::core_detail {

class ArenaList {
 public:
  explicit ArenaList(const std::atomic<PoolObserver*>& observer) : observer_(observer) {}
  ~ArenaList();
  ArenaList(const ArenaList&) = delete;
  ArenaList& operator=(const ArenaList&) = delete;

  // A new arena in `options.group` (created with its cap if new); `clock`
  // stamps what its caches hold (Pool::now).
  Arena* add(std::unique_ptr<Backend> backend, ArenaOptions options, unsigned shards,
             std::uint64_t (*clock)());

  // Arenas an operation uses outside the list's lock, pinned until this
  // goes. Letting go may destroy arenas (reclaim()).
  class Pinned {
   public:
    explicit Pinned(ArenaList& list) : list_(&list) {}
    Pinned(Pinned&& other) noexcept : list_(other.list_), arenas_(std::move(other.arenas_)) {
      other.list_ = nullptr;
    }
    Pinned& operator=(Pinned&&) = delete;
    ~Pinned();
    const std::vector<Arena*>& arenas() const { return arenas_; }
    auto begin() const { return arenas_.begin(); }
    auto end() const { return arenas_.end(); }

   private:
    friend class ArenaList;
    ArenaList* list_;
    std::vector<Arena*> arenas_;
  };
  // The arenas for which keep(arena) is true, in the order they were added.
  template <class Keep>
  Pinned pin(Keep&& keep) {
    Pinned p(*this);
    LockGuard lock(mu_);
    for (const auto& a : arenas_)
      if (keep(*a)) {
        p.arenas_.push_back(a.get());
        ++a->pins_;
      }
    return p;
  }
  // retire(): the arena retired and pinned while its caller empties it;
  // letting go may destroy it (reclaim()).
  class Retiring {
   public:
    Retiring(ArenaList& list, Arena* arena) : list_(list), arena_(arena) {}
    Retiring(const Retiring&) = delete;
    Retiring& operator=(const Retiring&) = delete;
    ~Retiring() { list_.unpin(std::span<Arena* const>(&arena_, 1), /*emptied=*/true); }

   private:
    ArenaList& list_;
    Arena* arena_;
  };
  // Allocates nothing.
  [[nodiscard]] Retiring retire(Arena* arena, bool keep_stats);
  // Destroy retired arenas no block and no pin keeps.
  void reclaim();

  std::size_t size() const;
  // The counters of destroyed arenas: added to `t`; one row per kind and device.
  void add_retired(Stats& t) const;
  std::vector<ArenaSnapshot> retired_rows() const;
  // The destroyed arenas' peaks down to their current values.
  void reset_retired_peaks();

  // fork(): the list's lock, taken and released around the arenas' own.
  // In the child, pins held by threads it does not have are gone, but for
  // an arena a retire was emptying: it stays, retired and half emptied, as
  // on main (destroyed, it would lose the blocks still in its bins).
  bool fork_prepare() GPUPOOL_TRY_ACQUIRE(true, mu_) { return fork_wait::take(mu_); }
  void fork_parent() GPUPOOL_RELEASE(mu_) { mu_.unlock(); }
  void fork_child() GPUPOOL_RELEASE(mu_);
  // Every arena; only while the list's lock is held (the fork handlers).
  const std::vector<std::unique_ptr<Arena>>& locked_arenas() const GPUPOOL_REQUIRES(mu_) {
    return arenas_;
  }

 private:
  using Group = Arena::Group;
  // `emptied`: the pin is retire()'s.
  void unpin(std::span<Arena* const> arenas, bool emptied = false) noexcept;

  const std::atomic<PoolObserver*>& observer_;
  mutable Ranked<LockRank::pool_arenas> mu_;
  std::vector<std::unique_ptr<Arena>> arenas_ GPUPOOL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Group>> groups_ GPUPOOL_GUARDED_BY(mu_);
  // Counters of destroyed retired arenas, one entry per kind and device:
  // what they did stays in the totals, in bounded memory, and per device.
  struct Retired {
    std::string kind;
    std::string device;
    std::uint64_t arenas = 0;
    Stats stats;
  };
  std::vector<Retired> retired_ GPUPOOL_GUARDED_BY(mu_);
};

}  // namespace gpupool::core_detail
