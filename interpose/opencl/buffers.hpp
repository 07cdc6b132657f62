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
  Props props;                // as given, with the terminating 0
  std::atomic<int> refs{0};   // the program's references
  std::atomic<int> holds{0};  // refs + live sub-buffers: 0 = back in the pool
  Buffer* parent = nullptr;   // sub-buffers
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>>
      callbacks;  // under callback_lock(this)
};

HandleMap<cl_mem, Buffer>& buffers();
// The lock of a buffer's destructor callbacks.
std::mutex& callback_lock(const Buffer* b);

// clCreateBuffer / clCreateBufferWithProperties (with_props) from the pool,
// or passed to the implementation for what the pool cannot serve invisibly.
cl_mem create_buffer(cl_context context, const cl_mem_properties* properties, bool with_props,
                     cl_mem_flags flags, size_t size, void* host_ptr, cl_int* errcode_ret);

// One hold of a buffer less (a reference, or a sub-buffer gone); at the last
// one its destructor callbacks run and its block goes back to the pool.
void drop_hold(Buffer* b);

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

// fork(): the buffer map's and callbacks' locks.
void buffers_fork_lock();
void buffers_fork_unlock();

}  // namespace gpupool::ocl
