// The lock of the hit path's shards (the pool's, the shim's handle tables).
//
// Held for a few dozen instructions at a time: uncontended, one atomic
// exchange to take and a store to give back, where a mutex costs two
// library calls (a warm pool pair takes two locks; on the stand-in driver
// they were a sixth of the pair's instructions). Contended, it spins
// briefly and then yields. Fork handlers take every shard's lock at once,
// more locks than ThreadSanitizer can track per thread as mutexes.
#pragma once

#include <atomic>
#include <thread>

namespace gpupool {

// One step of a spin-wait: tells the core (and a hyperthread sibling) that
// this thread only waits.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class SpinLock {
 public:
  void lock() {
    for (unsigned spins = 0; flag_.exchange(true, std::memory_order_acquire); ++spins) {
      while (flag_.load(std::memory_order_relaxed)) {
        if (++spins > 64) std::this_thread::yield();
      }
    }
  }
  bool try_lock() {
    return !flag_.load(std::memory_order_relaxed) &&
           !flag_.exchange(true, std::memory_order_acquire);
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

}  // namespace gpupool
