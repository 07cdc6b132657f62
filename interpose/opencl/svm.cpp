// OpenCL shared virtual memory from the pool (clSVMAlloc, clSVMFree,
// clEnqueueSVMFree).
//
// - Coarse-grained SVM buffers of the default alignment are pooled, one
//   arena per (context, flags); fine-grained buffers and atomics (what they
//   promise about the memory is the implementation's), explicit alignments,
//   size 0 and sizes over the device maximum go to the implementation, which
//   answers them (NULL for what it refuses). A pooled block is a real
//   clSVMAlloc pointer: kernels, maps and copies use it unchanged.
// - A freed block waits for the context's queues like a buffer (the spec
//   makes the program wait for its own commands before clSVMFree; the fence
//   also covers a block freed by clEnqueueSVMFree on another queue).
// - clEnqueueSVMFree without a callback of the program's gets gpupool's:
//   when the command runs, pooled pointers go back to the pool and the
//   others to the implementation's clSVMFree. With the program's callback,
//   the program frees them itself (through clSVMFree, so the pool's).
#include <memory>

#include <fmt/format.h>

#include "interpose/hook_scope.hpp"
#include "interpose/node/node.hpp"
#include "interpose/opencl/buffers.hpp"
#include "sys/log.hpp"

namespace gpupool::ocl {

// A pooled SVM block (State::svm), kept while the pool has it.
struct SvmBlock {
  std::shared_ptr<Ctx> ctx;
  std::atomic<Block*> block{nullptr};  // while the program holds it
};

namespace {

constexpr cl_svm_mem_flags kAccess = CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY;

class SvmBackend final : public ClContextBackend {
 public:
  SvmBackend(std::shared_ptr<Ctx> ctx, cl_svm_mem_flags flags, const config::Config& cfg,
             std::string group)
      : ClContextBackend(std::move(ctx), std::move(group), cfg), flags_(flags) {}

  // clSVMAlloc gives no reason for a NULL: the request was checked before
  // (flags, size, alignment), so the reason is taken to be memory.
  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    const Api& api = next();
    void* p = api.clSVMAlloc(ctx_->handle, flags_, bytes, 0);
    if (!p) return {BackendStatus::out_of_memory, 0, 0};
    SvmBlock* record = nullptr;
    try {
      auto rec = std::make_unique<SvmBlock>();
      rec->ctx = ctx_;
      ctx_->state.svm.put(p, rec.get());
      record = rec.release();
    } catch (...) {
      api.clSVMFree(ctx_->handle, p);
      throw;
    }
    return {BackendStatus::ok, reinterpret_cast<Handle>(p), 0, record};
  }

  void release(Handle h, std::size_t, void*) override {
    void* p = reinterpret_cast<void*>(h);
    delete ctx_->state.svm.take(p);
    if (!cl_gone()) next().clSVMFree(ctx_->handle, p);
  }
  void drop(Handle h, std::size_t, void*) override {
    delete ctx_->state.svm.take(reinterpret_cast<void*>(h));
  }

 private:
  cl_svm_mem_flags flags_;
};

Arena* svm_arena(Runtime& rt, const std::shared_ptr<Ctx>& ctx, cl_svm_mem_flags flags) {
  LockGuard lock(ctx->mu);
  for (auto& a : ctx->arenas)
    if (a.svm && a.flags == flags) return a.arena;
  const config::Config& cfg = rt.config;
  const std::string group = memory_group(*ctx);
  ArenaOptions o;
  o.kind = "opencl-svm";
  o.group = group;
  o.name =
      fmt::format("opencl svm ctx {} dev {} flags {:#x}", ctx->ordinal, ctx->device_name, flags);
  o.device = wire::key_text(ctx->key);
  o.max_block = ctx->max_alloc;
  o.max_pooled = cfg.max_pooled.resolve(ctx->global_mem);
  o.max_held = cfg.max_held.resolve(ctx->global_mem);
  Arena* arena =
      rt.pool.add_arena(std::make_unique<SvmBackend>(ctx, flags, cfg, group), std::move(o));
  ctx->arenas.push_back({flags, false, {}, arena, true});
  node::add_device(rt, ctx->key, group, ctx->global_mem);
  return arena;
}

// The implementation's clEnqueueSVMFree callback when the program gave none.
void CL_CALLBACK free_enqueued(cl_command_queue, cl_uint n, void* pointers[], void* context) {
  const HookScope hook_scope;  // on the implementation's thread
  for (cl_uint i = 0; i < n; ++i) svm_free(static_cast<cl_context>(context), pointers[i]);
}

}  // namespace

void* svm_alloc(cl_context context, cl_svm_mem_flags flags, size_t size, cl_uint alignment) {
  const Api& api = next();
  auto pass = [&] { return api.clSVMAlloc(context, flags, size, alignment); };
  Runtime* rt = active_runtime();
  const cl_svm_mem_flags access = flags & kAccess;
  if (!rt || size == 0 || alignment != 0 || (flags & ~kAccess) || (access & (access - 1)))
    return pass();
  std::shared_ptr<Ctx> ctx = ctx_for_buffer(*rt->opencl, context);
  if (!ctx || ctx->closed.load()) return pass();
  std::call_once(ctx->info_once, [&] { load_info(*ctx); });
  if (!ctx->info_ok || !ctx->svm || size > ctx->max_alloc) return pass();
  // 0 means CL_MEM_READ_WRITE: one arena for both.
  const AllocResult res =
      rt->pool.allocate(svm_arena(*rt, ctx, access ? access : CL_MEM_READ_WRITE), size);
  if (!res.block) return nullptr;
  void* p = reinterpret_cast<void*>(res.block->handle);
  // The record lives as long as the block (SvmBackend::allocate).
  SvmBlock* r = static_cast<SvmBlock*>(res.block->data);
  ctx->active.fetch_add(1);
  r->block.store(res.block, std::memory_order_release);
  return p;
}

void svm_free(cl_context context, void* p) {
  State* st = p ? state() : nullptr;
  SvmBlock* r = st ? st->svm.find(p) : nullptr;
  if (!r) {
    if (next().clSVMFree) next().clSVMFree(context, p);
    return;
  }
  // Ours and already free (a double free): nothing for the implementation,
  // which would free memory the pool holds.
  Block* b = r->block.exchange(nullptr, std::memory_order_acq_rel);
  if (!b) return;
  Ctx* ctx = r->ctx.get();  // block_back: the pool may delete the record
  Runtime* rt = runtime();
  if (!rt) return;
  if (cl_gone() || b->arena->retired()) {
    const std::shared_ptr<Ctx> keep = r->ctx;  // forget() deletes the record
    // As for buffers (buffers.cpp): during exit nothing is called; a forked
    // parent's block is freed as the program asked.
    const bool gone = cl_gone();
    ctx->active.fetch_sub(1);
    rt->pool.forget(b);
    if (!gone && next().clSVMFree) next().clSVMFree(ctx->handle, p);
    return;
  }
  block_back(*rt, *ctx, b);
}

cl_int svm_enqueue_free(cl_command_queue q, cl_uint n, void* pointers[],
                        void(CL_CALLBACK* free_func)(cl_command_queue, cl_uint, void*[], void*),
                        void* user_data, cl_uint waits, const cl_event* wait_list,
                        cl_event* event) {
  const Api& api = next();
  State* st = state();
  bool pooled = false;
  for (cl_uint i = 0; st && pointers && i < n && !pooled; ++i)
    pooled = pointers[i] && st->svm.find(pointers[i]);
  cl_context context = nullptr;
  if (!pooled || free_func || !api.clGetCommandQueueInfo ||
      api.clGetCommandQueueInfo(q, CL_QUEUE_CONTEXT, sizeof context, &context, nullptr) !=
          CL_SUCCESS)
    return api.clEnqueueSVMFree(q, n, pointers, free_func, user_data, waits, wait_list, event);
  // The queue keeps its context alive until the command has run.
  return api.clEnqueueSVMFree(q, n, pointers, free_enqueued, context, waits, wait_list, event);
}

bool svm_fork_lock(State& st) { return st.svm.lock_all(); }
void svm_fork_unlock(State& st) { st.svm.unlock_all(); }

}  // namespace gpupool::ocl
