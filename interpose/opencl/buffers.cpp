#include "interpose/opencl/buffers.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/fork_wait.hpp"
#include "core/hot_tls.hpp"
#include "interpose/node/node.hpp"
#include "interpose/opencl/unpooled.hpp"
#include "sys/log.hpp"

namespace gpupool::ocl {
namespace {

constexpr cl_mem_flags kPoolableFlags =
    CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR |
    CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

// ---------------------------------------------------------------------------
// The backend of one arena.

class BufferBackend final : public ClContextBackend {
 public:
  BufferBackend(std::shared_ptr<Ctx> ctx, cl_mem_flags flags, bool has_props, Props props,
                const config::Config& cfg, std::string group)
      : ClContextBackend(std::move(ctx), std::move(group), cfg),
        given_flags_(flags),
        real_flags_(flags & ~CL_MEM_COPY_HOST_PTR),
        has_props_(has_props),
        props_(std::move(props)),
        probe_(cfg.probe) {}

  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    const Api& api = next();
    cl_int err = CL_SUCCESS;
    cl_mem m = nullptr;
    if (has_props_) {
      if (!api.clCreateBufferWithProperties) return {BackendStatus::error, 0, CL_INVALID_OPERATION};
      m = api.clCreateBufferWithProperties(ctx_->handle, props_.data(), real_flags_, bytes, nullptr,
                                           &err);
    } else {
      m = api.clCreateBuffer(ctx_->handle, real_flags_, bytes, nullptr, &err);
    }
    if (!m) return {is_oom(err) ? BackendStatus::out_of_memory : BackendStatus::error, 0, err};
    if (probe_) {
      cl_int perr = probe(m, bytes);
      if (is_oom(perr)) {
        api.clReleaseMemObject(m);
        return {BackendStatus::out_of_memory, 0, perr};
      }
    }
    // The record, or nothing at all: a buffer the pool cannot track goes
    // back at once, and the failure on to the hook (which asks the
    // implementation alone).
    Buffer* record = nullptr;
    try {
      auto rec = std::make_unique<Buffer>();
      rec->mem = m;
      rec->ctx = ctx_;
      rec->flags = given_flags_;
      rec->has_props = has_props_;
      rec->props = props_;
      ctx_->state.buffers.put(m, rec.get());
      record = rec.release();
    } catch (...) {
      api.clReleaseMemObject(m);
      throw;
    }
    return {BackendStatus::ok, reinterpret_cast<Handle>(m), 0, record};
  }

  void release(Handle h, std::size_t, void*) override {
    cl_mem m = reinterpret_cast<cl_mem>(h);
    delete ctx_->state.buffers.take(m);
    if (!cl_gone()) next().clReleaseMemObject(m);
  }
  void drop(Handle h, std::size_t, void*) override {
    delete ctx_->state.buffers.take(reinterpret_cast<cl_mem>(h));
  }

 private:
  // Make the allocation real now, so out-of-memory is reported here.
  cl_int probe(cl_mem m, std::size_t bytes) {
    cl_command_queue q = internal_queue(*ctx_);
    if (!q) return CL_SUCCESS;
    const Api& api = next();
    cl_event ev = nullptr;
    cl_int err;
    if (ctx_->ocl12) {
      err = api.clEnqueueMigrateMemObjects(q, 1, &m, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0,
                                           nullptr, &ev);
    } else {
      // OpenCL 1.1 has no migrate (nor HOST_NO_ACCESS): a blocking write of
      // one byte from static storage.
      static const char zero = 0;
      err = api.clEnqueueWriteBuffer(q, m, CL_TRUE, 0, std::min<std::size_t>(1, bytes), &zero, 0,
                                     nullptr, &ev);
    }
    if (err != CL_SUCCESS) return err;
    if (!ev) return CL_SUCCESS;
    err = api.clWaitForEvents(1, &ev);
    cl_int st = CL_COMPLETE;
    api.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
    api.clReleaseEvent(ev);
    return st < 0 ? st : CL_SUCCESS;
  }

  cl_mem_flags given_flags_, real_flags_;
  bool has_props_;
  Props props_;
  bool probe_;
};

Arena* arena_for(Runtime& rt, const std::shared_ptr<Ctx>& ctx, cl_mem_flags flags, bool has_props,
                 const Props& props) {
  LockGuard lock(ctx->mu);
  for (auto& a : ctx->arenas)
    if (!a.svm && a.flags == flags && a.has_props == has_props && a.props == props) return a.arena;
  const config::Config& cfg = rt.config;
  const std::string group = memory_group(*ctx);
  auto backend = std::make_unique<BufferBackend>(ctx, flags, has_props, props, cfg, group);
  ArenaOptions o;
  o.kind = "opencl";
  o.group = group;
  o.name = fmt::format("opencl ctx {} dev {} flags {:#x}", ctx->ordinal, ctx->device_name, flags);
  o.device = wire::key_text(ctx->key);
  if (has_props) {
    o.name += " props";
    for (cl_mem_properties p : props) o.name += fmt::format(" {:#x}", p);
  }
  o.max_block = ctx->max_alloc;
  o.max_pooled = cfg.max_pooled.resolve(ctx->global_mem);
  o.max_held = cfg.max_held.resolve(ctx->global_mem);
  Arena* arena = rt.pool.add_arena(std::move(backend), std::move(o));
  ctx->arenas.push_back({flags, has_props, props, arena, false});
  node::add_device(rt, ctx->key, group, ctx->global_mem);
  return arena;
}

}  // namespace

ClContextBackend::ClContextBackend(std::shared_ptr<Ctx> ctx, std::string group,
                                   const config::Config& cfg)
    : ctx_(std::move(ctx)),
      group_(std::move(group)),
      immediate_(cfg.reuse == config::Reuse::immediate) {}

std::uint64_t ClContextBackend::fence() {
  return immediate_ ? 0 : ctx_->epoch.load(std::memory_order_seq_cst);
}

bool ClContextBackend::passed(std::uint64_t f) {
  if (f == 0 || ctx_->completed.load(std::memory_order_acquire) >= f) return true;
  if (!ctx_->solo.load(std::memory_order_relaxed)) return false;
  // Record the loan before confirming solo mode (seq_cst both sides): the
  // thread that ends solo mode then sees it (end_solo()).
  std::uint64_t lent = ctx_->solo_lent.load(std::memory_order_relaxed);
  while (lent < f && !ctx_->solo_lent.compare_exchange_weak(lent, f)) {
  }
  return ctx_->solo.load(std::memory_order_seq_cst);
}

void ClContextBackend::wait_all() { advance(*ctx_); }

bool ClContextBackend::relieve(std::size_t bytes) { return node::ask_neighbours(group_, bytes); }

std::string memory_group(const Ctx& ctx) {
  // The GPU when it has a UUID (every context on it draws on the same
  // memory), else the context's own.
  return ctx.has_uuid ? "opencl:" + wire::key_text(ctx.uuid)
                      : fmt::format("opencl:ctx{}", ctx.ordinal);
}

void block_back(Runtime& rt, Ctx& ctx, Block* b) {
  rt.pool.free(b);
  // Usually the context is open and another of its blocks is still out:
  // one atomic step, and ctx is not touched after it. (The caller's count
  // in ctx.active keeps ctx alive until then: the arenas whose backends own
  // it are retired only once none is active.)
  if (!ctx.closed.load()) {
    std::int64_t n = ctx.active.load(std::memory_order_relaxed);
    while (n > 1)
      if (ctx.active.compare_exchange_weak(n, n - 1)) return;
  }
  // Perhaps the last one, or the context is closing: kept alive to the end.
  const std::shared_ptr<Ctx> keep = ctx.shared_from_this();
  const bool last = ctx.active.fetch_sub(1) == 1;
  if (ctx.closed.load()) {
    // The program released the context already: nothing more is held for it.
    release_closed(rt, ctx);
    if (last) finish_ctx(rt, ctx);
  }
}

// Release what the pool holds for a context the program released. Under the
// context's lock: finish_ctx() may retire (and so destroy) its arenas.
void release_closed(Runtime& rt, Ctx& ctx) {
  LockGuard lock(ctx.mu);
  for (auto& a : ctx.arenas) rt.pool.release_held(a.arena);
}

// Retire a closed context's arenas once the program holds none of its
// buffers: nothing of it is left to release. The first caller takes them.
void finish_ctx(Runtime& rt, Ctx& ctx) {
  std::vector<Arena*> arenas;
  contexts_changed(ctx.state);
  {
    LockGuard lock(ctx.mu);
    for (auto& a : ctx.arenas) arenas.push_back(a.arena);
    ctx.arenas.clear();
  }
  for (Arena* a : arenas) rt.pool.release_held(a);
  for (Arena* a : arenas) rt.pool.retire_arena(a);
  OwnEvents evs;
  {
    LockGuard lock(ctx.mu);
    evs = take_own_events(ctx);
  }
  evs.release(next());
}

void buffer_died(Buffer* r) {
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>> cbs;
  // Most buffers have none: no lock then (each atomic read-modify-write
  // costs the H100's host tens of nanoseconds on every release).
  if (r->has_callbacks.load(std::memory_order_acquire)) {
    LockGuard lock(callback_lock(r));
    cbs.swap(r->callbacks);
    r->has_callbacks.store(false, std::memory_order_relaxed);
  }
  // Reverse order of registration, no gpupool lock held: they may call OpenCL.
  for (auto it = cbs.rbegin(); it != cbs.rend(); ++it) it->first(r->mem, it->second);

  Block* b = r->block;
  r->block = nullptr;
  // The pool may release the block (and its record) inside free(): take
  // what is needed from the record first.
  Ctx* ctx = r->ctx.get();
  Runtime* rt = runtime();
  if (!rt || !b) return;
  if (cl_gone() || b->arena->retired()) {
    const std::shared_ptr<Ctx> keep = r->ctx;  // forget() deletes the record
    // During exit: no driver call, the process is going away. A forked
    // parent's buffer (its arena retired in the child): not pooled here;
    // its real object is released as the program's release would have.
    const cl_mem m = r->mem;
    const bool gone = cl_gone();
    ctx->active.fetch_sub(1);
    rt->pool.forget(b);  // drops the record too
    if (!gone) next().clReleaseMemObject(m);
    return;
  }
  block_back(*rt, *ctx, b);
}

void drop_hold(Buffer* r) {
  if (static_cast<std::uint32_t>(r->counts.fetch_sub(1)) == 1) buffer_died(r);
}

// ---------------------------------------------------------------------------

namespace {

void CL_CALLBACK free_host_copy(cl_event, cl_int, void* p) { std::free(p); }

// COPY_HOST_PTR: the host data must be in the buffer's contents when create
// returns (host_ptr may be reused at once). A block whose fence passed is
// idle: a blocking write on gpupool's queue. A block reused by the solo rule
// (or GPUPOOL_REUSE=immediate) may still be read by older commands of the
// program's queue: the write goes on that queue, behind them, from a copy
// of the data, so it neither races them nor blocks on them.
cl_int write_initial(Ctx& ctx, const AllocResult& res, cl_mem m, size_t size, const void* host) {
  const Api& api = next();
  const Block& b = *res.block;
  const bool maybe_busy = res.hit && (b.fence == 0 || ctx.completed.load() < b.fence);
  if (maybe_busy) {
    cl_command_queue q = nullptr;
    {
      LockGuard lock(ctx.mu);
      q = ctx.solo_q ? ctx.solo_q : ctx.queues.size() == 1 ? ctx.queues[0]->q : nullptr;
      if (q) api.clRetainCommandQueue(q);
    }
    if (q) {
      cl_int err = CL_OUT_OF_HOST_MEMORY;
      if (void* copy = std::malloc(size)) {
        std::memcpy(copy, host, size);
        cl_event ev = nullptr;
        err = api.clEnqueueWriteBuffer(q, m, CL_FALSE, 0, size, copy, 0, nullptr, &ev);
        if (err == CL_SUCCESS && ev && api.clSetEventCallback &&
            api.clSetEventCallback(ev, CL_COMPLETE, free_host_copy, copy) == CL_SUCCESS) {
          copy = nullptr;
        } else if (err == CL_SUCCESS && ev) {
          api.clWaitForEvents(1, &ev);
        }
        if (ev) api.clReleaseEvent(ev);
        std::free(copy);
        if (api.clFlush) api.clFlush(q);
      }
      api.clReleaseCommandQueue(q);
      return err;
    }
  }
  cl_command_queue q = internal_queue(ctx);
  if (!q) return CL_OUT_OF_RESOURCES;
  return api.clEnqueueWriteBuffer(q, m, CL_TRUE, 0, size, host, 0, nullptr, nullptr);
}

bool parse_props(const cl_mem_properties* p, Props* out) {
  out->clear();
  if (!p) return true;
  for (int i = 0; i < 64; i += 2) {
    out->push_back(p[i]);
    if (p[i] == 0) return true;
    out->push_back(p[i + 1]);
  }
  return false;  // unterminated: let the implementation judge it
}

}  // namespace

namespace {

// This thread's last buffer request without properties (cache of
// create_buffer's lookups; contexts_generation() says when it is stale).
struct LastArena {
  cl_context context = nullptr;
  cl_mem_flags flags = 0;
  std::uint64_t generation = 0;
  Ctx* ctx = nullptr;
  Arena* arena = nullptr;
};
GPUPOOL_HOT_TLS LastArena t_last;

}  // namespace

cl_mem create_buffer(cl_context context, const cl_mem_properties* properties, bool with_props,
                     cl_mem_flags flags, size_t size, void* host_ptr, cl_int* errcode_ret) {
  const Api& api = next();
  auto passthrough = [&]() -> cl_mem {
    if (with_props) {
      if (!api.clCreateBufferWithProperties) {
        if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
        return nullptr;
      }
      return api.clCreateBufferWithProperties(context, properties, flags, size, host_ptr,
                                              errcode_ret);
    }
    return api.clCreateBuffer(context, flags, size, host_ptr, errcode_ret);
  };
  Runtime* rt = active_runtime();
  if (!rt) return passthrough();
  // What the pool cannot serve invisibly, and every error case, goes to the
  // implementation so the program sees its own answer.
  const bool copy = flags & CL_MEM_COPY_HOST_PTR;
  if (size == 0 || (flags & ~kPoolableFlags) || (copy != (host_ptr != nullptr)) ||
      (copy && (flags & (CL_MEM_HOST_NO_ACCESS | CL_MEM_HOST_READ_ONLY))))
    return passthrough();
  Props props;
  if (!parse_props(properties, &props)) return passthrough();
  const bool has_props = with_props && properties;
  // The context's record and arena: this thread's last ones when they still
  // serve (no lock), else looked up (the context map's and the context's
  // locks).
  Ctx* ctx = nullptr;
  Arena* arena = nullptr;
  State& st = *rt->opencl;
  const std::uint64_t generation = contexts_generation(st);
  if (!has_props && t_last.context == context && t_last.flags == flags &&
      t_last.generation == generation) {
    ctx = t_last.ctx;
    arena = t_last.arena;
  } else {
    std::shared_ptr<Ctx> record = ctx_for_buffer(st, context);
    if (!record) return passthrough();
    if (record->closed.load()) {
      // A forked child's (or a context released meanwhile): the
      // implementation's buffer, noted where the implementation was
      // inherited (unpooled.hpp).
      cl_mem m = passthrough();
      if (m && implementation_inherited()) note_unpooled(*rt, *record, m, size);
      return m;
    }
    std::call_once(record->info_once, [&] { load_info(*record); });
    if (!record->info_ok) return passthrough();
    arena = arena_for(*rt, record, flags, has_props, props);
    ctx = record.get();  // kept alive by the context map while the generation holds
    if (!has_props) t_last = {context, flags, generation, ctx, arena};
  }
  if (size > ctx->max_alloc) return passthrough();

  AllocResult res = rt->pool.allocate(arena, size);
  if (!res.block) {
    if (errcode_ret) *errcode_ret = res.error ? res.error : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return nullptr;
  }
  cl_mem m = reinterpret_cast<cl_mem>(res.block->handle);
  // The record lives as long as the block (BufferBackend::allocate).
  Buffer* r = static_cast<Buffer*>(res.block->data);
  r->block = res.block;
  r->requested = size;
  ctx->active.fetch_add(1);
  if (copy) {
    cl_int err = write_initial(*ctx, res, m, size, host_ptr);
    if (err != CL_SUCCESS) {
      r->counts.store(1);
      drop_hold(r);
      if (errcode_ret) *errcode_ret = err;
      return nullptr;
    }
  }
  r->counts.store(Buffer::kRef | 1, std::memory_order_release);
  if (errcode_ret) *errcode_ret = CL_SUCCESS;
  return m;
}

// A pooled, live buffer (nullptr for anything else).

Buffer* live_pooled(cl_mem m) {
  Buffer* r = find_buffer(m);
  return r && !r->sub && r->holds() > 0 ? r : nullptr;
}

bool out_of_range(const Buffer* r, size_t offset, size_t size) {
  return offset > r->requested || size > r->requested - offset;
}

cl_int put_info(void* value, size_t value_size, size_t* size_ret, const void* src, size_t n) {
  if (value) {
    if (value_size < n) return CL_INVALID_VALUE;
    if (n) std::memcpy(value, src, n);
  }
  if (size_ret) *size_ret = n;
  return CL_SUCCESS;
}

bool buffers_fork_lock(State& st) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (!st.buffers.lock_all() || !svm_fork_lock(st)) return false;
  for (CallbackLock& m : st.callback_locks)
    if (!fork_wait::take(m)) return false;
  return true;
}

void buffers_fork_unlock(State& st) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (CallbackLock& m : st.callback_locks) m.unlock();
  svm_fork_unlock(st);
  st.buffers.unlock_all();
}

}  // namespace gpupool::ocl
