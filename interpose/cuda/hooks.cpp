// The CUDA driver entry points gpupool replaces.
//
// Each hook is a hidden function gpupool_hook_<export>, exported under the
// export's own name (for programs linked with -lcuda) and handed out in
// place of the real function by the dlsym hook and the cuGetProcAddress
// wrappers. Whatever is not a pooled block goes to the real driver
// unchanged, so the program gets the driver's own error codes.
#include <algorithm>

#include "interpose/cuda/async.hpp"
#include "interpose/cuda/contexts.hpp"
#include "interpose/cuda/driver.hpp"
#include "interpose/cuda/ipc.hpp"
#include "interpose/cuda/memory.hpp"
#include "interpose/cuda/pointers.hpp"
#include "interpose/cuda/vmm.hpp"
#include "interpose/hook_scope.hpp"
#include "interpose/node/node.hpp"
#include "interpose/runtime.hpp"
#include "sys/log.hpp"

using namespace gpupool;
using namespace gpupool::cuda;

namespace {

// No driver at all (cannot normally happen: the program reached us through
// libcuda). The driver's own answer before a successful cuInit.
constexpr CUresult kNoDriver = CUDA_ERROR_NOT_INITIALIZED;

// The runtime when pooling of this kind is on, else nullptr.
Runtime* pooling(bool host) {
  Runtime* rt = runtime();
  if (!rt || !(host ? rt->config.cuda_host : rt->config.cuda)) return nullptr;
  return rt;
}

// The block containing p, in whichever map has it.
PtrInfo find_any(const Runtime& rt, CUdeviceptr p, bool* host = nullptr) {
  PtrInfo i = device_map(rt).find(p);
  if (host) *host = false;
  if (!i.found) {
    i = host_map(rt).find(p);
    if (host) *host = i.found;
  }
  if (!i.found) i = vmm::find(p);
  if (!i.found) i = ipc::find(p);
  return i;
}

// True when p is free memory from the program's point of view although the
// driver still has it: a held block, or the rounding padding after the
// requested size.
void log_once_split_ipc(bool in_range) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  if (in_range)
    log().error(
        "cuIpcGetMemHandle on a block of an expandable range (GPUPOOL_SEGMENTS=expandable) is "
        "refused with CUDA_ERROR_NOT_SUPPORTED: the range is virtual memory, which legacy IPC "
        "cannot share, and this device does not export it as POSIX file descriptors, which "
        "gpupool would send instead. Unset GPUPOOL_SEGMENTS to share device memory between "
        "processes.");
  else
    log().error(
        "cuIpcGetMemHandle on a block split from a larger allocation (GPUPOOL_SPLIT) is refused "
        "with CUDA_ERROR_NOT_SUPPORTED: another process would open the allocation's start, not "
        "this block. Unset GPUPOOL_SPLIT to share device memory between processes.");
}

bool unallocated_for_program(const PtrInfo& i, CUdeviceptr p) {
  return i.found && (!i.active || p - i.base >= i.requested);
}

// Attributes whose answer pooling changes.
void patch_attribute(CUpointer_attribute attr, void* data, const PtrInfo& i) {
  if (!data) return;
  if (attr == CU_POINTER_ATTRIBUTE_RANGE_SIZE) *static_cast<size_t*>(data) = i.requested;
  // A piece of a split segment starts where the program's allocation does,
  // not where the driver's does.
  if (attr == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) *static_cast<CUdeviceptr*>(data) = i.base;
  if (attr == CU_POINTER_ATTRIBUTE_BUFFER_ID) *static_cast<unsigned long long*>(data) = i.buffer_id;
  if (!i.in_range) return;
  // A piece of an expandable range is the driver's virtual memory, which it
  // says legacy IPC cannot share: answered as for the cuMemAlloc block the
  // program asked for (its IPC handle is refused all the same, as a
  // GPUPOOL_SPLIT piece's).
  if (attr == CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) *static_cast<int*>(data) = 1;
}

// The pool's block into the device map for the program. Recording a piece
// of a split segment may fail (no host memory): the block goes back to the
// pool and the failure on to the hook, which asks the driver alone.
[[gnu::always_inline]] inline CUdeviceptr hand_out_device(Runtime& rt, Block* b) {
  // Read first: once the program owns it, a context teardown racing this
  // call may forget (delete) the block.
  const CUdeviceptr h = b->handle;
  try {
    device_map(rt).activate(b);
  } catch (...) {
    rt.pool.free(b);
    throw;
  }
  return h;
}

CUresult host_alloc(const Driver& d, void** pp, size_t bytes, unsigned flags, bool v2_alloc_host) {
  auto pass = [&] {
    return v2_alloc_host ? d.mem_alloc_host(pp, bytes) : d.mem_host_alloc(pp, bytes, flags);
  };
  // NULL out-pointer, size 0 (SUCCESS with NULL) and unknown flags
  // (INVALID_VALUE) are the driver's to answer.
  if (!pp || bytes == 0 || (flags & ~7u) || !d.mem_host_alloc) return pass();
  Runtime* rt = pooling(true);
  if (!rt) return pass();
  CtxState* st = current_state(d, *rt, true);
  if (!st) return pass();  // no current context: the driver says 201
  Arena* arena = host_arena(st, *rt, flags);
  if (!arena) return pass();
  const AllocResult a = rt->pool.allocate(arena, bytes, flags);
  if (!a.block) {
    *pp = nullptr;
    return static_cast<CUresult>(a.error ? a.error : CUDA_ERROR_OUT_OF_MEMORY);
  }
  const Handle h = a.block->handle;  // before the program owns it (hand_out_device)
  host_map(*rt).activate(a.block);
  *pp = reinterpret_cast<void*>(h);
  return CUDA_SUCCESS;
}

// An allocation gpupool does not serve (stream-ordered, virtual memory,
// managed) ran out of device memory: what gpupool holds of that device (the
// current context's, or `dev`) goes back, other gpupool processes on the GPU
// are asked, and the call is made again, once. Memory held for the
// program's pooled allocations must never fail its others.
template <class Call>
CUresult retry_out_of_memory(const Driver& d, int dev, std::size_t bytes, Call&& call) {
  CUresult r = call();
  if (r != CUDA_ERROR_OUT_OF_MEMORY) return r;
  Runtime* rt = runtime_if_started();
  if (!rt) return r;
  if (dev < 0) {
    CUdevice cur = 0;
    if (!d.ctx_get_device || d.ctx_get_device(&cur) != CUDA_SUCCESS) return r;
    dev = cur;
  }
  const std::string group = device_group(dev);
  if (!vmm::escape_ghosts() && rt->pool.release_group(group, SIZE_MAX) == 0 &&
      !node::ask_neighbours(group, bytes))
    return r;
  log().debug(
      "cuda: an allocation gpupool does not serve ({} bytes) ran out of memory: "
      "retried after releasing held memory",
      bytes);
  return call();
}

// A stream-ordered allocation: from a pool gpupool manages (async.hpp),
// retried after releasing what it holds when the device is full. NULL
// out-pointers and size 0 are the driver's to answer; so is an allocation
// while a stream captures (a graph's, and releasing memory then is a call
// the capture does not allow).
template <class Call>
CUresult alloc_async(const Driver& d, CUdeviceptr* dptr, std::size_t bytes, CUmemoryPool pool,
                     Call&& call) {
  if (stream_capturing()) return call();
  Runtime* rt = dptr && bytes ? pooling(false) : nullptr;
  AsyncPool* p = rt ? async_pool(d, *rt, pool) : nullptr;
  const CUresult r = retry_out_of_memory(d, async_device(p), bytes, call);
  if (p) async_allocated(d, *rt, p, r, *dptr, bytes);
  return r;
}

// Memory gpupool does not serve, freed by the driver: a stream-ordered
// allocation's end is told to the pool's observer (async.hpp).
template <class Real>
CUresult free_elsewhere(Runtime& rt, CUdeviceptr p, Real&& real) {
  AsyncFreed freed;
  const bool traced = async_freeing(rt, p, &freed);
  const CUresult r = real();
  if (traced && r != CUDA_SUCCESS) async_free_refused(rt, p, freed);
  return r;
}

// The program frees device memory (cuMemFree, or in stream order, where a
// block of gpupool's is freed as cuMemFree frees it: its fence, or the solo
// rule, covers the work queued before the free). `real`: the driver's call,
// for everything that is not ours (0, bad and interior pointers).
template <class Real>
CUresult free_device(CUdeviceptr p, Real real) {
  Runtime* rt = p ? runtime() : nullptr;
  if (!rt) return real();
  bool known = false;
  Block* b = device_map(*rt).deactivate(p, &known);
  if (!known) return free_elsewhere(*rt, p, real);
  if (!b) return CUDA_ERROR_INVALID_VALUE;            // ours and already free: a double free
  if (!b->pooled && b->split) ipc::forget_export(p);  // no process may open it from now
  rt->pool.free(b);
  return CUDA_SUCCESS;
}

// A call that starts a stream capture: no trim runs meanwhile (async.hpp).
template <class Real>
CUresult begin_capture(CUstream s, bool ptsz, Real&& real) {
  CaptureChange change;
  const CUresult r = real();
  if (r == CUDA_SUCCESS) capture_started(s, ptsz);
  return r;
}

template <class Real>
CUresult end_capture(const Driver& d, CUstream s, bool ptsz, Real&& real) {
  CaptureChange change;
  const CUresult r = real();
  capture_maybe_ended(d, s, ptsz);
  return r;
}

// A call that may end st's context: made with st's teardown lock held
// exclusively (no backend call frees the context's memory meanwhile); if it
// succeeded and `ended()` says the context is gone, st's blocks are dropped
// and its arenas destroyed there (retire_locked).
template <class Real, class Ended>
CUresult end_context(CtxState* st, Runtime& rt, Real&& real, Ended&& ended) {
  UniqueLock lock(st->teardown_mu);
  const CUresult r = real();
  if (r == CUDA_SUCCESS && ended()) retire_locked(st, rt);
  return r;
}

CUresult ctx_destroy(const Driver& d, CUcontext ctx, PFN_ctx real) {
  Runtime* rt = runtime();
  CtxState* st = rt && ctx ? find_state(d, *rt, ctx) : nullptr;
  if (!st) return real(ctx);
  return end_context(
      st, *rt, [&] { return real(ctx); }, [] { return true; });
}

// cuCtxDetach (deprecated; PyCUDA drops its contexts with it) destroys the
// context only at its last user (cuCtxAttach adds users, the driver counts
// them): whether this one did, the driver says afterwards.
CUresult ctx_detach(const Driver& d, CUcontext ctx, PFN_ctx real) {
  Runtime* rt = runtime();
  CtxState* st = rt && ctx ? find_state(d, *rt, ctx) : nullptr;
  if (!st) return real(ctx);
  return end_context(
      st, *rt, [&] { return real(ctx); }, [&] { return !context_alive(d, st); });
}

// Only the last release destroys the primary context.
CUresult primary_release(const Driver& d, CUdevice dev, PFN_dev real) {
  Runtime* rt = runtime();
  CtxState* st = rt ? primary_state(d, *rt, dev) : nullptr;
  if (!st) return real(dev);
  return end_context(
      st, *rt, [&] { return real(dev); },
      [&] {
        unsigned flags = 0;
        int active = 1;
        return d.primary_get_state && d.primary_get_state(dev, &flags, &active) == CUDA_SUCCESS &&
               !active;
      });
}

CUresult primary_reset(const Driver& d, CUdevice dev, PFN_dev real) {
  Runtime* rt = runtime();
  CtxState* st = rt ? primary_state(d, *rt, dev) : nullptr;
  if (!st) return real(dev);
  return end_context(
      st, *rt, [&] { return real(dev); }, [] { return true; });
}

}  // namespace

extern "C" {

#define GPUPOOL_HIDDEN __attribute__((visibility("hidden")))

// No exception of gpupool's reaches the program: a hook that fails inside
// gpupool (std::bad_alloc while recording a block, say) makes the call to
// the driver alone, which gives the program the driver's own answer. The
// pool leaves nothing half-done when it throws (a fresh block is released),
// and paths after a driver call (frees, context teardown) do not throw.
#define GPUPOOL_FALLBACK(field, ...)                                                       \
  catch (...) {                                                                            \
    const HookScope hook_scope;                                                            \
    internal_failure(__func__);                                                            \
    const Driver* fallback_driver = driver();                                              \
    return fallback_driver && fallback_driver->field ? fallback_driver->field(__VA_ARGS__) \
                                                     : kNoDriver;                          \
  }

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc) return kNoDriver;
  // NULL out-pointer and size 0 get the driver's INVALID_VALUE (and *dptr = 0).
  if (!dptr || bytes == 0) return d->mem_alloc(dptr, bytes);
  Runtime* rt = pooling(false);
  if (!rt) return d->mem_alloc(dptr, bytes);
  CtxState* st = current_state(*d, *rt, true);
  Arena* arena = st ? st->device_arena.load(std::memory_order_acquire) : nullptr;
  if (!arena) return d->mem_alloc(dptr, bytes);  // no usable context: 201, 709, 3 ...
  const AllocResult a = rt->pool.allocate(arena, bytes);
  if (!a.block) {
    *dptr = 0;
    return static_cast<CUresult>(a.error ? a.error : CUDA_ERROR_OUT_OF_MEMORY);
  }
  *dptr = hand_out_device(*rt, a.block);
  return CUDA_SUCCESS;
}
GPUPOOL_FALLBACK(mem_alloc, dptr, bytes)

// A pitched allocation is a device allocation of pitch x height bytes with
// the driver's pitch for the row: served by the pool like cuMemAlloc's
// (cuMemFree gives it back). Whatever the driver would refuse (NULL
// pointers, zero sizes, element sizes other than 4, 8, 16, rows wider than
// it allows) goes to the driver for its own answer.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch,
                                                        size_t width, size_t height,
                                                        unsigned int element) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_pitch) return kNoDriver;
  auto pass = [&] { return d->mem_alloc_pitch(dptr, pitch, width, height, element); };
  if (!dptr || !pitch || width == 0 || height == 0) return pass();
  Runtime* rt = pooling(false);
  if (!rt) return pass();
  CtxState* st = current_state(*d, *rt, true);
  Arena* arena = st ? st->device_arena.load(std::memory_order_acquire) : nullptr;
  if (!arena) return pass();
  std::size_t row = 0, bytes = 0;
  CUresult learnt = pitch_for(*d, st, width, element, &row);
  // One row did not fit: what we hold goes back first, as for any
  // out-of-memory.
  if (learnt == CUDA_ERROR_OUT_OF_MEMORY &&
      rt->pool.release_group(device_group(st->dev), SIZE_MAX) > 0)
    learnt = pitch_for(*d, st, width, element, &row);
  if (learnt != CUDA_SUCCESS || __builtin_mul_overflow(row, height, &bytes)) return pass();
  const AllocResult a = rt->pool.allocate(arena, bytes);
  if (!a.block) {
    *dptr = 0;
    return static_cast<CUresult>(a.error ? a.error : CUDA_ERROR_OUT_OF_MEMORY);
  }
  *dptr = hand_out_device(*rt, a.block);
  *pitch = row;
  return CUDA_SUCCESS;
}
GPUPOOL_FALLBACK(mem_alloc_pitch, dptr, pitch, width, height, element)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemFree_v2(CUdeviceptr p) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_free) return kNoDriver;
  return free_device(p, [&] { return d->mem_free(p); });
}
GPUPOOL_FALLBACK(mem_free, p)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocHost_v2(void** pp, size_t bytes) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_host) return kNoDriver;
  return host_alloc(*d, pp, bytes, 0, true);
}
GPUPOOL_FALLBACK(mem_alloc_host, pp, bytes)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemHostAlloc(void** pp, size_t bytes,
                                                    unsigned int flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_host_alloc) return kNoDriver;
  return host_alloc(*d, pp, bytes, flags, false);
}
GPUPOOL_FALLBACK(mem_host_alloc, pp, bytes, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemFreeHost(void* p) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_free_host) return kNoDriver;
  Runtime* rt = p ? runtime() : nullptr;
  if (!rt) return d->mem_free_host(p);
  bool known = false;
  Block* b = host_map(*rt).deactivate(reinterpret_cast<Handle>(p), &known);
  if (!known) return d->mem_free_host(p);
  if (!b) return CUDA_ERROR_INVALID_VALUE;
  rt->pool.free(b);
  return CUDA_SUCCESS;
}
GPUPOOL_FALLBACK(mem_free_host, p)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemGetInfo_v2(size_t* free, size_t* total) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_get_info) return kNoDriver;
  vmm::escape_ghosts();  // memory the program released is free
  const CUresult r = d->mem_get_info(free, total);
  Runtime* rt = runtime();
  if (r != CUDA_SUCCESS || !rt || !free || !total || !d->ctx_get_device) return r;
  // Held blocks are free memory as far as the program is concerned, ours
  // and those of the other gpupool processes we can ask (one request away;
  // the context is made known first, so that its GPU is looked up even
  // before the program's first allocation).
  CUdevice dev = 0;
  // What contexts that died unseen held is the driver's free memory already.
  retire_dead_contexts(*d, *rt);
  if (rt->config.cuda) current_state(*d, *rt, true);
  if (d->ctx_get_device(&dev) == CUDA_SUCCESS) {
    const std::size_t mine = held_device_bytes(dev), others = node::others_held(device_group(dev));
    const std::size_t room = *total - std::min(*free, *total);  // what may count as free
    *free += std::min(room, std::min(room, mine) + std::min(room, others));
    *free = std::min(*free, *total);
  }
  return r;
}
GPUPOOL_FALLBACK(mem_get_info, free, total)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemGetAddressRange_v2(CUdeviceptr* pbase, size_t* psize,
                                                             CUdeviceptr dptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_get_address_range) return kNoDriver;
  const Runtime* rt = runtime();
  const PtrInfo i = rt ? find_any(*rt, dptr) : PtrInfo{};
  if (!i.found) return d->mem_get_address_range(pbase, psize, dptr);
  if (unallocated_for_program(i, dptr))
    return d->mem_get_address_range(pbase, psize, unallocated_address());
  const CUresult r = d->mem_get_address_range(pbase, psize, dptr);
  if (r == CUDA_SUCCESS && psize) *psize = i.requested;
  if (r == CUDA_SUCCESS && pbase) *pbase = i.base;  // a split piece's own start
  return r;
}
GPUPOOL_FALLBACK(mem_get_address_range, pbase, psize, dptr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuPointerGetAttribute(void* data, CUpointer_attribute attr,
                                                           CUdeviceptr ptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->pointer_get_attribute) return kNoDriver;
  const Runtime* rt = runtime();
  const PtrInfo i = rt ? find_any(*rt, ptr) : PtrInfo{};
  if (!i.found) return d->pointer_get_attribute(data, attr, ptr);
  if (unallocated_for_program(i, ptr))
    return d->pointer_get_attribute(data, attr, unallocated_address());
  const CUresult r = d->pointer_get_attribute(data, attr, ptr);
  if (r == CUDA_SUCCESS) patch_attribute(attr, data, i);
  return r;
}
GPUPOOL_FALLBACK(pointer_get_attribute, data, attr, ptr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuPointerGetAttributes(unsigned int n,
                                                            CUpointer_attribute* attrs, void** data,
                                                            CUdeviceptr ptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->pointer_get_attributes) return kNoDriver;
  const Runtime* rt = runtime();
  const PtrInfo i = rt ? find_any(*rt, ptr) : PtrInfo{};
  if (!i.found) return d->pointer_get_attributes(n, attrs, data, ptr);
  // The driver fills in its defaults for memory it does not know.
  if (unallocated_for_program(i, ptr))
    return d->pointer_get_attributes(n, attrs, data, unallocated_address());
  const CUresult r = d->pointer_get_attributes(n, attrs, data, ptr);
  if (r == CUDA_SUCCESS && attrs && data)
    for (unsigned k = 0; k < n; ++k) patch_attribute(attrs[k], data[k], i);
  return r;
}
GPUPOOL_FALLBACK(pointer_get_attributes, n, attrs, data, ptr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemHostGetFlags(unsigned int* pflags, void* p) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_host_get_flags) return kNoDriver;
  const CUdeviceptr q = reinterpret_cast<CUdeviceptr>(p);
  const Runtime* rt = runtime();
  const PtrInfo i = rt ? host_map(*rt).find(q) : PtrInfo{};
  if (unallocated_for_program(i, q))
    return d->mem_host_get_flags(pflags, reinterpret_cast<void*>(unallocated_address()));
  const CUresult r = d->mem_host_get_flags(pflags, p);
  // The driver answers for the pinned chunk the block lives in, which other
  // blocks of other flags may share while gpupool holds them: report what
  // the program asked for, normalised as the driver does (DEVICEMAP set).
  if (r == CUDA_SUCCESS && pflags && i.found) *pflags = i.host_flags;
  return r;
}
GPUPOOL_FALLBACK(mem_host_get_flags, pflags, p)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuIpcGetMemHandle(CUipcMemHandle* handle,
                                                       CUdeviceptr dptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ipc_get_mem_handle) return kNoDriver;
  Runtime* rt = runtime();
  const PtrInfo i = rt ? device_map(*rt).find(dptr) : PtrInfo{};
  if (unallocated_for_program(i, dptr)) return d->ipc_get_mem_handle(handle, unallocated_address());
  // The driver's handle names the whole driver allocation: another process
  // would open it at the segment's start, not at this piece, and the rest
  // would be handed out here while that process maps it. (A piece that is
  // its whole segment is shared as any block: released when freed.)
  // A range piece: gpupool's own handle, which gpupool opens in the
  // importing process (ipc.hpp). Where its granules cannot be exported, or
  // for a split segment's piece, refused.
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (i.in_range && i.active) r = ipc::export_piece(*d, i, handle);
  else if (!i.shares_allocation) r = d->ipc_get_mem_handle(handle, dptr);
  if (r == CUDA_ERROR_NOT_SUPPORTED && (i.in_range || i.shares_allocation)) {
    log_once_split_ipc(i.in_range);
    return r;
  }
  // The importer's streams do not wait for this process's marks.
  if (r == CUDA_SUCCESS) wait_device_ordered();
  // Another process may map this block: it must never be handed out again
  // here, and its free must reach the driver.
  if (r == CUDA_SUCCESS && i.found)
    if (Block* b = device_map(*rt).active_block(i.base)) rt->pool.never_reuse(b);
  return r;
}
GPUPOOL_FALLBACK(ipc_get_mem_handle, handle, dptr)

namespace {
CUresult ipc_open(PFN_ipc_open Driver::*field, CUdeviceptr* dptr, CUipcMemHandle handle,
                  unsigned flags) {
  const Driver* d = driver();
  if (!d || !(d->*field)) return kNoDriver;
  // gpupool's handle (a range piece of a gpupool process): opened by
  // gpupool whether this process pools or not.
  if (ipc::ours(handle)) return ipc::open(*d, d->*field, dptr, handle, flags);
  return (d->*field)(dptr, handle, flags);
}
}  // namespace

GPUPOOL_HIDDEN CUresult gpupool_hook_cuIpcOpenMemHandle_v2(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                           unsigned int flags) noexcept try {
  const HookScope hook_scope;
  return ipc_open(&Driver::ipc_open, dptr, handle, flags);
}
GPUPOOL_FALLBACK(ipc_open, dptr, handle, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuIpcOpenMemHandle(CUdeviceptr* dptr, CUipcMemHandle handle,
                                                        unsigned int flags) noexcept try {
  const HookScope hook_scope;
  return ipc_open(&Driver::ipc_open_v1, dptr, handle, flags);
}
GPUPOOL_FALLBACK(ipc_open_v1, dptr, handle, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuIpcCloseMemHandle(CUdeviceptr dptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ipc_close) return kNoDriver;
  CUresult r = CUDA_SUCCESS;
  if (ipc::close(*d, dptr, &r)) return r;
  return d->ipc_close(dptr);
}
GPUPOOL_FALLBACK(ipc_close, dptr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes,
                                                     CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_async) return kNoDriver;
  return alloc_async(*d, dptr, bytes, nullptr, [&] { return d->mem_alloc_async(dptr, bytes, s); });
}
GPUPOOL_FALLBACK(mem_alloc_async, dptr, bytes, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                          CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_async_ptsz) return kNoDriver;
  return alloc_async(*d, dptr, bytes, nullptr,
                     [&] { return d->mem_alloc_async_ptsz(dptr, bytes, s); });
}
GPUPOOL_FALLBACK(mem_alloc_async_ptsz, dptr, bytes, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes,
                                                             CUmemoryPool pool, CUstream s) noexcept
    try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_from_pool) return kNoDriver;
  if (!pool) return d->mem_alloc_from_pool(dptr, bytes, pool, s);
  return alloc_async(*d, dptr, bytes, pool,
                     [&] { return d->mem_alloc_from_pool(dptr, bytes, pool, s); });
}
GPUPOOL_FALLBACK(mem_alloc_from_pool, dptr, bytes, pool, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes,
                                                                  CUmemoryPool pool,
                                                                  CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_from_pool_ptsz) return kNoDriver;
  if (!pool) return d->mem_alloc_from_pool_ptsz(dptr, bytes, pool, s);
  return alloc_async(*d, dptr, bytes, pool,
                     [&] { return d->mem_alloc_from_pool_ptsz(dptr, bytes, pool, s); });
}
GPUPOOL_FALLBACK(mem_alloc_from_pool_ptsz, dptr, bytes, pool, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemFreeAsync(CUdeviceptr p, CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_free_async) return kNoDriver;
  return free_device(p, [&] { return d->mem_free_async(p, s); });
}
GPUPOOL_FALLBACK(mem_free_async, p, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_free_async_ptsz) return kNoDriver;
  return free_device(p, [&] { return d->mem_free_async_ptsz(p, s); });
}
GPUPOOL_FALLBACK(mem_free_async_ptsz, p, s)

// A release threshold the program sets is its own from then on.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemPoolSetAttribute(CUmemoryPool pool,
                                                           CUmemPool_attribute attr,
                                                           void* value) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_pool_set_attribute) return kNoDriver;
  const CUresult r = d->mem_pool_set_attribute(pool, attr, value);
  if (r == CUDA_SUCCESS) async_attribute_set(*d, pool, attr);
  return r;
}
GPUPOOL_FALLBACK(mem_pool_set_attribute, pool, attr, value)

// The threshold gpupool raised reads as the driver's default (0), which is
// what the program would see without gpupool.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemPoolGetAttribute(CUmemoryPool pool,
                                                           CUmemPool_attribute attr,
                                                           void* value) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_pool_get_attribute) return kNoDriver;
  const CUresult r = d->mem_pool_get_attribute(pool, attr, value);
  cuuint64_t seen = 0;
  if (r == CUDA_SUCCESS && value && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD &&
      async_threshold_seen(pool, &seen))
    *static_cast<cuuint64_t*>(value) = seen;
  return r;
}
GPUPOOL_FALLBACK(mem_pool_get_attribute, pool, attr, value)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemPoolDestroy(CUmemoryPool pool) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_pool_destroy) return kNoDriver;
  Runtime* rt = runtime_if_started();
  if (rt) async_pool_destroying(pool, true);
  const CUresult r = d->mem_pool_destroy(pool);
  if (rt && r == CUDA_SUCCESS) async_pool_destroyed(*rt, pool);
  else if (rt) async_pool_destroying(pool, false);
  return r;
}
GPUPOOL_FALLBACK(mem_pool_destroy, pool)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) noexcept
    try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->device_set_mem_pool) return kNoDriver;
  const CUresult r = d->device_set_mem_pool(dev, pool);
  if (r == CUDA_SUCCESS) async_current_pool_changed(dev);
  return r;
}
GPUPOOL_FALLBACK(device_set_mem_pool, dev, pool)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCapture(CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture_v1) return kNoDriver;
  return begin_capture(s, false, [&] { return d->begin_capture_v1(s); });
}
GPUPOOL_FALLBACK(begin_capture_v1, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCapture_ptsz(CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture_v1_ptsz) return kNoDriver;
  return begin_capture(s, true, [&] { return d->begin_capture_v1_ptsz(s); });
}
GPUPOOL_FALLBACK(begin_capture_v1_ptsz, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCapture_v2(CUstream s,
                                                             CUstreamCaptureMode mode) noexcept
    try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture) return kNoDriver;
  return begin_capture(s, false, [&] { return d->begin_capture(s, mode); });
}
GPUPOOL_FALLBACK(begin_capture, s, mode)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCapture_v2_ptsz(CUstream s,
                                                                  CUstreamCaptureMode mode) noexcept
    try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture_ptsz) return kNoDriver;
  return begin_capture(s, true, [&] { return d->begin_capture_ptsz(s, mode); });
}
GPUPOOL_FALLBACK(begin_capture_ptsz, s, mode)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCaptureToGraph(
    CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data, size_t n,
    CUstreamCaptureMode mode) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture_to_graph) return kNoDriver;
  return begin_capture(s, false,
                       [&] { return d->begin_capture_to_graph(s, g, deps, data, n, mode); });
}
GPUPOOL_FALLBACK(begin_capture_to_graph, s, g, deps, data, n, mode)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamBeginCaptureToGraph_ptsz(
    CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data, size_t n,
    CUstreamCaptureMode mode) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->begin_capture_to_graph_ptsz) return kNoDriver;
  return begin_capture(s, true,
                       [&] { return d->begin_capture_to_graph_ptsz(s, g, deps, data, n, mode); });
}
GPUPOOL_FALLBACK(begin_capture_to_graph_ptsz, s, g, deps, data, n, mode)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamEndCapture(CUstream s, CUgraph* g) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->end_capture) return kNoDriver;
  return end_capture(*d, s, false, [&] { return d->end_capture(s, g); });
}
GPUPOOL_FALLBACK(end_capture, s, g)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->end_capture_ptsz) return kNoDriver;
  return end_capture(*d, s, true, [&] { return d->end_capture_ptsz(s, g); });
}
GPUPOOL_FALLBACK(end_capture_ptsz, s, g)

// Either cuStreamDestroy: a stream destroyed while it captured captures no
// more, and one ordering on the device waited on is forgotten first.
static CUresult destroy_stream(PFN_stream destroy, CUstream s) {
  const bool known = stream_going(s);
  CUresult r = CUDA_SUCCESS;
  {
    CaptureChange change;
    r = destroy(s);
    if (r == CUDA_SUCCESS) capture_stream_destroyed(s);
  }
  if (r != CUDA_SUCCESS && known) stream_kept(r);
  return r;
}

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamDestroy(CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->stream_destroy_v1) return kNoDriver;
  return destroy_stream(d->stream_destroy_v1, s);
}
GPUPOOL_FALLBACK(stream_destroy_v1, s)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamDestroy_v2(CUstream s) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->stream_destroy) return kNoDriver;
  return destroy_stream(d->stream_destroy, s);
}
GPUPOOL_FALLBACK(stream_destroy, s)

// Physical memory of the virtual memory API (XLA's platform allocator,
// PyTorch's expandable segments): pooled in units where the program uses
// the API as that allocator does (vmm.hpp), else the driver's, on the
// device the properties name.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t bytes,
                                                 const CUmemAllocationProp* prop,
                                                 unsigned long long flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_create) return kNoDriver;
  if (const std::optional<CUresult> served = vmm::create(*d, handle, bytes, prop, flags))
    return *served;
  const int dev =
      prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
  return retry_out_of_memory(*d, dev, bytes,
                             [&] { return d->mem_create(handle, bytes, prop, flags); });
}
GPUPOOL_FALLBACK(mem_create, handle, bytes, prop, flags)

// The rest of the virtual memory API: a pooled unit's handle or address is
// answered for by vmm.cpp, anything else goes to the driver.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemRelease(CUmemGenericAllocationHandle handle) noexcept
    try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_release) return kNoDriver;
  return vmm::release(*d, handle);
}
GPUPOOL_FALLBACK(mem_release, handle)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAddressReserve(CUdeviceptr* ptr, size_t bytes,
                                                         size_t alignment, CUdeviceptr addr,
                                                         unsigned long long flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_address_reserve) return kNoDriver;
  return vmm::address_reserve(*d, ptr, bytes, alignment, addr, flags);
}
GPUPOOL_FALLBACK(mem_address_reserve, ptr, bytes, alignment, addr, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAddressFree(CUdeviceptr ptr, size_t bytes) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_address_free) return kNoDriver;
  return vmm::address_free(*d, ptr, bytes);
}
GPUPOOL_FALLBACK(mem_address_free, ptr, bytes)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemMap(CUdeviceptr ptr, size_t bytes, size_t offset,
                                              CUmemGenericAllocationHandle handle,
                                              unsigned long long flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_map) return kNoDriver;
  return vmm::map(*d, ptr, bytes, offset, handle, flags);
}
GPUPOOL_FALLBACK(mem_map, ptr, bytes, offset, handle, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemUnmap(CUdeviceptr ptr, size_t bytes) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_unmap) return kNoDriver;
  return vmm::unmap(*d, ptr, bytes);
}
GPUPOOL_FALLBACK(mem_unmap, ptr, bytes)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemSetAccess(CUdeviceptr ptr, size_t bytes,
                                                    const CUmemAccessDesc* desc,
                                                    size_t count) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_set_access) return kNoDriver;
  return vmm::set_access(*d, ptr, bytes, desc, count);
}
GPUPOOL_FALLBACK(mem_set_access, ptr, bytes, desc, count)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemRetainAllocationHandle(
    CUmemGenericAllocationHandle* handle, void* addr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_retain_handle) return kNoDriver;
  return vmm::retain_handle(*d, handle, addr);
}
GPUPOOL_FALLBACK(mem_retain_handle, handle, addr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemExportToShareableHandle(
    void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
    unsigned long long flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_export) return kNoDriver;
  return vmm::export_handle(*d, shareable, handle, type, flags);
}
GPUPOOL_FALLBACK(mem_export, shareable, handle, type, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes,
                                                       unsigned int flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_alloc_managed) return kNoDriver;
  return retry_out_of_memory(*d, -1, bytes,
                             [&] { return d->mem_alloc_managed(dptr, bytes, flags); });
}
GPUPOOL_FALLBACK(mem_alloc_managed, dptr, bytes, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxDestroy(CUcontext ctx) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_destroy_v1) return kNoDriver;
  return ctx_destroy(*d, ctx, d->ctx_destroy_v1);
}
GPUPOOL_FALLBACK(ctx_destroy_v1, ctx)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxDestroy_v2(CUcontext ctx) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_destroy) return kNoDriver;
  return ctx_destroy(*d, ctx, d->ctx_destroy);
}
GPUPOOL_FALLBACK(ctx_destroy, ctx)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxDetach(CUcontext ctx) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_detach) return kNoDriver;
  return ctx_detach(*d, ctx, d->ctx_detach);
}
GPUPOOL_FALLBACK(ctx_detach, ctx)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDevicePrimaryCtxRelease(CUdevice dev) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->primary_release_v1) return kNoDriver;
  return primary_release(*d, dev, d->primary_release_v1);
}
GPUPOOL_FALLBACK(primary_release_v1, dev)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDevicePrimaryCtxRelease_v2(CUdevice dev) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->primary_release) return kNoDriver;
  return primary_release(*d, dev, d->primary_release);
}
GPUPOOL_FALLBACK(primary_release, dev)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDevicePrimaryCtxReset(CUdevice dev) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->primary_reset_v1) return kNoDriver;
  return primary_reset(*d, dev, d->primary_reset_v1);
}
GPUPOOL_FALLBACK(primary_reset_v1, dev)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDevicePrimaryCtxReset_v2(CUdevice dev) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->primary_reset) return kNoDriver;
  return primary_reset(*d, dev, d->primary_reset);
}
GPUPOOL_FALLBACK(primary_reset, dev)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuDevicePrimaryCtxRetain(CUcontext* pctx,
                                                              CUdevice dev) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->primary_retain) return kNoDriver;
  const CUresult r = d->primary_retain(pctx, dev);
  // Remember which context is the device's primary one, so its reset or
  // last release can drop its blocks.
  if (r == CUDA_SUCCESS && pctx && *pctx) note_primary(*pctx, dev);
  return r;
}
GPUPOOL_FALLBACK(primary_retain, pctx, dev)

// A second order of device work (contexts.hpp, the solo rule): the rule
// ends before the driver is asked, so no work of the new stream or peer
// can overtake work on a block the rule lent.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamCreate(CUstream* s, unsigned int flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->stream_create) return kNoDriver;
  end_solo("a stream");
  const CUresult r = d->stream_create(s, flags);
  if (r == CUDA_SUCCESS && s) stream_noted(*d, *s, flags);
  return r;
}
GPUPOOL_FALLBACK(stream_create, s, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuStreamCreateWithPriority(CUstream* s, unsigned int flags,
                                                                int priority) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->stream_create_prio) return kNoDriver;
  end_solo("a stream");
  const CUresult r = d->stream_create_prio(s, flags, priority);
  if (r == CUDA_SUCCESS && s) stream_noted(*d, *s, flags);
  return r;
}
GPUPOOL_FALLBACK(stream_create_prio, s, flags, priority)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuGreenCtxStreamCreate(CUstream* s, CUgreenCtx g,
                                                            unsigned int flags,
                                                            int priority) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->green_stream_create) return kNoDriver;
  end_solo("a stream");
  end_device_order("a green context's stream");
  return d->green_stream_create(s, g, flags, priority);
}
GPUPOOL_FALLBACK(green_stream_create, s, g, flags, priority)

// Device memory reached outside any stream, which ordering on the device
// cannot make wait: GPUDirect RDMA (CUDA-aware MPI and UCX set SYNC_MEMOPS
// on the buffers they register) and dma-buf exports. Ordering ends first,
// its old work waited for (contexts.hpp, end_device_order).
GPUPOOL_HIDDEN CUresult gpupool_hook_cuPointerSetAttribute(const void* value,
                                                           CUpointer_attribute attribute,
                                                           CUdeviceptr ptr) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->pointer_set_attribute) return kNoDriver;
  if (attribute == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS)
    end_device_order("a block set for synchronous memory operations (GPUDirect RDMA)");
  return d->pointer_set_attribute(value, attribute, ptr);
}
GPUPOOL_FALLBACK(pointer_set_attribute, value, attribute, ptr)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuMemGetHandleForAddressRange(
    void* handle, CUdeviceptr ptr, size_t size, CUmemRangeHandleType type,
    unsigned long long flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->mem_get_handle_for_range) return kNoDriver;
  end_device_order("a dma-buf export");
  return d->mem_get_handle_for_range(handle, ptr, size, type, flags);
}
GPUPOOL_FALLBACK(mem_get_handle_for_range, handle, ptr, size, type, flags)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxEnablePeerAccess(CUcontext peer,
                                                           unsigned int flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_enable_peer_access) return kNoDriver;
  end_solo("peer access");
  end_device_order("peer access");
  const CUresult r = d->ctx_enable_peer_access(peer, flags);
  // The peer's range pieces become accessible here, as its cuMemAlloc
  // blocks just did.
  CUdevice dev = 0;
  if (r == CUDA_SUCCESS && d->ctx_get_device && d->ctx_get_device(&dev) == CUDA_SUCCESS)
    if (Runtime* rt = runtime()) grant_peer_access(*d, *rt, peer, dev);
  return r;
}
GPUPOOL_FALLBACK(ctx_enable_peer_access, peer, flags)

// A synchronization of the whole context the program makes itself (what
// cudaDeviceSynchronize calls) completes every fence taken before it.
GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxSynchronize() noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_synchronize) return kNoDriver;
  Runtime* rt = runtime();
  CtxState* st = rt ? current_state(*d, *rt, false) : nullptr;
  const std::uint64_t s = st ? st->epoch_next.fetch_add(1, std::memory_order_seq_cst) : 0;
  const CUresult r = d->ctx_synchronize();
  if (st && r == CUDA_SUCCESS) epoch_completed(st, s);
  return r;
}
GPUPOOL_FALLBACK(ctx_synchronize)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuCtxSynchronize_v2(CUcontext ctx) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->ctx_synchronize_v2) return kNoDriver;
  Runtime* rt = runtime();
  CtxState* st = !rt ? nullptr : ctx ? find_state(*d, *rt, ctx) : current_state(*d, *rt, false);
  const std::uint64_t s = st ? st->epoch_next.fetch_add(1, std::memory_order_seq_cst) : 0;
  const CUresult r = d->ctx_synchronize_v2(ctx);
  if (st && r == CUDA_SUCCESS) epoch_completed(st, s);
  return r;
}
GPUPOOL_FALLBACK(ctx_synchronize_v2, ctx)

// cudart gets every entry point here (ask old ABI versions, per-thread
// variants, and cuGetProcAddress itself). Call the real one, then replace the
// answer only if it is exactly an export we hook. symbolStatus is the
// driver's to write (cudart passes NULL).
GPUPOOL_HIDDEN CUresult
gpupool_hook_cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult* status) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->get_proc_address) return kNoDriver;
  const CUresult r = d->get_proc_address(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn && *pfn) {
    if (void* h = hook_for(*pfn)) *pfn = h;
    solo_note_symbol(symbol, flags);
  }
  return r;
}
GPUPOOL_FALLBACK(get_proc_address, symbol, pfn, version, flags, status)

GPUPOOL_HIDDEN CUresult gpupool_hook_cuGetProcAddress(const char* symbol, void** pfn, int version,
                                                      cuuint64_t flags) noexcept try {
  const HookScope hook_scope;
  const Driver* d = driver();
  if (!d || !d->get_proc_address_v1) return kNoDriver;
  const CUresult r = d->get_proc_address_v1(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn) {
    if (void* h = hook_for(*pfn)) *pfn = h;
    solo_note_symbol(symbol, flags);
  }
  return r;
}
GPUPOOL_FALLBACK(get_proc_address_v1, symbol, pfn, version, flags)

// The exported names. Aliases, so that the address hook_for() hands out is
// our own function even if another preloaded library exports the same name.
#define GPUPOOL_EXPORT_AS(name, field, type)                         \
  decltype(gpupool_hook_##name) gpupool_export_##name __asm__(#name) \
      __attribute__((visibility("default"), alias("gpupool_hook_" #name)));
GPUPOOL_CUDA_HOOKS(GPUPOOL_EXPORT_AS)
#undef GPUPOOL_EXPORT_AS

}  // extern "C"

namespace gpupool::cuda {

#define GPUPOOL_HOOK_ADDRESS(name, field, type) reinterpret_cast<const void*>(&gpupool_hook_##name),
const void* const kHookAddresses[] = {GPUPOOL_CUDA_HOOKS(GPUPOOL_HOOK_ADDRESS)};
#undef GPUPOOL_HOOK_ADDRESS

}  // namespace gpupool::cuda
