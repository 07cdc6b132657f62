// The scenario of pieces of driver allocations (GPUPOOL_SPLIT, GPUPOOL_SEGMENTS).
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
  if (expandable) {
    // A freed piece handed out again whole (parked: core/binned.hpp) is a
    // new allocation to the program; a piece cut across freed ones answers
    // for all of their addresses.
    OK(api.ctx_sync());  // the freed pieces ready
    // The rest of phase one's 32 MiB in use, so that nothing but the
    // freed pieces can serve what follows.
    CUdeviceptr rest = 0;
    OK(api.mem_alloc(&rest, (32 << 20) - 8 * ((kPiece + 511) / 512 * 512)));
    CUdeviceptr again = 0;
    OK(api.mem_alloc(&again, kPiece));
    CHECK(again == b[1] || again == b[2]);
    OK(api.address_range(&base, &size, again + 3));
    CHECK_EQ(base, again);
    CHECK_EQ(size, kPiece);
    unsigned long long id = 0;
    OK(api.ptr_attr(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, again));
    CHECK(std::find(ids.begin(), ids.end(), id) == ids.end());
    OK(api.mem_free(again));
    OK(api.ctx_sync());  // both freed pieces ready: they serve, merged
    CUdeviceptr two = 0;
    OK(api.mem_alloc(&two, 2 * kPiece));
    CHECK_EQ(two, b[1]);
    OK(api.address_range(&base, &size, b[2] + 5));
    CHECK_EQ(base, b[1]);
    CHECK_EQ(size, 2 * kPiece);
    OK(api.mem_free(two));
    OK(api.mem_free(rest));
    CHECK_EQ(api.address_range(&base, &size, b[2] + 5), CUDA_ERROR_NOT_FOUND);
  }
  // IPC: refused on a piece sharing its driver allocation; a request that
  // gets a segment of its own is exported as any block, and its free
  // reaches the driver. A range's piece is exported (the ipc scenario).
  CUipcMemHandle ipc;
  CHECK_EQ(api.ipc_get(&ipc, b[3]), split && !expandable ? CUDA_ERROR_NOT_SUPPORTED : CUDA_SUCCESS);
  CUdeviceptr whole = 0;
  OK(api.mem_alloc(&whole, 16 << 20));
  if (expandable) {
    // Every large block is a piece of the range, exported as gpupool's
    // own handle (the ipc scenario opens one).
    OK(api.ipc_get(&ipc, whole));
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
  if (expandable) {
    // Every granule given back: a request of the whole 32 MiB maps them
    // again from the range's start, across freed pieces, and answers for
    // all of it.
    CUdeviceptr all = 0;
    OK(api.mem_alloc(&all, 32 << 20));
    CHECK_EQ(all, a[0]);
    for (int i : {0, 4, 7}) {
      CUdeviceptr base = 0;
      size_t size = 0;
      OK(api.address_range(&base, &size, b[i] + 5));
      CHECK_EQ(base, all);
      CHECK_EQ(size, size_t{32} << 20);
    }
    OK(api.mem_free(all));
    free_held();
  }
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

namespace {

constexpr size_t kMiB = size_t{1} << 20;
extern "C" char** environ;

// This client again, as the importing process of `handle`: expect "open"
// (it maps the piece, finds `tag`, writes its first MiB with 0x77) or the
// driver's refusal; `preloaded`: with gpupool (LD_PRELOAD kept) or not.
void run_importer(const CUipcMemHandle& handle, size_t n, const char* expect, bool preloaded) {
  char hex[2 * sizeof handle.reserved + 1];
  for (size_t i = 0; i < sizeof handle.reserved; ++i)
    snprintf(hex + 2 * i, 3, "%02x", static_cast<unsigned char>(handle.reserved[i]));
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (preloaded || strncmp(*e, "LD_PRELOAD=", 11) != 0) env.push_back(*e);
  env.push_back(std::string("CLIENT_IPC_HANDLE=") + hex);
  env.push_back("CLIENT_IPC_SIZE=" + std::to_string(n));
  env.push_back(std::string("CLIENT_IPC_EXPECT=") + expect);
  if (!preloaded) env.push_back("CLIENT_POOLED=0");
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  char exe[] = "/proc/self/exe", scenario[] = "ipc";
  char* argv[] = {exe, g_mode.data(), scenario, nullptr};
  pid_t pid = 0;
  CHECK_EQ(posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data()), 0);
  int status = 0;
  CHECK_EQ(waitpid(pid, &status, 0), pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// The importing side (CLIENT_IPC_HANDLE set).
void import_side() {
  setup();
  const char* hex = getenv("CLIENT_IPC_HANDLE");
  CUipcMemHandle h;
  for (size_t i = 0; i < sizeof h.reserved; ++i) {
    unsigned v = 0;
    CHECK(sscanf(hex + 2 * i, "%2x", &v) == 1);
    h.reserved[i] = static_cast<char>(v);
  }
  const size_t n = strtoull(getenv("CLIENT_IPC_SIZE"), nullptr, 10);
  CUdeviceptr p = 0;
  const CUresult r = api.ipc_open(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (strcmp(getenv("CLIENT_IPC_EXPECT"), "refused") == 0) {
    // Exactly what the driver says of the handle without gpupool.
    CHECK_EQ(r, CUDA_ERROR_INVALID_VALUE);
    return;
  }
  OK(r);
  // Its range is the piece, as an opened cuMemAlloc block's is the block.
  CUdeviceptr base = 0;
  size_t size = 0;
  OK(api.address_range(&base, &size, p + 17));
  CHECK_EQ(base, p);
  CHECK_EQ(size, n);
  size_t range = 0;
  OK(api.ptr_attr(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + n - 1));
  CHECK_EQ(range, n);
  CHECK(all_equal(p, n, 0x5a));
  fill(p, kMiB, 0x77);
  OK(api.ctx_sync());
  // Opened twice: one pointer, which the first close unmaps.
  CUdeviceptr q = 0;
  OK(api.ipc_open(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  CHECK_EQ(q, p);
  OK(api.ipc_close(p));
  CHECK(api.ipc_close(p) != CUDA_SUCCESS);
}

}  // namespace

// Peer access (cuCtxEnablePeerAccess): a context of device 1 given access
// to a context of device 0 reaches its blocks, those allocated before the
// enable and after it, whatever they are cut from (a range's granules are
// mapped for device 0 alone unless gpupool grants the peer access too).
void scenario_peer() {
  const CUcontext c0 = setup();
  const size_t n = 3 * kMiB + 100, m = 5 * kMiB;
  CUdeviceptr before = 0, after = 0;
  OK(api.mem_alloc(&before, n));
  const CUcontext c1 = create_ctx(1);  // current now
  OK(api.enable_peer(c0, 0));
  OK(api.memset_async(before, 0x21, n, nullptr));
  OK(api.ctx_sync());
  CHECK(all_equal(before, n, 0x21));
  OK(api.ctx_set_current(c0));
  OK(api.mem_alloc(&after, m));
  OK(api.ctx_set_current(c1));
  OK(api.memset_async(after, 0x22, m, nullptr));
  OK(api.ctx_sync());
  CHECK(all_equal(after, m, 0x22));
  OK(api.ctx_set_current(c0));
  OK(api.mem_free(before));
  OK(api.mem_free(after));
  OK(api.ctx_destroy(c1));
  OK(api.ctx_set_current(c0));
}

// GPUPOOL_SEGMENTS=expandable: a piece of the range, which legacy IPC cannot
// share, exported with cuIpcGetMemHandle (an interior pointer: its piece)
// and opened by another process with cuIpcOpenMemHandle, which sees and
// writes the same memory. A process without gpupool, or an open after the
// exporter freed the piece, gets the driver's refusal. Granules not made
// exportable (STANDIN_NO_POSIX_FD=1): cuIpcGetMemHandle is refused.
void scenario_ipc() {
  if (getenv("CLIENT_IPC_HANDLE")) {
    import_side();
    return;
  }
  setup();
  CHECK(g_expandable);
  const StandinCounters c0 = snap();
  // y shares its first and last granules with x and z.
  const size_t n = 5 * kMiB + 100;
  CUdeviceptr x = 0, y = 0, z = 0;
  OK(api.mem_alloc(&x, kMiB));
  OK(api.mem_alloc(&y, n));
  OK(api.mem_alloc(&z, kMiB));
  fill(y, n, 0x5a);
  fill(x, kMiB, 0x11);
  OK(api.ctx_sync());
  CUipcMemHandle h, again;
  const char* no_fd = getenv("STANDIN_NO_POSIX_FD");
  if (no_fd && *no_fd == '1') {
    CHECK_EQ(api.ipc_get(&h, y), CUDA_ERROR_NOT_SUPPORTED);
  } else {
    OK(api.ipc_get(&h, y + 4096));
    OK(api.ipc_get(&again, y));
    CHECK(memcmp(&h, &again, sizeof h) == 0);
    run_importer(h, n, "open", true);
    CHECK(all_equal(y, kMiB, 0x77));
    CHECK(all_equal(y + kMiB, n - kMiB, 0x5a));
    CHECK(all_equal(x, kMiB, 0x11));
    run_importer(h, n, "refused", false);
  }
  const bool exported = !(no_fd && *no_fd == '1');
  if (exported) {
    // A piece of more granules than one answer carries (64): opened in
    // batches.
    const size_t big = 150 * kMiB + 4096;
    CUdeviceptr b = 0;
    OK(api.mem_alloc(&b, big));
    fill(b, big, 0x5a);
    CUipcMemHandle hb;
    OK(api.ipc_get(&hb, b));
    run_importer(hb, big, "open", true);
    CHECK(all_equal(b, kMiB, 0x77));
    CHECK(all_equal(b + kMiB, big - kMiB, 0x5a));
    // Freed in stream order, it is no process's to open either, and a
    // piece handed out at its address later is another export.
    OK(api.mem_free_async(b, nullptr));
    OK(api.ctx_sync());
    run_importer(hb, big, "refused", true);
    CUdeviceptr b2 = 0;
    OK(api.mem_alloc(&b2, big));
    CUipcMemHandle hb2;
    OK(api.ipc_get(&hb2, b2));
    CHECK(memcmp(&hb, &hb2, sizeof hb) != 0);
    run_importer(hb, big, "refused", true);
    OK(api.mem_free(b2));
  }
  OK(api.mem_free(y));
  if (exported) run_importer(h, n, "refused", true);
  // Exported, never handed out again: a request of its size maps new
  // memory. Not exported: it is held and serves again.
  const StandinCounters c1 = snap();
  CUdeviceptr w = 0;
  OK(api.mem_alloc(&w, n));
  CHECK_EQ(snap().vmm_created > c1.vmm_created, exported);
  for (CUdeviceptr p : {x, z, w}) OK(api.mem_free(p));
  OK(api.ctx_sync());
  free_held();
  const StandinCounters c2 = snap();
  CHECK_EQ(c2.vmm_freed - c0.vmm_freed, c2.vmm_created - c0.vmm_created);
}

}  // namespace client
