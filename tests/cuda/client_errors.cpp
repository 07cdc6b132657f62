// Scenarios of what the driver answers: its error codes, pointer queries
// and out of memory, pooled or not.
#include <stdio.h>
#include <stdlib.h>

#include "client.hpp"

namespace client {

// The driver's error codes, pooled or not.
void scenario_errors() {
  CUdeviceptr p = 0;
  CHECK_EQ(api.mem_alloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
  CUcontext ctx = setup();

  p = 0xdead;
  CHECK_EQ(api.mem_alloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(p, 0u);
  CHECK_EQ(api.mem_alloc(nullptr, 16), CUDA_ERROR_INVALID_VALUE);
  p = 0xdead;
  CHECK_EQ(api.mem_alloc(&p, size_t{1} << 50), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.mem_alloc(&p, SIZE_MAX), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.mem_free(0), CUDA_SUCCESS);
  CHECK_EQ(api.mem_free(0x1000), CUDA_ERROR_INVALID_VALUE);

  OK(api.mem_alloc(&p, 1000));
  CHECK_EQ(api.mem_free(p + 8), CUDA_ERROR_INVALID_VALUE);     // interior
  CHECK_EQ(api.mem_free(p + 1000), CUDA_ERROR_INVALID_VALUE);  // past the end (padding)
  OK(api.mem_free(p));
  CHECK_EQ(api.mem_free(p), CUDA_ERROR_INVALID_VALUE);  // double free (held block)
  CHECK_EQ(api.mem_free(p), CUDA_ERROR_INVALID_VALUE);

  void* h = reinterpret_cast<void*>(0xdead);
  CHECK_EQ(api.mem_alloc_host(&h, 0), CUDA_SUCCESS);
  CHECK(h == nullptr);
  h = reinterpret_cast<void*>(0xdead);
  CHECK_EQ(api.host_alloc(&h, 0, 0), CUDA_SUCCESS);
  CHECK(h == nullptr);
  CHECK_EQ(api.host_alloc(&h, 4096, 0x80), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.host_alloc(nullptr, 4096, 0), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.host_alloc(&h, size_t{1} << 50, 0), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(api.free_host(nullptr), CUDA_SUCCESS);
  void* m = malloc(64);
  CHECK_EQ(api.free_host(m), CUDA_ERROR_INVALID_VALUE);
  free(m);

  OK(api.host_alloc(&h, 4096, 0));
  OK(api.mem_alloc(&p, 4096));
  CHECK_EQ(api.mem_free(reinterpret_cast<CUdeviceptr>(h)), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(reinterpret_cast<void*>(p)), CUDA_ERROR_INVALID_VALUE);
  CHECK_EQ(api.free_host(static_cast<char*>(h) + 16), CUDA_ERROR_INVALID_VALUE);
  OK(api.free_host(h));
  CHECK_EQ(api.free_host(h), CUDA_ERROR_INVALID_VALUE);  // double free (held block)
  OK(api.mem_free(p));

  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_EQ(api.address_range(&base, &size, 0x1000), CUDA_ERROR_NOT_FOUND);
  int ord = 0;
  CHECK_EQ(api.ptr_attr(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 0x1000),
           CUDA_ERROR_INVALID_VALUE);

  // No current context.
  CUcontext popped = nullptr;
  OK(api.ctx_pop(&popped));
  CHECK(popped == ctx);
  CHECK_EQ(api.mem_alloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(api.host_alloc(&h, 4096, 0), CUDA_ERROR_INVALID_CONTEXT);
  CHECK_EQ(api.mem_alloc_host(&h, 4096), CUDA_ERROR_INVALID_CONTEXT);
  size_t fr = 0, tot = 0;
  CHECK_EQ(api.get_info(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
  OK(api.ctx_push(ctx));
  // Freeing a valid pointer needs no current context (measured).
  CUdeviceptr keep = 0;
  void* keep_host = nullptr;
  OK(api.mem_alloc(&keep, 6000));
  OK(api.host_alloc(&keep_host, 6000, 0));
  OK(api.ctx_pop(&popped));
  OK(api.mem_free(keep));
  OK(api.free_host(keep_host));
  OK(api.ctx_push(ctx));
  OK(api.ctx_sync());
  OK(api.mem_alloc(&keep, 6000));  // and the block is usable again
  fill(keep, 6000, 1);
  OK(api.mem_free(keep));

  // Any other driver error comes back unchanged.
  api.fail_next("cuMemAlloc_v2", 1, CUDA_ERROR_UNKNOWN);
  CHECK_EQ(api.mem_alloc(&p, 12345), CUDA_ERROR_UNKNOWN);
  api.fail_next("cuMemHostAlloc", 1, CUDA_ERROR_INVALID_DEVICE);
  CHECK_EQ(api.host_alloc(&h, 12345, 0), CUDA_ERROR_INVALID_DEVICE);
}

// What pointer queries report for pooled blocks: the requested size, a new
// buffer id per allocation, and "unallocated" for free blocks and padding.
void scenario_ptrattr() {
  CUcontext ctx = setup();
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, 1000));
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(api.address_range(&base, &size, p + 10));
  CHECK_EQ(base, p);
  CHECK_EQ(size, 1000u);
  OK(api.address_range(nullptr, &size, p));
  CHECK_EQ(size, 1000u);
  CHECK_EQ(api.address_range(&base, &size, p + 1000), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.address_range(&base, &size, p + 1001), CUDA_ERROR_NOT_FOUND);

  size_t range = 0;
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 5));
  CHECK_EQ(range, 1000u);
  CUdeviceptr start = 0;
  OK(api.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 5));
  CHECK_EQ(start, p);
  unsigned long long id1 = 0;
  OK(api.ptr_attr(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
  CUcontext owner = nullptr;
  OK(api.ptr_attr(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p));
  CHECK(owner == ctx);
  CHECK_EQ(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 1000),
           CUDA_ERROR_INVALID_VALUE);

  CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_CONTEXT,
                                  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL};
  size_t a_size = 0;
  unsigned long long a_id = 0;
  CUcontext a_ctx = nullptr;
  int a_ord = 7;
  void* data[4] = {&a_size, &a_id, &a_ctx, &a_ord};
  OK(api.ptr_attrs(4, attrs, data, p));
  CHECK_EQ(a_size, 1000u);
  CHECK_EQ(a_id, id1);
  CHECK(a_ctx == ctx);
  CHECK_EQ(a_ord, 0);

  OK(api.mem_free(p));
  // Freed (held by the pool): unallocated as far as the program can tell.
  CHECK_EQ(api.address_range(&base, &size, p), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p), CUDA_ERROR_INVALID_VALUE);
  OK(api.ptr_attrs(4, attrs, data, p));
  CHECK_EQ(a_size, 0u);
  CHECK_EQ(a_id, 0u);
  CHECK(a_ctx == nullptr);
  CHECK_EQ(a_ord, -2);

  OK(api.ctx_sync());
  CUdeviceptr q = 0;
  OK(api.mem_alloc(&q, 1010));  // same bin
  if (g_pooled) CHECK_EQ(q, p);
  unsigned long long id2 = 0;
  OK(api.ptr_attr(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q));
  CHECK(id2 != id1);
  OK(api.address_range(&base, &size, q));
  CHECK_EQ(size, 1010u);
  OK(api.mem_free(q));

  // Pinned.
  void* h = nullptr;
  OK(api.host_alloc(&h, 1000, CU_MEMHOSTALLOC_PORTABLE));
  unsigned flags = 0;
  OK(api.host_get_flags(&flags, h));
  CHECK_EQ(flags, 3u);
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, reinterpret_cast<CUdeviceptr>(h)));
  CHECK_EQ(range, 1000u);
  CHECK_EQ(api.host_get_flags(&flags, static_cast<char*>(h) + 1000), CUDA_ERROR_INVALID_VALUE);
  OK(api.free_host(h));
  CHECK_EQ(api.host_get_flags(&flags, h), CUDA_ERROR_INVALID_VALUE);

  // A block exported over IPC is never reused: its free reaches the driver.
  OK(api.ctx_sync());
  CUdeviceptr r = 0;
  OK(api.mem_alloc(&r, 2000));
  CUipcMemHandle ipc;
  OK(api.ipc_get(&ipc, r));
  StandinCounters c0 = snap();
  OK(api.mem_free(r));
  CHECK_EQ(snap().mem_free - c0.mem_free, 1u);
  OK(api.mem_alloc(&r, 2000));
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, 1u);
  OK(api.mem_free(r));
  CHECK_EQ(api.ipc_get(&ipc, r), CUDA_ERROR_INVALID_VALUE);  // freed

  // cuMemGetInfo: held memory counts as free.
  OK(api.ctx_sync());
  size_t free0 = 0, total = 0, free1 = 0;
  OK(api.get_info(&free0, &total));
  OK(api.mem_alloc(&r, 8 << 20));
  OK(api.mem_free(r));
  OK(api.get_info(&free1, &total));
  // Equal up to the driver's own rounding of what it charges.
  CHECK(free1 <= free0 && free0 - free1 < 4096);
  CHECK(free1 <= total);
}

// Out of memory: held blocks are released (this device first) and the call
// retried; a rounded size that does not fit falls back to the exact size.
// Run with STANDIN_CAPACITY=63.5 MiB.
void scenario_oom() {
  const size_t MiB = 1 << 20;
  CUcontext ctx0 = setup();
  // Device 1 holds blocks too; they must survive device 0's shortage.
  CUcontext ctx1 = create_ctx(1);
  CUdeviceptr d1[3];
  for (auto& p : d1) OK(api.mem_alloc(&p, 5 * MiB));
  for (auto& p : d1) OK(api.mem_free(p));
  const size_t used1 = api.used(1);
  OK(api.ctx_set_current(ctx0));
  (void)ctx1;

  CUdeviceptr keep = 0;
  OK(api.mem_alloc(&keep, 2 * MiB));
  CUdeviceptr b[6];
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  StandinCounters c0 = snap();
  CUdeviceptr big = 0;
  OK(api.mem_alloc(&big, 20 * MiB));
  StandinCounters c1 = snap();
  if (g_pooled) {
    CHECK(c1.mem_free - c0.mem_free >= 1);
    CHECK(c1.mem_alloc_calls - c0.mem_alloc_calls >= 2);  // failed, then retried
  }
  CHECK_EQ(api.used(1), used1);  // device 1's held blocks untouched
  OK(api.mem_free(big));

  // Exact size: 61 MiB rounds up to 62 MiB - 1; with 2 MiB (2.125 rounded)
  // in use only the exact size fits in 63.5 MiB.
  OK(api.ctx_sync());
  free_held();
  StandinCounters c2 = snap();
  CUdeviceptr exact = 0;
  const CUresult r = api.mem_alloc(&exact, 61 * MiB);
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "61 MiB: %d (used %zu)\n", int(r), api.used(0));
    exit(1);
  }
  StandinCounters c3 = snap();
  CHECK_EQ(c3.last_alloc_size, 61 * MiB);
  if (g_pooled) CHECK_EQ(c3.mem_alloc_calls - c2.mem_alloc_calls, 2u);
  OK(api.mem_free(exact));
  CHECK_EQ(snap().mem_free - c3.mem_free, 1u);  // not kept: it fits no bin

  exact = 0xdead;
  CHECK_EQ(api.mem_alloc(&exact, 100 * MiB), CUDA_ERROR_OUT_OF_MEMORY);
  CHECK_EQ(exact, 0u);

  // Allocations gpupool does not serve (stream-ordered, managed) get what
  // it holds: with 54 MiB held of 63.5, 40 MiB fit only once it lets go.
  OK(api.ctx_sync());
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  OK(api.ctx_sync());
  CUdeviceptr other = 0;
  OK(api.mem_alloc_async(&other, 40 * MiB, nullptr));
  OK(api.mem_free_async(other, nullptr));
  // Executed: the driver's pool gives it back (threshold 0) or, under
  // gpupool, keeps it, which the next allocations must get back.
  OK(api.ctx_sync());
  for (auto& p : b) OK(api.mem_alloc(&p, 9 * MiB));
  for (auto& p : b) OK(api.mem_free(p));
  OK(api.ctx_sync());
  OK(api.mem_alloc_managed(&other, 40 * MiB, CU_MEM_ATTACH_GLOBAL));
  OK(api.mem_free(other));
  OK(api.mem_free(keep));
}

}  // namespace client
