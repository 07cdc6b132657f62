// The shim's lookup of its records by the program's handles (device
// pointers, pinned addresses, cl_mem, cl_command_queue), on every hit path.
//
// HandleTable: open addressing with linear probing over a power-of-two array
// of (handle, record) pairs. A lookup is a hash and, the table at most half
// full, one or two adjacent slots: no division, no pointer chase, and no
// heap node per insert.
// Erasing shifts the following entries back (no tombstones), so erase never
// allocates and a table that saw many handles come and go stays fast.
// Handle 0 marks an empty slot: no live handle of these APIs is 0.
//
// ShardedHandleTable: 2^ShardBits tables, each under its own SpinLock
// (core/spin_lock.hpp) of rank R (core/lock_rank.hpp), picked by a multiplicative hash of the
// handle: threads working on different handles meet at a lock only when their handles share a
// shard.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "core/spin_lock.hpp"

namespace gpupool {

template <class V>
class HandleTable {
 public:
  HandleTable() = default;
  HandleTable(const HandleTable&) = delete;
  HandleTable& operator=(const HandleTable&) = delete;

  V* find(std::uintptr_t key) const {
    if (!slots_) return nullptr;
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == 0) return nullptr;
    }
  }

  // Inserts or replaces; returns the value it replaced (nullptr if none).
  // Throws std::bad_alloc (growing) before changing anything.
  V* put(std::uintptr_t key, V* value) {
    if ((count_ + 1) * 2 > capacity()) grow();
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.key == key) {
        V* old = s.value;
        s.value = value;
        return old;
      }
      if (s.key == 0) {
        s = {key, value};
        ++count_;
        return nullptr;
      }
    }
  }

  // Removes key; returns its value (nullptr if absent). Never allocates.
  V* erase(std::uintptr_t key) {
    if (!slots_) return nullptr;
    std::size_t i = home(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == 0) return nullptr;
      i = (i + 1) & mask_;
    }
    V* old = slots_[i].value;
    // Backward shift: move each following entry of the run into the hole
    // unless its home lies cyclically in (hole, its slot].
    for (std::size_t j = (i + 1) & mask_; slots_[j].key != 0; j = (j + 1) & mask_) {
      const std::size_t h = home(slots_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i] = {};
    --count_;
    return old;
  }

  std::size_t size() const { return count_; }

 private:
  struct Slot {
    std::uintptr_t key = 0;
    V* value = nullptr;
  };
  std::size_t capacity() const { return slots_ ? mask_ + 1 : 0; }
  std::size_t home(std::uintptr_t key) const {
    // A full mix, then the top bits: handles are aligned (their low bits
    // alone would collide), and callers that shard by a multiplicative hash
    // of the same handles leave those top bits equal within a shard.
    std::uint64_t x = key;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return static_cast<std::size_t>(x >> shift_);
  }
  void grow() {
    const std::size_t old_cap = capacity(), cap = old_cap ? old_cap * 2 : 16;
    std::unique_ptr<Slot[]> bigger(new Slot[cap]);  // may throw: nothing changed yet
    std::swap(slots_, bigger);
    mask_ = cap - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(cap));
    count_ = 0;
    for (std::size_t i = 0; i < old_cap; ++i)
      if (bigger[i].key != 0) put(bigger[i].key, bigger[i].value);
  }

  std::unique_ptr<Slot[]> slots_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t count_ = 0;
};

template <class V, unsigned ShardBits, LockRank R>
class ShardedHandleTable {
  static_assert(ShardBits >= 1 && ShardBits < 32, "the shard is the hash's top ShardBits bits");

 public:
  struct alignas(64) Shard {
    Ranked<R, SpinLock> mu;
    HandleTable<V> map;
  };
  static constexpr unsigned kShards = 1u << ShardBits;

  Shard& shard(std::uintptr_t h) {
    return shards_[static_cast<unsigned>((h * 0x9E3779B97F4A7C15ull) >> (64 - ShardBits))];
  }
  // Every shard locked (fork handlers), in one order.
  // fork(): false when a wait gave up (core/fork_wait.hpp).
  bool lock_all() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
    for (Shard& s : shards_)
      if (!fork_wait::take(s.mu)) return false;
    return true;
  }
  void unlock_all() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
    for (Shard& s : shards_) s.mu.unlock();
  }

 private:
  Shard shards_[kShards];
};

}  // namespace gpupool
