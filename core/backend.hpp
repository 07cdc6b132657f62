// What the pool needs from a memory source (a CUDA context's device memory,
// pinned host memory of one flag set, an OpenCL context's buffers of one flag
// set): allocate, release, optional fences for blocks the device may still
// be using after the program freed them, and optionally address ranges whose
// physical memory is mapped granule by granule.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpupool {

// A backend's name for one allocation (CUdeviceptr, host pointer, cl_mem).
using Handle = std::uintptr_t;

enum class BackendStatus { ok, out_of_memory, error };

struct BackendResult {
  BackendStatus status = BackendStatus::error;
  Handle handle = 0;
  int error = 0;         // the API's own error code when status != ok
  void* data = nullptr;  // the backend's record of the allocation: Block::data
};

struct Stats;

// Memory a backend keeps for the program outside the pool's caches (a
// driver's own memory pool, kept there by its release threshold): the pool
// cannot hand it out, only count it and give it back, on every path that
// gives held blocks back (the pool sees it as one held item of the arena:
// core/outside.hpp).
class HeldOutside {
 public:
  // Bytes give_back() would give back now: 0 where giving back is not
  // allowed now, and without what the last give_back() could not give
  // back, until the program uses the memory again (so that a policy that
  // asks again gets an answer that changes).
  virtual std::size_t held() = 0;
  // When the program last allocated from it (Pool::now_ns() time): its
  // held memory counts as freed then.
  virtual std::uint64_t last_use_ns() = 0;
  // Gives back what it holds; returns the bytes given back.
  virtual std::size_t give_back() = 0;
  // Its counters (held, active and managed bytes, hits, misses...) added.
  virtual void add_counters(Stats& s) = 0;
  // Its peaks down to their current values (Pool::reset_peaks).
  virtual void reset_peaks() = 0;

 protected:
  ~HeldOutside() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Ask the API for `bytes`. Out-of-memory makes the pool release held
  // blocks and retry; any other error goes back to the program unchanged.
  // `hint`: what the program's call asked for besides the size, passed
  // through Pool::allocate (pinned memory: its flags); blocks of one arena
  // must serve any hint alike.
  virtual BackendResult allocate(std::size_t bytes, std::uint64_t hint) = 0;
  // `data` is the allocation's BackendResult::data, handed back with its end
  // (after a context teardown another allocation may have the same handle).
  virtual void release(Handle handle, std::size_t bytes, void* data) = 0;
  // The pool lets go of a block without releasing it (the driver freed it
  // with its context, or it is a forked parent's): drop what the backend
  // keeps about it. No API call.
  virtual void drop(Handle /*handle*/, std::size_t /*bytes*/, void* /*data*/) {}

  // Fences. A block the program frees is stamped with fence(); it is not
  // handed out again until passed(fence) is true. 0 means "reusable at once".
  // passed() is on the hit path: it must be cheap (an atomic load).
  virtual std::uint64_t fence() { return 0; }
  virtual bool passed(std::uint64_t fence) { return fence == 0; }
  // Bulk: when it returns, every fence taken before the call has passed.
  // Called without pool locks held, only when a pending block is needed.
  virtual void wait_all() {}
  // When it returns, `fence` has passed: a backend that can wait for the
  // work before one fence only (not what was queued since) does so.
  virtual void wait_for(std::uint64_t /*fence*/) { wait_all(); }
  // Instead of a wait for `fence` on the host: all the device work the
  // program queues from now on is made to wait, on the device, for the work
  // queued before the fence. True when done; then reusable(fence) is true.
  // A backend that cannot (host memory, no streams known) says false, and
  // the caller waits.
  virtual bool order_after(std::uint64_t /*fence*/) { return false; }
  // Whether order_after is in use (it may still fail for a fence): a
  // pending block then costs the host nothing, and is preferred to new
  // memory.
  virtual bool orders() { return false; }
  // Whether a block freed with `fence` may be handed out again: passed, or
  // ordered after (order_after). Its memory may be given back only once
  // passed.
  virtual bool reusable(std::uint64_t fence) { return passed(fence); }

  // Out of memory although this pool holds nothing more to release here: ask
  // whoever else holds the same memory (other processes' pools) to release
  // some, `bytes` at least, within a bounded time. True when some was, so
  // the allocation is worth retrying. Called without pool locks held.
  virtual bool relieve(std::size_t /*bytes*/) { return false; }

  // Memory it keeps outside the pool's caches, if any (for the arena's
  // lifetime).
  virtual HeldOutside* outside() { return nullptr; }

  // Expandable ranges (ArenaOptions::expandable, core/ranges.hpp): address
  // space reserved once, physical memory mapped into it and unmapped, a
  // granule at a time, under addresses that stay put. A backend that can
  // returns its granule (the least it maps: CUDA's allocation granularity,
  // 2 MiB); 0: it cannot, and the arena splits driver allocations instead.
  virtual std::size_t granule() { return 0; }
  // `bytes` of address space, nothing behind it (handle: its start, aligned
  // to the granule; data: the backend's record of the range, passed back
  // with every call on it). Out-of-memory makes the pool fall back to
  // driver allocations.
  virtual BackendResult reserve(std::size_t /*bytes*/) { return {}; }
  // Physical memory behind [at, at + bytes) of the range (granule multiples,
  // nothing mapped there yet), readable and writable by the device. Out of
  // memory makes the pool release held memory and retry, as for allocate().
  virtual BackendResult map(Handle /*at*/, std::size_t /*bytes*/, void* /*range*/) { return {}; }
  // [at, at + bytes), mapped by map() (in one or several calls), unmapped
  // and its physical memory given back. The device may still use it unless
  // passed(fence): the backend waits for that first.
  virtual void unmap(Handle /*at*/, std::size_t /*bytes*/, void* /*range*/,
                     std::uint64_t /*fence*/) {}
  // The range given back, nothing mapped in it any more; or, with `drop`,
  // only forgotten (the driver freed it with its context).
  virtual void unreserve(Handle /*base*/, std::size_t /*bytes*/, void* /*range*/, bool /*drop*/) {}
};

}  // namespace gpupool
