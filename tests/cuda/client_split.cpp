// The scenario of pieces of driver allocations (GPUPOOL_SPLIT, GPUPOOL_SEGMENTS).
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "client.hpp"

namespace client {

// GPUPOOL_SPLIT: sizes one phase never used are served from the memory the
// phase before freed, each piece an allocation of its own to the program
// (its range, attributes, contents and errors); a piece that shares its
// driver allocation cannot be exported over IPC; whole segments go back.
// GPUPOOL_SEGMENTS=expandable: the same, the pieces cut from one reserved
// range with a physical allocation mapped per 2 MiB granule, none of them
// exported over IPC, every granule given back (free_held, and with a
// context destroyed while the program holds pieces: virtual memory is no
// context's, the driver does not free it with one).
void scenario_split() {
  setup();
  const char* env = getenv("GPUPOOL_SPLIT");
  const bool expandable = g_expandable;
  const bool split =
      expandable || (g_pooled && env && strcmp(env, "off") != 0 && strcmp(env, "0") != 0);
  const StandinCounters c0 = snap();
  constexpr size_t kBig = 8 << 20, kPiece = (3 << 20) + 100;
  CUdeviceptr a[4];
  for (int i = 0; i < 4; ++i) {
    OK(api.mem_alloc(&a[i], kBig));
    fill(a[i], kBig, static_cast<unsigned char>(i + 1));
  }
  for (CUdeviceptr p : a) OK(api.mem_free(p));
  OK(api.ctx_sync());
  std::vector<Live> live;
  CUdeviceptr b[8];
  for (int i = 0; i < 8; ++i) {
    OK(api.mem_alloc(&b[i], kPiece));
    const Live l{b[i], kPiece, static_cast<unsigned char>(0x40 + i), false};
    check_no_overlap(live, l);
    fill(b[i], kPiece, l.tag);
    live.push_back(l);
  }
  // Split: phase one's four driver allocations serve all eight. Binned
  // (or the driver alone): eight more. Expandable: no driver allocation,
  // phase one's 32 MiB mapped granule by granule (one cuMemCreate and one
  // cuMemMap each) serve all eight.
  CHECK_EQ(snap().mem_alloc - c0.mem_alloc, expandable ? 0u : split ? 4u : 12u);
  if (expandable) {
    CHECK_EQ(snap().vmm_reserve_calls - c0.vmm_reserve_calls, 1u);
    CHECK_EQ(snap().vmm_created - c0.vmm_created, 16u);
    CHECK_EQ(snap().vmm_mapped - c0.vmm_mapped, 16u);
  }
  std::vector<unsigned long long> ids;
  for (CUdeviceptr p : b) {
    CUdeviceptr base = 0;
    size_t size = 0;
    OK(api.address_range(&base, &size, p + 17));
    CHECK_EQ(base, p);
    CHECK_EQ(size, kPiece);
    CUdeviceptr start = 0;
    OK(api.ptr_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + kPiece - 1));
    CHECK_EQ(start, p);
    size_t range = 0;
    OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p));
    CHECK_EQ(range, kPiece);
    unsigned long long id = 0;
    OK(api.ptr_attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p));
    CHECK(std::find(ids.begin(), ids.end(), id) == ids.end());
    ids.push_back(id);
    // As for cuMemAlloc memory (the driver says 0 for virtual memory).
    int legacy_ipc = -1;
    OK(api.ptr_attr(&legacy_ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p + 1));
    CHECK_EQ(legacy_ipc, 1);
  }
  // Neighbours freed (and merged): the others keep their bytes; a freed
  // piece is unallocated, and a second free of it the driver's error.
  OK(api.mem_free(b[1]));
  OK(api.mem_free(b[2]));
  CHECK(all_equal(b[0], kPiece, 0x40));
  CHECK(all_equal(b[3], kPiece, 0x43));
  CUdeviceptr base = 0;
  size_t size = 0;
  CHECK_EQ(api.address_range(&base, &size, b[1] + 5), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(api.mem_free(b[1]), CUDA_ERROR_INVALID_VALUE);
  // IPC: refused on a piece sharing its driver allocation; a request that
  // gets a segment of its own is exported as any block, and its free
  // reaches the driver.
  CUipcMemHandle ipc;
  CHECK_EQ(api.ipc_get(&ipc, b[3]), split ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS);
  CUdeviceptr whole = 0;
  OK(api.mem_alloc(&whole, 16 << 20));
  if (expandable) {
    // Every large block is a piece of the range.
    CHECK_EQ(api.ipc_get(&ipc, whole), CUDA_ERROR_NOT_SUPPORTED);
    OK(api.mem_free(whole));
  } else {
    OK(api.ipc_get(&ipc, whole));
    StandinCounters c1 = snap();
    OK(api.mem_free(whole));
    CHECK_EQ(snap().mem_free - c1.mem_free, 1u);
  }
  for (int i : {0, 3, 4, 5, 6, 7}) OK(api.mem_free(b[i]));
  OK(api.ctx_sync());
  free_held();
  // Everything went back: as many driver frees as driver allocations.
  const StandinCounters c2 = snap();
  CHECK_EQ(c2.mem_free - c0.mem_free, c2.mem_alloc - c0.mem_alloc);
  if (expandable) {
    // Every granule unmapped and its physical memory gone; the range kept.
    CHECK(c2.vmm_created - c0.vmm_created > 16u);
    CHECK_EQ(c2.vmm_freed - c0.vmm_freed, c2.vmm_created - c0.vmm_created);
    CHECK_EQ(c2.vmm_address_free_calls, c0.vmm_address_free_calls);
  }
  // A context destroyed while the program holds pieces of one segment: the
  // driver freed them, so the program's frees get the driver's answer for
  // freed memory, and nothing of that context is handed out again.
  {
    CUdevice dev;
    OK(api.device_get(&dev, 0));
    CUcontext cur = nullptr, other = nullptr;
    OK(api.ctx_get_current(&cur));
    OK(api.ctx_create(&other, nullptr, 0, dev));
    CUdeviceptr seg = 0, p1 = 0, p2 = 0;
    OK(api.mem_alloc(&seg, kBig));
    OK(api.mem_free(seg));
    OK(api.ctx_sync());
    OK(api.mem_alloc(&p1, kPiece));
    OK(api.mem_alloc(&p2, kPiece));
    if (split) CHECK(p2 > p1 && p2 < p1 + kBig);  // one segment
    const StandinCounters d0 = snap();
    OK(api.ctx_destroy(other));
    OK(api.ctx_set_current(cur));
    if (expandable) {
      // The context's range went back whole: the granules of p1, p2 and of
      // the held rest of the 8 MiB unmapped and freed, the range free.
      CHECK_EQ(snap().vmm_freed - d0.vmm_freed, 4u);
      CHECK_EQ(snap().vmm_address_free_calls - d0.vmm_address_free_calls, 1u);
    }
    CHECK_EQ(api.mem_free(p2), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(api.mem_free(p1), CUDA_ERROR_INVALID_VALUE);
    // Memory that died with its context (virtual memory does not).
    CHECK_EQ(snap().dead_ptr_calls - d0.dead_ptr_calls, expandable ? 0u : 2u);
    CUdeviceptr q = 0;
    OK(api.mem_alloc(&q, kPiece));
    CHECK(q < p1 || q >= p1 + kBig || snap().mem_alloc > d0.mem_alloc);
    OK(api.mem_free(q));
    OK(api.ctx_sync());
  }
}

}  // namespace client
