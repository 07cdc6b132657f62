// Stream-ordered allocations (cuMemAllocAsync, cuMemAllocFromPoolAsync,
// cuMemFreeAsync and their per-thread variants): gpupool manages the
// driver's memory pools rather than serving them from its own bins, so the
// driver's stream-ordered reuse (at once on the freeing stream, elsewhere
// once the free has executed) and graph capture stay exactly the driver's
// (docs/guarantees.md, "What gpupool keeps exactly as the driver does").
//
// Each pool the program allocates from is an arena of kind "cuda-async" in
// its device's group, whose memory is held outside the pool's caches
// (core/backend.hpp, HeldOutside): what the driver's pool reserves beyond
// what is in use. Where the program has not set the pool's release
// threshold, gpupool raises it (to GPUPOOL_MAX_HELD, unlimited by default;
// not while holding is stopped), so that freed memory stays in the pool
// across synchronizations instead of going back to the driver at each one.
// Every path that gives held blocks back trims the pool (cuMemPoolTrimTo),
// except while a stream captures, where that call is not allowed.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <shared_mutex>

#include "core/lock_rank.hpp"
#include "interpose/cuda/driver.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::cuda {

struct AsyncPool;

// The managed pool an allocation draws on: `pool`, or (nullptr) the
// current pool of the current context's device. nullptr: not managed
// (pooling off, no context): the call passes through.
AsyncPool* async_pool(const Driver& d, Runtime& rt, CUmemoryPool pool);
// Its device (the out-of-memory release looks there).
int async_device(const AsyncPool* p);
// After the program's allocation of `bytes` from `p` returned `r` (and
// `ptr`): counted, and told to the pool's observer if it has one (the
// trace, sites, leak report), as an allocation of kind Served::outside.
void async_allocated(const Driver& d, Runtime& rt, AsyncPool* p, CUresult r, CUdeviceptr ptr,
                     std::size_t bytes);
// Before the driver frees `ptr` (cuMemFreeAsync, or cuMemFree, which the
// driver allows for stream-ordered memory): an allocation the observer was
// told of ends, told before the driver can hand the address out again.
// True (with what it was, in *freed) when it was one; should the driver
// refuse the free, async_free_refused tells it again.
struct AsyncFreed {
  AsyncPool* pool = nullptr;
  std::size_t size = 0;
};
bool async_freeing(Runtime& rt, CUdeviceptr ptr, AsyncFreed* freed);
void async_free_refused(Runtime& rt, CUdeviceptr ptr, const AsyncFreed& freed);

// The program set a pool attribute (the call succeeded): a release
// threshold of its own is the driver's to apply from then on.
void async_attribute_set(const Driver& d, CUmemoryPool pool, CUmemPool_attribute attr);
// The release threshold the program would see: true (and *value) when
// gpupool raised the pool's, whose driver default is 0.
bool async_threshold_seen(CUmemoryPool pool, cuuint64_t* value);
// The pool was destroyed, or the device's current pool changed.
// Before the driver's cuMemPoolDestroy (going: true; false again if the
// driver refused): gpupool stops naming the pool to the driver, and waits
// for the calls already under way.
void async_pool_destroying(CUmemoryPool pool, bool going);
void async_pool_destroyed(Runtime& rt, CUmemoryPool pool);
void async_current_pool_changed(CUdevice dev);

// Stream capture. A hook that may start or end one holds a CaptureChange
// around the driver's call, so that no trim runs meanwhile; a capture
// started is counted (capture_started) until the driver says the stream
// captures no more (capture_maybe_ended). ptsz: the per-thread variant,
// where stream 0 is the thread's own default stream.
// The captures' lock: a CaptureChange holds it exclusively, a trim shared.
using CaptureLock = Ranked<LockRank::cuda_capture, std::shared_mutex>;
CaptureLock& capture_lock();
class GPUPOOL_SCOPED_CAPABILITY CaptureChange {
 public:
  CaptureChange() GPUPOOL_ACQUIRE(capture_lock());
  ~CaptureChange() GPUPOOL_RELEASE();
  CaptureChange(const CaptureChange&) = delete;
  CaptureChange& operator=(const CaptureChange&) = delete;
};
void capture_started(CUstream s, bool ptsz) GPUPOOL_REQUIRES(capture_lock());
bool stream_capturing();  // a capture is under way in the process
void capture_maybe_ended(const Driver& d, CUstream s, bool ptsz) GPUPOOL_REQUIRES(capture_lock());
// The stream was destroyed: a capture on it is over.
void capture_stream_destroyed(CUstream s) GPUPOOL_REQUIRES(capture_lock());

// The managed pools' registry (cuda::State::async), made with the runtime.
struct AsyncRegistry;
AsyncRegistry* make_async_registry();

// fork(): the registry's (r: none while the runtime is being made), the
// program's thresholds' and the captures' locks (contexts.cpp's handlers
// call these in rank order); in the child, the parent's pools are retired
// without driver calls.
bool async_fork_prepare(AsyncRegistry* r);  // false: gave up (core/fork_wait.hpp)
void async_fork_parent(AsyncRegistry* r);
void async_fork_child(AsyncRegistry* r);
void async_fork_renew(Runtime& rt);

}  // namespace gpupool::cuda
