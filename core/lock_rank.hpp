// Lock ranks: the one order in which gpupool's locks nest.
//
// Every lock of gpupool has a rank from the table below. A thread may take a lock only
// while each lock it already holds ranks lower; several locks of one rank
// are held together only by fork handlers, which take every lock at once
// (lock_rank::entering_fork). Debug builds (GPUPOOL_LOCK_RANKS, defined for
// CMAKE_BUILD_TYPE=Debug, which CI's sanitizer builds are) keep, per thread,
// how many locks of each rank it holds and abort naming both locks when one
// is taken out of order, before it can deadlock; other builds compile the
// checks away. jemalloc's witness (WITNESS_RANK_*) works the same way.
#pragma once

#include <mutex>
#include <new>

#include "core/thread_safety.hpp"

// X(id, name), lowest rank first: a lock ranks after every lock that may be
// held when it is taken. Each lock's comment says what it guards and what
// it is held around.
//
// interpose/'s own locks go before `pool_arenas`: they are held while
// calling into the pool (a context's teardown lock around retire_arena, the
// context registries around add_arena). The pool holds none of its locks
// while it calls a backend or its observer (only Backend::passed, which
// takes no lock, runs under the shard and segment locks; and a range's
// reserve, map and unmap under its own, arena_ranges), so the
// observer's locks (trace, sites, recorder) could rank either side of the
// core's; they go after them, the order fork() takes them in (runtime.hpp's
// Part: pool, then trace, then control, whose order runtime.hpp checks
// against this table). config/'s logger and files thread come last of all:
// any code may log or hand the files thread work, whatever it holds.
#define GPUPOOL_LOCK_RANK_TABLE(X)                                                        \
  /* control: the control thread's round (internal.hpp); everything the */                \
  /* thread does, the locks below included, runs under it. */                             \
  X(control_round, "control round")                                                       \
  /* control: dumps and pool actions, serialized (C API, socket, thread, exit). */        \
  X(control_work, "control work")                                                         \
  /* OpenCL: the ICD layer's start (layer.cpp), around the configuration's load. */       \
  X(opencl_layer, "opencl layer start")                                                   \
  /* CUDA: end_solo's lock (contexts.cpp), held while every context syncs. */             \
  X(cuda_solo, "cuda solo rule")                                                          \
  /* CUDA: a context's teardown lock (contexts.hpp), shared around backend */             \
  /* calls on its memory, exclusive while it is torn down (the pool's */                  \
  /* retire_arena and the pointer maps' erase_context run under it). */                   \
  X(cuda_teardown, "cuda context teardown")                                               \
  /* CUDA: the context registry (contexts.cpp), around add_arena and node::add_device. */ \
  X(cuda_contexts, "cuda contexts")                                                       \
  /* CUDA: the managed memory pools (async.cpp), around add_arena. */                     \
  X(cuda_async_pools, "cuda memory pools")                                                \
  /* CUDA: the pools whose release threshold the program set (async.cpp). */              \
  X(cuda_async_thresholds, "cuda memory pools' thresholds")                               \
  /* CUDA: stream captures (async.cpp): exclusive around a capture's start */             \
  /* and end, shared around a trim of a memory pool (the driver's call). */               \
  X(cuda_capture, "cuda stream capture")                                                  \
  /* CUDA: a shard of the traced stream-ordered allocations (async.cpp), */               \
  /* around the pool's observer calls for them. */                                        \
  X(cuda_async_blocks, "cuda stream-ordered allocations")                                 \
  /* CUDA: a context's fence synchronization state (sync_mu; not held while syncing). */  \
  X(cuda_sync, "cuda context sync")                                                       \
  /* CUDA: a context's learnt row pitches (held around one driver call). */               \
  X(cuda_pitch, "cuda pitches")                                                           \
  /* CUDA: legacy IPC of range pieces (ipc.cpp): the exports, around the */               \
  /* driver's export of their granules; apart, the imports. */                            \
  X(cuda_ipc, "cuda ipc")                                                                 \
  /* CUDA: the virtual memory units (vmm.cpp), around the driver calls that */            \
  /* bring a unit the program takes over to the state it believes. */                     \
  X(cuda_vmm, "cuda virtual memory units")                                                \
  /* CUDA: a pointer map's ordered view (pointers.hpp), then... */                        \
  X(cuda_ranges, "cuda pointer ranges")                                                   \
  /* ...one of its shards (the hit path's lookups). */                                    \
  X(cuda_pointers, "cuda pointer shard")                                                  \
  /* OpenCL: the context map (contexts.cpp). */                                           \
  X(opencl_contexts, "opencl context map")                                                \
  /* OpenCL: every context record (fork() renews them). */                                \
  X(opencl_records, "opencl context records")                                             \
  /* OpenCL: one context (contexts.hpp), around add_arena and release_held. */            \
  X(opencl_context, "opencl context")                                                     \
  /* OpenCL: a shard of the buffer, SVM block and queue maps (the hit path), */           \
  /* and the buffers' destructor callbacks; each held for one lookup. */                  \
  X(opencl_buffers, "opencl buffer shard")                                                \
  X(opencl_svm, "opencl svm shard")                                                       \
  X(opencl_callbacks, "opencl buffer callbacks")                                          \
  X(opencl_queues, "opencl queue shard")                                                  \
  /* OpenCL: the buffers a forked child's implementation made (unpooled.cpp). */          \
  X(opencl_unpooled, "opencl unpooled buffers")                                           \
  /* node: the devices and the registry (node.cpp); nothing is called under it. */        \
  X(node_devices, "node devices")                                                         \
  /* node: the NVML session (nvml.cpp), around NVML's calls. */                           \
  X(node_nvml, "node nvml session")                                                       \
  /* core: ArenaList::mu_: the arena and group lists, the retired totals. */              \
  X(pool_arenas, "pool arenas")                                                           \
  /* core: Arena::slow_mu_: the counters of backend calls. */                             \
  X(arena_counters, "arena counters")                                                     \
  /* core: Shard::mu (binned.hpp): a thread slot's bins and counters (the hit path). */   \
  X(arena_shard, "arena shard")                                                           \
  /* core: SegmentCache::mu_: an arena's segments and pieces. */                          \
  X(arena_segments, "arena segments")                                                     \
  /* core: RangeCache::mu_ (ranges.hpp): an arena's range and pieces, held around */      \
  /* the backend's reserve, map and unmap: a backend may take there only locks */         \
  /* ranked after it (none of interpose/'s). */                                           \
  X(arena_ranges, "arena ranges")                                                         \
  /* CUDA: a range's mapped granules and who may access them (memory.cpp), */             \
  /* around the driver's map, unmap and access calls, then the contexts */                \
  /* given peer access (the device backend's, under the range's lock). */                 \
  X(cuda_range_access, "cuda range access")                                               \
  X(cuda_peer_access, "cuda peer access")                                                 \
  /* the observer: a thread's trace buffer while it is drained (trace.cpp), */            \
  X(trace_buffer, "trace buffer")                                                         \
  /* then the trace file, */                                                              \
  X(trace_file, "trace file")                                                             \
  /* then the allocation sites' table (sites.hpp), */                                     \
  X(sites, "allocation sites")                                                            \
  /* and, apart, one shard of the recorder's held blocks (recorder.hpp). */               \
  X(recorder_shard, "recorder shard")                                                     \
  /* control: the warnings kept for the dumps (internal.hpp). */                          \
  X(control_warnings, "control warnings")                                                 \
  /* control: the control socket's requests queue (internal.hpp). */                      \
  X(control_requests, "control requests")                                                 \
  /* config: the logger's sink (log.cpp), around one line's write, which */               \
  /* goes through the files thread. */                                                    \
  X(log_sink, "logger sink")                                                              \
  /* config: the files thread's queue (files_thread.cpp); nothing is taken under it. */   \
  X(files_queue, "files thread queue")

namespace gpupool {

namespace fork_wait {
bool keep_waiting(unsigned turn);  // core/fork_wait.hpp
}

enum class LockRank : unsigned char {
#define GPUPOOL_LOCK_RANK_ID(id, name) id,
  GPUPOOL_LOCK_RANK_TABLE(GPUPOOL_LOCK_RANK_ID)
#undef GPUPOOL_LOCK_RANK_ID
};

namespace lock_rank {

inline constexpr unsigned kRanks = 0
#define GPUPOOL_LOCK_RANK_COUNT(id, name) +1
    GPUPOOL_LOCK_RANK_TABLE(GPUPOOL_LOCK_RANK_COUNT)
#undef GPUPOOL_LOCK_RANK_COUNT
    ;

const char* name(LockRank rank);

// The checker (lock_rank.cpp, compiled into every build so that a test can
// use it in any): `taking` aborts if this thread holds a lock of `rank` or
// higher (the same rank inside a ForkScope excepted), then counts it held.
void taking(LockRank rank);
// A lock taken without waiting (try_lock): it cannot deadlock, so its rank
// is not checked; it counts as held, so what is taken under it is.
void took(LockRank rank);
void released(LockRank rank);
void fork_begin();
void fork_end();

// Builds with and without the checks may meet in one program (a test of the
// checker in a release build): each has its own names for what differs.
// Only for what is declared here and in spin_lock.hpp: a class holding a
// Ranked member (Arena, Shard, ArenaList, SegmentCache) is the same class
// either way, so a file whose checking differs from core's must not use
// core's other headers (it would be two definitions of one class).
#ifdef GPUPOOL_LOCK_RANKS
inline namespace checked {
inline void will_take(LockRank r) { taking(r); }
inline void did_take(LockRank r) { took(r); }
inline void did_release(LockRank r) { released(r); }
// From a fork's prepare handler to its parent or child handler, where every
// lock of a rank is taken at once.
inline void entering_fork() { fork_begin(); }
inline void leaving_fork() { fork_end(); }
}  // namespace checked
#else
inline namespace unchecked {
inline void will_take(LockRank) {}
inline void did_take(LockRank) {}
inline void did_release(LockRank) {}
inline void entering_fork() {}
inline void leaving_fork() {}
}  // namespace unchecked
#endif

}  // namespace lock_rank

#ifdef GPUPOOL_LOCK_RANKS
inline namespace checked {
#else
inline namespace unchecked {
#endif

// A lock (std::mutex, std::shared_mutex, SpinLock) with its rank: what every
// lock of core/ and interpose/ is. In builds without the checks it is the
// lock itself: nothing more on the hit path. For clang's thread-safety
// analysis it is the capability that GPUPOOL_GUARDED_BY and
// GPUPOOL_REQUIRES name (core/thread_safety.hpp).
template <LockRank R, class Lock = std::mutex>
class GPUPOOL_CAPABILITY("mutex") Ranked {
 public:
  static constexpr LockRank rank = R;
  void lock() GPUPOOL_ACQUIRE() {
    lock_rank::will_take(R);
    lock_.lock();
  }
  bool try_lock() GPUPOOL_TRY_ACQUIRE(true) {
    if (!lock_.try_lock()) return false;
    lock_rank::did_take(R);
    return true;
  }
  void unlock() GPUPOOL_RELEASE() {
    lock_.unlock();
    lock_rank::did_release(R);
  }
  // fork()'s prepare handlers (core/fork_wait.hpp): as lock(), unless the
  // wait gives up first (false, nothing taken). Checked as lock() is.
  bool lock_or_give_up() GPUPOOL_TRY_ACQUIRE(true) {
    lock_rank::will_take(R);
    for (unsigned turn = 0; !lock_.try_lock(); ++turn)
      if (!fork_wait::keep_waiting(turn)) {
        lock_rank::did_release(R);
        return false;
      }
    return true;
  }
  bool try_lock_shared() GPUPOOL_TSA(try_acquire_shared_capability(true)) {
    if (!lock_.try_lock_shared()) return false;
    lock_rank::did_take(R);
    return true;
  }
  // A shared take (std::shared_mutex) ranks as an exclusive one.
  void lock_shared() GPUPOOL_ACQUIRE_SHARED() {
    lock_rank::will_take(R);
    lock_.lock_shared();
  }
  void unlock_shared() GPUPOOL_RELEASE_SHARED() {
    lock_.unlock_shared();
    lock_rank::did_release(R);
  }
  // fork()'s child, for a lock its prepare handler took that cannot be
  // unlocked there (a written std::shared_mutex names the parent's thread,
  // which the child does not have): made new, and no longer held.
  void remake_held_in_child() GPUPOOL_RELEASE() {
    new (&lock_) Lock;
    lock_rank::did_release(R);
  }

 private:
  Lock lock_;
};

// Scoped takes of a Ranked lock that the thread-safety analysis follows
// (std::lock_guard, std::unique_lock and std::shared_lock are not annotated
// in libstdc++). Same use as the standard ones.
template <class M>
class GPUPOOL_SCOPED_CAPABILITY LockGuard {
 public:
  explicit LockGuard(M& m) GPUPOOL_ACQUIRE(m) : m_(m) { m_.lock(); }
  // `m` already taken (a try_lock that succeeded): let go at scope end.
  LockGuard(M& m, std::adopt_lock_t) GPUPOOL_REQUIRES(m) : m_(m) {}
  ~LockGuard() GPUPOOL_RELEASE() { m_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  M& m_;
};

// Taken at construction; may be let go and taken again (a condition
// variable's wait does both).
template <class M>
class GPUPOOL_SCOPED_CAPABILITY UniqueLock {
 public:
  explicit UniqueLock(M& m) GPUPOOL_ACQUIRE(m) : m_(m) { lock(); }
  ~UniqueLock() GPUPOOL_RELEASE() {
    if (owns_) m_.unlock();
  }
  UniqueLock(const UniqueLock&) = delete;
  UniqueLock& operator=(const UniqueLock&) = delete;
  void lock() GPUPOOL_ACQUIRE() {
    m_.lock();
    owns_ = true;
  }
  void unlock() GPUPOOL_RELEASE() {
    owns_ = false;
    m_.unlock();
  }
  bool owns_lock() const { return owns_; }

 private:
  M& m_;
  bool owns_ = false;
};

template <class M>
class GPUPOOL_SCOPED_CAPABILITY SharedLock {
 public:
  explicit SharedLock(M& m) GPUPOOL_ACQUIRE_SHARED(m) : m_(m) { m_.lock_shared(); }
  // `m` already taken shared (a try_lock_shared that succeeded).
  SharedLock(M& m, std::adopt_lock_t) GPUPOOL_REQUIRES_SHARED(m) : m_(m) {}
  ~SharedLock() GPUPOOL_RELEASE() { m_.unlock_shared(); }
  SharedLock(const SharedLock&) = delete;
  SharedLock& operator=(const SharedLock&) = delete;

 private:
  M& m_;
};

}  // namespace checked / unchecked
}  // namespace gpupool
