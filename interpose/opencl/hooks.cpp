// The OpenCL entry points gpupool replaces (api.hpp's GPUPOOL_CL_HOOKED).
//
// Each hook is a hidden function gpupool_hook_<entry point>, exported under
// the entry point's own name (a program that bound to gpupool's export never
// went through a loader) and installed in the dispatch table a loader gets
// from the layer (layer.cpp). Either way it calls next(): whatever is not a
// pooled buffer goes to the implementation unchanged, so the program gets
// the implementation's own answers. A dispatch table without the entry (a
// loader older than the function) gets the loaders' answer for a function
// they lack, CL_INVALID_OPERATION, not a call through a null pointer. No
// exception of gpupool's reaches the program: a hook that fails inside
// gpupool (std::bad_alloc, say) makes the call to the implementation alone.
#include <cstring>
#include <memory>

#include "interpose/hook_scope.hpp"
#include "interpose/opencl/buffers.hpp"
#include "interpose/opencl/unpooled.hpp"

using namespace gpupool;
using namespace gpupool::ocl;

#define GPUPOOL_HOOK extern "C" __attribute__((visibility("hidden")))

// A hook's handler for a failure inside gpupool (see above): the call goes to
// the implementation alone, or gets `missing_answer` where the table lacks
// the entry.
#define GPUPOOL_CL_FALLBACK(entry, missing_answer, ...)                           \
  catch (...) {                                                                   \
    const HookScope hook_scope;                                                   \
    internal_failure(__func__);                                                   \
    const Api& fallback_api = next();                                             \
    return fallback_api.entry ? fallback_api.entry(__VA_ARGS__) : missing_answer; \
  }

namespace {

// A pointer-returning entry point the next table lacks.
std::nullptr_t missing(cl_int* errcode_ret) {
  if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
  return nullptr;
}

// The record of a sub-buffer `s` the implementation just made of the pooled
// buffer `root` (which it keeps active). Without memory for the record, the
// sub-buffer is released again and the program told so.
cl_mem record_sub(Buffer* root, cl_mem s, cl_int* errcode_ret) noexcept {
  try {
    auto r = std::make_unique<Buffer>();
    r->sub = true;
    r->mem = s;
    r->ctx = root->ctx;
    r->parent = root;
    r->counts.store(Buffer::kRef | 1);
    root->ctx->state.buffers.put(s, r.get());
    r.release();
    return s;
  } catch (...) {
    internal_failure("clCreateSubBuffer");
    next().clReleaseMemObject(s);
    drop_hold(root);
    if (errcode_ret) *errcode_ret = CL_OUT_OF_HOST_MEMORY;
    return nullptr;
  }
}

}  // namespace

// Passed on unchanged. Hooked so that, with the layer off (a loader without
// layers, GPUPOOL_OPENCL_LAYER=0), a process that only looks up the devices
// is known to have OpenCL initialised (next(), implementation_inherited):
// PoCL starts its device threads there, not in a child forked later.
GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clGetPlatformIDs(cl_uint n, cl_platform_id* platforms,
                                                              cl_uint* count) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clGetPlatformIDs) return CL_INVALID_OPERATION;
  return api.clGetPlatformIDs(n, platforms, count);
}
GPUPOOL_CL_FALLBACK(clGetPlatformIDs, CL_INVALID_OPERATION, n, platforms, count)

// As clGetPlatformIDs (a null platform makes the loader initialise, too).
GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clGetDeviceIDs(cl_platform_id platform,
                                                            cl_device_type type, cl_uint n,
                                                            cl_device_id* devices,
                                                            cl_uint* count) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clGetDeviceIDs) return CL_INVALID_OPERATION;
  return api.clGetDeviceIDs(platform, type, n, devices, count);
}
GPUPOOL_CL_FALLBACK(clGetDeviceIDs, CL_INVALID_OPERATION, platform, type, n, devices, count)

GPUPOOL_HOOK cl_context CL_API_CALL gpupool_hook_clCreateContext(
    const cl_context_properties* properties, cl_uint num_devices, const cl_device_id* devices,
    void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* user_data,
    cl_int* errcode_ret) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clCreateContext) {
    if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_context c =
      api.clCreateContext(properties, num_devices, devices, notify, user_data, errcode_ret);
  // In export mode the loader may have initialised the layer during this
  // very call: then the layer's hook registered the context already.
  if (c && &api == &next())
    if (Runtime* rt = active_runtime()) register_ctx(*rt->opencl, c);
  return c;
}
GPUPOOL_CL_FALLBACK(clCreateContext, missing(errcode_ret), properties, num_devices, devices, notify,
                    user_data, errcode_ret)

GPUPOOL_HOOK cl_context CL_API_CALL gpupool_hook_clCreateContextFromType(
    const cl_context_properties* properties, cl_device_type type,
    void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* user_data,
    cl_int* errcode_ret) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clCreateContextFromType) {
    if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_context c = api.clCreateContextFromType(properties, type, notify, user_data, errcode_ret);
  if (c && &api == &next())
    if (Runtime* rt = active_runtime()) register_ctx(*rt->opencl, c);
  return c;
}
GPUPOOL_CL_FALLBACK(clCreateContextFromType, missing(errcode_ret), properties, type, notify,
                    user_data, errcode_ret)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clRetainContext(cl_context c) try {
  const HookScope hook_scope;
  if (!next().clRetainContext) return CL_INVALID_OPERATION;
  cl_int err = next().clRetainContext(c);
  if (err == CL_SUCCESS)
    if (State* st = state())
      if (auto ctx = find_ctx(*st, c)) ctx->refs.fetch_add(1);
  return err;
}
GPUPOOL_CL_FALLBACK(clRetainContext, CL_INVALID_OPERATION, c)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clReleaseContext(cl_context c) try {
  const HookScope hook_scope;
  if (!next().clReleaseContext) return CL_INVALID_OPERATION;
  State* st = state();
  std::shared_ptr<Ctx> ctx = st ? find_ctx(*st, c) : nullptr;
  Runtime* rt = runtime();
  if (ctx && ctx->refs_known && ctx->refs.fetch_sub(1) == 1) {
    // The program's last reference: stop pooling for this context and give
    // back what gpupool holds, so the context can really die.
    ctx->closed.store(true);
    forget_ctx(ctx->state, c, ctx);
    if (rt && !cl_gone()) {
      cl_command_queue internal = nullptr;
      OwnEvents evs;
      {
        LockGuard lock(ctx->mu);
        internal = ctx->internal;
        ctx->internal = nullptr;
        ctx->internal_failed = true;
        evs = take_own_events(*ctx);
        ctx->solo.store(false);
        ctx->solo_q = nullptr;
      }
      release_closed(*rt, *ctx);
      // Its unpooled buffers (a forked child's) outlive it on their own
      // count, not on the pooled ones still out (a parent's, say).
      unpooled_context_finished(*rt, *ctx);
      if (ctx->active.load() == 0) finish_ctx(*rt, *ctx);
      const Api& api = next();
      evs.release(api);
      if (internal) api.clReleaseCommandQueue(internal);
    }
  }
  return next().clReleaseContext(c);
}
GPUPOOL_CL_FALLBACK(clReleaseContext, CL_INVALID_OPERATION, c)

GPUPOOL_HOOK cl_command_queue CL_API_CALL gpupool_hook_clCreateCommandQueue(
    cl_context c, cl_device_id d, cl_command_queue_properties props, cl_int* err) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clCreateCommandQueue) {
    if (err) *err = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_command_queue q = api.clCreateCommandQueue(c, d, props, err);
  if (q)
    if (Runtime* rt = active_runtime())
      track_queue(*rt->opencl, c, q, !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE));
  return q;
}
GPUPOOL_CL_FALLBACK(clCreateCommandQueue, missing(err), c, d, props, err)

GPUPOOL_HOOK cl_command_queue CL_API_CALL gpupool_hook_clCreateCommandQueueWithProperties(
    cl_context c, cl_device_id d, const cl_queue_properties* props, cl_int* err) try {
  const HookScope hook_scope;
  const Api& api = next();
  if (!api.clCreateCommandQueueWithProperties) {
    if (err) *err = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_command_queue q = api.clCreateCommandQueueWithProperties(c, d, props, err);
  cl_command_queue_properties qp = 0;
  for (int i = 0; props && props[i] && i < 64; i += 2)
    if (props[i] == CL_QUEUE_PROPERTIES) qp = props[i + 1];
  // Device-side queues take no host commands: their work completes with the
  // host-enqueued parent kernel, which the host queues cover.
  if (q && !(qp & CL_QUEUE_ON_DEVICE))
    if (Runtime* rt = active_runtime())
      track_queue(*rt->opencl, c, q, !(qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE));
  return q;
}
GPUPOOL_CL_FALLBACK(clCreateCommandQueueWithProperties, missing(err), c, d, props, err)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clRetainCommandQueue(cl_command_queue q) try {
  const HookScope hook_scope;
  if (!next().clRetainCommandQueue) return CL_INVALID_OPERATION;
  cl_int err = next().clRetainCommandQueue(q);
  if (err == CL_SUCCESS)
    if (Queue* qi = find_queue(q)) qi->refs.fetch_add(1);
  return err;
}
GPUPOOL_CL_FALLBACK(clRetainCommandQueue, CL_INVALID_OPERATION, q)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clReleaseCommandQueue(cl_command_queue q) try {
  const HookScope hook_scope;
  if (!next().clReleaseCommandQueue) return CL_INVALID_OPERATION;
  Queue* qi = find_queue(q);
  if (qi && qi->refs.fetch_sub(1) == 1) {
    Ctx& ctx = *qi->ctx;
    ctx.state.queues.take(q);
    const Api& api = next();
    {
      LockGuard lock(ctx.mu);
      std::erase(ctx.queues, qi);
      if (ctx.solo_q == q) end_solo(ctx);
      // Its commands may still use freed blocks: a marker stands in for it
      // at the next close.
      // (Not once the program released the context: nothing is pooled for
      // it any more, and the marker would keep it alive.)
      cl_event ev = nullptr;
      if (!cl_gone() && !ctx.closed.load() && api.clEnqueueMarkerWithWaitList &&
          api.clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev) == CL_SUCCESS && ev)
        ctx.departed.push_back(ev);
    }
    delete qi;
  }
  return next().clReleaseCommandQueue(q);
}
GPUPOOL_CL_FALLBACK(clReleaseCommandQueue, CL_INVALID_OPERATION, q)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clFinish(cl_command_queue q) try {
  const HookScope hook_scope;
  if (!next().clFinish) return CL_INVALID_OPERATION;
  Queue* qi = find_queue(q);
  if (!qi) return next().clFinish(q);
  Ctx& ctx = *qi->ctx;
  const std::uint64_t e = ctx.epoch.fetch_add(1, std::memory_order_seq_cst);
  cl_int err = next().clFinish(q);
  if (err != CL_SUCCESS || cl_gone()) return err;
  // Every command enqueued on q before this call is done; once all queues of
  // the context are known done past an epoch, so is every block freed in it.
  LockGuard lock(ctx.mu);
  qi->finished = std::max(qi->finished, e);
  if (!ctx.departed.empty() && !events_done(next(), ctx.departed)) return err;
  std::uint64_t all = e;
  for (Queue* x : ctx.queues) all = std::min(all, x->finished);
  raise_completed(ctx, all);
  return err;
}
GPUPOOL_CL_FALLBACK(clFinish, CL_INVALID_OPERATION, q)

GPUPOOL_HOOK cl_mem CL_API_CALL gpupool_hook_clCreateBuffer(cl_context c, cl_mem_flags flags,
                                                            size_t size, void* host,
                                                            cl_int* err) try {
  const HookScope hook_scope;
  if (!next().clCreateBuffer) return missing(err);
  return create_buffer(c, nullptr, false, flags, size, host, err);
}
GPUPOOL_CL_FALLBACK(clCreateBuffer, missing(err), c, flags, size, host, err)

GPUPOOL_HOOK cl_mem CL_API_CALL gpupool_hook_clCreateBufferWithProperties(
    cl_context c, const cl_mem_properties* props, cl_mem_flags flags, size_t size, void* host,
    cl_int* err) try {
  const HookScope hook_scope;
  if (!next().clCreateBufferWithProperties) return missing(err);
  return create_buffer(c, props, true, flags, size, host, err);
}
GPUPOOL_CL_FALLBACK(clCreateBufferWithProperties, missing(err), c, props, flags, size, host, err)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clRetainMemObject(cl_mem m) try {
  const HookScope hook_scope;
  if (!next().clRetainMemObject) return CL_INVALID_OPERATION;
  Buffer* r = find_buffer(m);
  if (!r) {
    const cl_int err = next().clRetainMemObject(m);
    if (err == CL_SUCCESS) unpooled_retained(m);
    return err;
  }
  if (r->holds() == 0 || r->refs() == 0) return CL_INVALID_MEM_OBJECT;
  // As release drops it: a buffer's reference with its hold, a
  // sub-buffer's alone (its holds stay 1; a hold added here would never be
  // dropped, and 2^32 of them would carry into the references).
  r->counts.fetch_add(r->sub ? Buffer::kRef : Buffer::kRef | 1);
  return CL_SUCCESS;
}
GPUPOOL_CL_FALLBACK(clRetainMemObject, CL_INVALID_OPERATION, m)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clReleaseMemObject(cl_mem m) try {
  const HookScope hook_scope;
  if (!next().clReleaseMemObject) return CL_INVALID_OPERATION;
  Buffer* r = find_buffer(m);
  if (!r) return release_unpooled(m);
  // A buffer's reference holds its block; a sub-buffer's record holds its
  // parent's (dropped below), not its own.
  const std::uint64_t drop = r->sub ? Buffer::kRef : Buffer::kRef | 1;
  std::uint64_t c = r->counts.load();
  do {
    if ((c >> 32) == 0) return CL_INVALID_MEM_OBJECT;
  } while (!r->counts.compare_exchange_weak(c, c - drop));
  // The release is gpupool's from here: a failure inside gpupool must not
  // fall back to the implementation's release (below), which would release
  // a block the pool holds, or a sub-buffer already released.
  cl_int err = CL_SUCCESS;
  try {
    if (!r->sub) {
      if (static_cast<std::uint32_t>(c - drop) == 0) buffer_died(r);
    } else if ((c >> 32) == 1) {
      // A sub-buffer is a real object of its own: release it for real, then
      // let go of the parent it kept active.
      Buffer* parent = r->parent;
      r->ctx->state.buffers.take(m);
      err = next().clReleaseMemObject(m);
      delete r;
      drop_hold(parent);
    }
  } catch (...) {
    internal_failure(__func__);
  }
  return err;
}
GPUPOOL_CL_FALLBACK(clReleaseMemObject, CL_INVALID_OPERATION, m)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clGetMemObjectInfo(cl_mem m, cl_mem_info what,
                                                                size_t size, void* value,
                                                                size_t* size_ret) try {
  const HookScope hook_scope;
  if (!next().clGetMemObjectInfo) return CL_INVALID_OPERATION;
  Buffer* r = find_buffer(m);
  if (!r) return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  if (r->refs() == 0) return CL_INVALID_MEM_OBJECT;
  if (what == CL_MEM_REFERENCE_COUNT) {
    const cl_uint n = r->refs();
    return put_info(value, size, size_ret, &n, sizeof n);
  }
  if (r->sub) {
    if (what == CL_MEM_FLAGS) {
      // The real parent lacks COPY_HOST_PTR; the program's has it.
      cl_mem_flags f = 0;
      cl_int err = next().clGetMemObjectInfo(m, what, sizeof f, &f, nullptr);
      if (err != CL_SUCCESS) return err;
      f |= r->parent->flags & CL_MEM_COPY_HOST_PTR;
      return put_info(value, size, size_ret, &f, sizeof f);
    }
    return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  }
  switch (what) {
    case CL_MEM_SIZE: {
      const size_t n = r->requested;
      return put_info(value, size, size_ret, &n, sizeof n);
    }
    case CL_MEM_FLAGS:
      return put_info(value, size, size_ret, &r->flags, sizeof r->flags);
    case CL_MEM_PROPERTIES:
      return put_info(value, size, size_ret, r->props.data(),
                      r->has_props ? r->props.size() * sizeof(cl_mem_properties) : 0);
    default:
      return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  }
}
GPUPOOL_CL_FALLBACK(clGetMemObjectInfo, CL_INVALID_OPERATION, m, what, size, value, size_ret)

GPUPOOL_HOOK cl_mem CL_API_CALL gpupool_hook_clCreateSubBuffer(cl_mem b, cl_mem_flags flags,
                                                               cl_buffer_create_type type,
                                                               const void* info,
                                                               cl_int* errcode_ret) try {
  const HookScope hook_scope;
  if (!next().clCreateSubBuffer) return missing(errcode_ret);
  Buffer* parent = find_buffer(b);
  if (!parent) return next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
  if (parent->sub) {
    // A sub-buffer of a sub-buffer: the implementation decides (PoCL refuses,
    // NVIDIA 580 accepts); one it makes keeps the pooled block active too.
    Buffer* root = parent->parent;
    root->counts.fetch_add(1);
    cl_mem s = next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
    if (!s) {
      drop_hold(root);
      return nullptr;
    }
    return record_sub(root, s, errcode_ret);
  }
  if (parent->refs() == 0) {
    if (errcode_ret) *errcode_ret = CL_INVALID_MEM_OBJECT;
    return nullptr;
  }
  // The real buffer is larger: check the region against the program's size.
  if (type == CL_BUFFER_CREATE_TYPE_REGION && info) {
    const auto* reg = static_cast<const cl_buffer_region*>(info);
    if (reg->size != 0 && out_of_range(parent, reg->origin, reg->size)) {
      if (errcode_ret) *errcode_ret = CL_INVALID_VALUE;
      return nullptr;
    }
  }
  parent->counts.fetch_add(1);
  cl_mem s = next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
  if (!s) {
    drop_hold(parent);
    return nullptr;
  }
  return record_sub(parent, s, errcode_ret);
}
GPUPOOL_CL_FALLBACK(clCreateSubBuffer, missing(errcode_ret), b, flags, type, info, errcode_ret)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clSetMemObjectDestructorCallback(
    cl_mem m, void(CL_CALLBACK* fn)(cl_mem, void*), void* ud) try {
  const HookScope hook_scope;
  if (!next().clSetMemObjectDestructorCallback) return CL_INVALID_OPERATION;
  Buffer* r = find_buffer(m);
  if (!r || r->sub) return next().clSetMemObjectDestructorCallback(m, fn, ud);
  if (r->refs() == 0) return CL_INVALID_MEM_OBJECT;
  if (!fn) return CL_INVALID_VALUE;
  LockGuard lock(callback_lock(r));
  r->callbacks.emplace_back(fn, ud);
  r->has_callbacks.store(true, std::memory_order_release);
  return CL_SUCCESS;
}
GPUPOOL_CL_FALLBACK(clSetMemObjectDestructorCallback, CL_INVALID_OPERATION, m, fn, ud)

// Bounds the padding would hide: the implementation checks against the real
// (rounded) size, gpupool against the size the program asked for.
GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clEnqueueReadBuffer(cl_command_queue q, cl_mem b,
                                                                 cl_bool blocking, size_t offset,
                                                                 size_t size, void* ptr, cl_uint n,
                                                                 const cl_event* wait,
                                                                 cl_event* ev) try {
  const HookScope hook_scope;
  if (!next().clEnqueueReadBuffer) return CL_INVALID_OPERATION;
  if (Buffer* r = live_pooled(b); r && ptr && out_of_range(r, offset, size))
    return CL_INVALID_VALUE;
  return next().clEnqueueReadBuffer(q, b, blocking, offset, size, ptr, n, wait, ev);
}
GPUPOOL_CL_FALLBACK(clEnqueueReadBuffer, CL_INVALID_OPERATION, q, b, blocking, offset, size, ptr, n,
                    wait, ev)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clEnqueueWriteBuffer(cl_command_queue q, cl_mem b,
                                                                  cl_bool blocking, size_t offset,
                                                                  size_t size, const void* ptr,
                                                                  cl_uint n, const cl_event* wait,
                                                                  cl_event* ev) try {
  const HookScope hook_scope;
  if (!next().clEnqueueWriteBuffer) return CL_INVALID_OPERATION;
  if (Buffer* r = live_pooled(b); r && ptr && out_of_range(r, offset, size))
    return CL_INVALID_VALUE;
  return next().clEnqueueWriteBuffer(q, b, blocking, offset, size, ptr, n, wait, ev);
}
GPUPOOL_CL_FALLBACK(clEnqueueWriteBuffer, CL_INVALID_OPERATION, q, b, blocking, offset, size, ptr,
                    n, wait, ev)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clEnqueueCopyBuffer(cl_command_queue q, cl_mem src,
                                                                 cl_mem dst, size_t so, size_t dof,
                                                                 size_t size, cl_uint n,
                                                                 const cl_event* wait,
                                                                 cl_event* ev) try {
  const HookScope hook_scope;
  if (!next().clEnqueueCopyBuffer) return CL_INVALID_OPERATION;
  Buffer* rs = live_pooled(src);
  Buffer* rd = live_pooled(dst);
  if ((rs && out_of_range(rs, so, size)) || (rd && out_of_range(rd, dof, size)))
    return CL_INVALID_VALUE;
  return next().clEnqueueCopyBuffer(q, src, dst, so, dof, size, n, wait, ev);
}
GPUPOOL_CL_FALLBACK(clEnqueueCopyBuffer, CL_INVALID_OPERATION, q, src, dst, so, dof, size, n, wait,
                    ev)

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clEnqueueFillBuffer(cl_command_queue q, cl_mem b,
                                                                 const void* pattern, size_t psize,
                                                                 size_t offset, size_t size,
                                                                 cl_uint n, const cl_event* wait,
                                                                 cl_event* ev) try {
  const HookScope hook_scope;
  if (!next().clEnqueueFillBuffer) return CL_INVALID_OPERATION;
  if (Buffer* r = live_pooled(b); r && pattern && psize && out_of_range(r, offset, size))
    return CL_INVALID_VALUE;
  return next().clEnqueueFillBuffer(q, b, pattern, psize, offset, size, n, wait, ev);
}
GPUPOOL_CL_FALLBACK(clEnqueueFillBuffer, CL_INVALID_OPERATION, q, b, pattern, psize, offset, size,
                    n, wait, ev)

GPUPOOL_HOOK void* CL_API_CALL gpupool_hook_clEnqueueMapBuffer(
    cl_command_queue q, cl_mem b, cl_bool blocking, cl_map_flags mf, size_t offset, size_t size,
    cl_uint n, const cl_event* wait, cl_event* ev, cl_int* errcode_ret) try {
  const HookScope hook_scope;
  if (!next().clEnqueueMapBuffer) return missing(errcode_ret);
  if (Buffer* r = live_pooled(b); r && out_of_range(r, offset, size)) {
    if (errcode_ret) *errcode_ret = CL_INVALID_VALUE;
    return nullptr;
  }
  return next().clEnqueueMapBuffer(q, b, blocking, mf, offset, size, n, wait, ev, errcode_ret);
}
GPUPOOL_CL_FALLBACK(clEnqueueMapBuffer, missing(errcode_ret), q, b, blocking, mf, offset, size, n,
                    wait, ev, errcode_ret)

GPUPOOL_HOOK void* CL_API_CALL gpupool_hook_clSVMAlloc(cl_context c, cl_svm_mem_flags flags,
                                                       size_t size, cl_uint alignment) try {
  const HookScope hook_scope;
  if (!next().clSVMAlloc) return nullptr;
  return svm_alloc(c, flags, size, alignment);
}
GPUPOOL_CL_FALLBACK(clSVMAlloc, nullptr, c, flags, size, alignment)

// No fallback to the implementation here: a pooled pointer must never reach
// its clSVMFree while the pool has it (svm_free allocates nothing).
GPUPOOL_HOOK void CL_API_CALL gpupool_hook_clSVMFree(cl_context c, void* p) try {
  const HookScope hook_scope;
  if (next().clSVMFree) svm_free(c, p);
} catch (...) {
  const HookScope hook_scope;
  internal_failure(__func__);
}

GPUPOOL_HOOK cl_int CL_API_CALL gpupool_hook_clEnqueueSVMFree(
    cl_command_queue q, cl_uint n, void* pointers[],
    void(CL_CALLBACK* free_func)(cl_command_queue, cl_uint, void*[], void*), void* user_data,
    cl_uint waits, const cl_event* wait_list, cl_event* event) try {
  const HookScope hook_scope;
  if (!next().clEnqueueSVMFree) return CL_INVALID_OPERATION;
  return svm_enqueue_free(q, n, pointers, free_func, user_data, waits, wait_list, event);
} catch (...) {
  const HookScope hook_scope;
  internal_failure(__func__);
  return CL_OUT_OF_HOST_MEMORY;
}

// The exported names: aliases, so that the address the layer and a program
// get is gpupool's own function even if another preloaded library exports
// the same name.
#define GPUPOOL_CL_EXPORT(name)                                                 \
  extern "C" decltype(gpupool_hook_##name) gpupool_export_##name __asm__(#name) \
      __attribute__((visibility("default"), alias("gpupool_hook_" #name)));
GPUPOOL_CL_HOOKED(GPUPOOL_CL_EXPORT)
#undef GPUPOOL_CL_EXPORT
