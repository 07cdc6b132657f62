// OpenCL buffers from the pool, keeping OpenCL's semantics.
//
// - One arena per (context, flags as given, properties as given): those are
//   what CL_MEM_FLAGS / CL_MEM_PROPERTIES report, so only identical requests
//   share blocks. A COPY_HOST_PTR arena's blocks are created without the flag
//   (the host data is shorter than the rounded block) and written before the
//   buffer is returned.
// - The program's handle is the block's real cl_mem. gpupool keeps one real
//   reference and counts the program's own; at the program's last release
//   (and after its sub-buffers are gone) the block goes back to the pool.
//   Queries that would show the trick (size, flags, properties, reference
//   count) and bounds checks the padding would hide are answered by the
//   hooks (hooks.cpp) from the buffer's record.
// - Availability probe: a fresh block is migrated (CONTENT_UNDEFINED) on the
//   context's internal queue and waited for, so out-of-memory shows at
//   create time, where the pool releases held blocks and retries.
#pragma once

#include <atomic>
#include <mutex>
#include <utility>
#include <vector>

#include "interpose/opencl/contexts.hpp"

namespace gpupool::ocl {

// A pooled buffer (one per block, kept while the pool has the block) or a
// sub-buffer of one.
struct Buffer {
  bool sub = false;
  cl_mem mem = nullptr;
  std::shared_ptr<Ctx> ctx;
  Block* block = nullptr;  // while the program holds it
  std::size_t requested = 0;
  cl_mem_flags flags = 0;  // as given
  bool has_props = false;
  Props props;  // as given, with the terminating 0
  // The program's references (high half) and the holds on the block (low
  // half: the references plus live sub-buffers; 0 = back in the pool), in
  // one word so that a release drops a reference and its hold in one atomic
  // operation (each costs the H100's host 8-17 ns).
  static constexpr std::uint64_t kRef = std::uint64_t{1} << 32;
  std::atomic<std::uint64_t> counts{0};
  std::uint32_t refs() const { return static_cast<std::uint32_t>(counts.load() >> 32); }
  std::uint32_t holds() const {
    return static_cast<std::uint32_t>(counts.load(std::memory_order_acquire));
  }
  Buffer* parent = nullptr;  // sub-buffers
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>>
      callbacks;                           // under callback_lock(this)
  std::atomic<bool> has_callbacks{false};  // callbacks is not empty
};

// The record of m, if it is a pooled buffer or a sub-buffer of one.
inline Buffer* find_buffer(cl_mem m) {
  State* st = state();
  return st ? st->buffers.find(m) : nullptr;
}

// What the arenas of one context have in common (buffers, SVM): blocks are
// fenced by the context's queues (contexts.hpp), and on out-of-memory the
// node's other processes on the same GPU are asked.
class ClContextBackend : public Backend {
 public:
  ClContextBackend(std::shared_ptr<Ctx> ctx, std::string group, const config::Config& cfg);
  std::uint64_t fence() override;
  bool passed(std::uint64_t f) override;
  void wait_all() override;
  bool relieve(std::size_t bytes) override;

 protected:
  std::shared_ptr<Ctx> ctx_;
  std::string group_;
  bool immediate_;  // GPUPOOL_REUSE=immediate: no fences
};

// The pool group of a context's memory: its GPU's when the device has a
// UUID, else the context's own.
std::string memory_group(const Ctx& ctx);

// A pooled block of ctx's the program let go of goes back to the pool; a
// context the program released finishes once none of its blocks is left.
void block_back(Runtime& rt, Ctx& ctx, Block* b);
// The lock of a buffer's destructor callbacks.
using CallbackLock = Ranked<LockRank::opencl_callbacks>;
inline CallbackLock& callback_lock(const Buffer* b) {
  return b->ctx->state
      .callback_locks[(reinterpret_cast<std::uintptr_t>(b) >> 6) % State::kCallbackLocks];
}

// clCreateBuffer / clCreateBufferWithProperties (with_props) from the pool,
// or passed to the implementation for what the pool cannot serve invisibly.
cl_mem create_buffer(cl_context context, const cl_mem_properties* properties, bool with_props,
                     cl_mem_flags flags, size_t size, void* host_ptr, cl_int* errcode_ret);

// One hold of a buffer less (a reference, or a sub-buffer gone); at the last
// one, buffer_died().
void drop_hold(Buffer* b);
// The last hold of a pooled buffer is gone: its destructor callbacks run and
// its block goes back to the pool.
void buffer_died(Buffer* b);

// A pooled, live buffer (nullptr for anything else).
Buffer* live_pooled(cl_mem m);
// [offset, offset + size) reaches past the size the program asked for.
bool out_of_range(const Buffer* b, size_t offset, size_t size);
// clGet*Info's copy-out rule.
cl_int put_info(void* value, size_t value_size, size_t* size_ret, const void* src, size_t n);

// The program released a context: release what the pool holds for it, and
// once it holds none of its buffers, retire its arenas.
void release_closed(Runtime& rt, Ctx& ctx);
void finish_ctx(Runtime& rt, Ctx& ctx);

// Shared virtual memory (svm.cpp): clSVMAlloc, clSVMFree and
// clEnqueueSVMFree from the pool, or passed to the implementation.
void* svm_alloc(cl_context context, cl_svm_mem_flags flags, size_t size, cl_uint alignment);
void svm_free(cl_context context, void* p);
cl_int svm_enqueue_free(cl_command_queue q, cl_uint n, void* pointers[],
                        void(CL_CALLBACK* free_func)(cl_command_queue, cl_uint, void*[], void*),
                        void* user_data, cl_uint waits, const cl_event* wait_list, cl_event* event);
bool svm_fork_lock(State& st);  // false: gave up (core/fork_wait.hpp)
void svm_fork_unlock(State& st);

// fork(): the buffer map's and callbacks' locks; false: gave up
// (core/fork_wait.hpp).
bool buffers_fork_lock(State& st);
void buffers_fork_unlock(State& st);

}  // namespace gpupool::ocl
