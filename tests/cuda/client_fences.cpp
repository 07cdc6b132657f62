// Scenarios of when a freed block is handed out again: after the work
// queued before its free (fences), or at once in stream order (the solo rule).
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "client.hpp"

namespace client {

// Fences: a freed block is not handed out again while work queued before
// its free may still write it (safe), or is (immediate).
void scenario_fence() {
  const CUcontext ctx = setup();
  // A stream of the program's own: fences decide every reuse (no solo rule,
  // scenario_solo).
  CUstream stream = nullptr;
  OK(api.stream_create(&stream, CU_STREAM_NON_BLOCKING));
  const size_t n = 4096;
  CUdeviceptr p = 0;
  OK(api.mem_alloc(&p, n));
  fill(p, n, 0x11);
  OK(api.memset_async(p, 0xEE, n, nullptr));  // queued, runs at a synchronization
  OK(api.mem_free(p));
  StandinCounters c0 = snap();
  CUdeviceptr q = 0;
  OK(api.mem_alloc(&q, n));
  StandinCounters c1 = snap();
  const int pending = api.pending_ops(q, n);
  // The program's new data: written by the device, in a stream's order,
  // when the pool hands out blocks whose old work is still queued.
  if (g_ordered) OK(api.memset_async(q, 0x22, n, stream));
  else fill(q, n, 0x22);
  OK(api.ctx_sync());
  const bool corrupted = !all_equal(q, n, 0x22);
  fprintf(stderr, "fence: reused=%d pool-syncs=%llu pending-at-reuse=%d corrupted=%d\n", q == p,
          (unsigned long long)(c1.ctx_sync - c0.ctx_sync), pending, corrupted);
  if (g_ordered) {
    // Ordered on the device: the block at once, its old work still queued,
    // and the program's write on its own stream lands after it.
    CHECK_EQ(q, p);
    CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
    CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 0u);
    CHECK_EQ(pending, 1);
    CHECK(c1.stream_waits - c0.stream_waits >= 2);  // the legacy stream and `stream`
    CHECK(!corrupted);
  } else if (g_pooled && g_immediate) {
    // Immediate reuse, no waiting: the detector sees the hazard.
    CHECK_EQ(q, p);
    CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
    CHECK_EQ(pending, 1);
    CHECK(corrupted);
  } else {
    CHECK_EQ(pending, 0);
    CHECK(!corrupted);
    if (g_growth) {
      CHECK(q != p);  // a fresh block rather than a wait for the busy one
      CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
      CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 1u);
    } else if (g_pooled) {
      CHECK_EQ(q, p);
      CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 1u);  // one wait covered it
      CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 0u);
    }
  }
  OK(api.mem_free(q));

  // The program's own synchronization completes the fence: no extra wait.
  CUdeviceptr r = 0;
  OK(api.mem_alloc(&r, 8192));
  OK(api.memset_async(r, 0xEE, 8192, nullptr));
  OK(api.mem_free(r));
  OK(api.ctx_sync());
  StandinCounters c2 = snap();
  CUdeviceptr s = 0;
  OK(api.mem_alloc(&s, 8192));
  StandinCounters c3 = snap();
  CHECK_EQ(c3.ctx_sync - c2.ctx_sync, 0u);
  if (g_pooled) CHECK_EQ(s, r);
  CHECK_EQ(api.pending_ops(s, 8192), 0);
  OK(api.mem_free(s));

  // Pinned blocks are fenced the same way.
  void* h = nullptr;
  OK(api.host_alloc(&h, n, 0));
  OK(api.memset_async(reinterpret_cast<CUdeviceptr>(h), 0xEE, n, nullptr));
  OK(api.free_host(h));
  void* h2 = nullptr;
  OK(api.host_alloc(&h2, n, 0));
  const int hp = api.pending_ops(reinterpret_cast<CUdeviceptr>(h2), n);
  CHECK_EQ(hp, g_pooled && g_immediate ? 1 : 0);
  OK(api.free_host(h2));

  // A range's piece that the pool waits for (GPUPOOL_SEGMENTS=expandable):
  // the wait is for the work queued before its free (a mark: a context
  // event recorded at the free), not for what the program queued after
  // the free, which stays queued.
  const char* segments = getenv("GPUPOOL_SEGMENTS");
  const bool expandable = segments && strcmp(segments, "expandable") == 0;
  // The bins' waits are for all their pending blocks: their frees record
  // no marks, whose clock and driver calls would be for nothing.
  if (!expandable && !g_ordered) CHECK_EQ(snap().ctx_events, 0u);
  if (g_pooled && !g_immediate && expandable) {
    const size_t m = size_t{4} << 20;
    CUdeviceptr later = 0, a = 0, b = 0;
    OK(api.mem_alloc(&later, n));
    OK(api.mem_alloc(&a, m));
    OK(api.memset_async(a, 0xEE, m, nullptr));                  // the piece's old work
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the marks' gap
    OK(api.mem_free(a));
    OK(api.memset_async(later, 0x33, n, nullptr));  // queued after the free
    StandinCounters c4 = snap();
    OK(api.mem_alloc(&b, m));
    StandinCounters c5 = snap();
    const int old_work = api.pending_ops(b, m), newer_work = api.pending_ops(later, n);
    fprintf(stderr,
            "fence mark: reused=%d ctx-syncs=%llu event-syncs=%llu pending old=%d newer=%d\n",
            b == a, (unsigned long long)(c5.ctx_sync - c4.ctx_sync),
            (unsigned long long)(c5.event_sync - c4.event_sync), old_work, newer_work);
    // Safe: a wait for the piece's mark, which leaves the newer work queued.
    // Ordered on the device (Backend::order_after): no wait on the host, its
    // old work still queued; the legacy stream and every non-blocking stream
    // wait for the mark. Either way the program's writes, on a non-blocking
    // stream made before and on one made after, land after the old work
    // (ordered, without the streams' waits they would run at once, and the
    // old work would overwrite them at the next synchronization).
    CHECK_EQ(b, a);
    CHECK_EQ(old_work, g_ordered ? 1 : 0);
    CHECK_EQ(newer_work, 1);
    CHECK_EQ(c5.ctx_sync - c4.ctx_sync, 0u);
    CHECK_EQ(c5.event_sync - c4.event_sync, g_ordered ? 0u : 1u);
    CUstream after = nullptr;
    OK(api.stream_create(&after, CU_STREAM_NON_BLOCKING));
    OK(api.memset_async(b, 0x22, m / 2, stream));
    OK(api.memset_async(b + m / 2, 0x23, m / 2, after));
    OK(api.ctx_sync());
    const bool before_ok = all_equal(b, m / 2, 0x22), after_ok = all_equal(b + m / 2, m / 2, 0x23);
    fprintf(stderr, "fence order: stream made before %s, made after %s\n",
            before_ok ? "ordered" : "OVERTAKEN", after_ok ? "ordered" : "OVERTAKEN");
    CHECK(before_ok);
    CHECK(after_ok);
    if (g_ordered) CHECK(c5.stream_waits - c4.stream_waits >= 2);
    OK(api.mem_free(b));
    OK(api.mem_free(later));
    OK(api.ctx_sync());
    {
      // More frees than marks while the device has not reached any (work
      // queued before them all): the newest mark is recorded again, so a
      // wait for the last free's fence still waits for a mark.
      CUdeviceptr pieces[20] = {};
      for (CUdeviceptr& q : pieces) OK(api.mem_alloc(&q, m));
      OK(api.memset_async(later, 0x44, n, nullptr));
      StandinCounters c6 = snap();
      for (CUdeviceptr q : pieces) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));  // past the marks' gap
        OK(api.mem_free(q));
      }
      CUdeviceptr again = 0;
      OK(api.mem_alloc(&again, m));
      StandinCounters c7 = snap();
      fprintf(stderr, "fence marks, ring full: recorded=%llu ctx-syncs=%llu event-syncs=%llu\n",
              (unsigned long long)(c7.ctx_events - c6.ctx_events),
              (unsigned long long)(c7.ctx_sync - c6.ctx_sync),
              (unsigned long long)(c7.event_sync - c6.event_sync));
      CHECK_EQ(c7.ctx_sync - c6.ctx_sync, 0u);
      CHECK_EQ(c7.event_sync - c6.event_sync, g_ordered ? 0u : 1u);
      OK(api.mem_free(again));
      OK(api.ctx_sync());
    }
    if (g_mode == "linked") {
      // No mark while a stream captures: the driver would end the capture.
      // (the linked client's driver, found as the program would)
      auto begin = reinterpret_cast<decltype(&cuStreamBeginCapture_v2)>(
          dlsym(RTLD_DEFAULT, "cuStreamBeginCapture_v2"));
      auto end = reinterpret_cast<decltype(&cuStreamEndCapture)>(
          dlsym(RTLD_DEFAULT, "cuStreamEndCapture"));
      CHECK(begin && end);
      CUdeviceptr z = 0;
      OK(api.mem_alloc(&z, m));
      OK(begin(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the marks' gap
      StandinCounters c6 = snap();
      OK(api.mem_free(z));
      StandinCounters c7 = snap();
      CUgraph graph = nullptr;
      OK(end(stream, &graph));
      fprintf(stderr, "fence mark in a capture: recorded=%llu refused=%llu\n",
              (unsigned long long)(c7.ctx_events - c6.ctx_events),
              (unsigned long long)(c7.ctx_events_in_capture - c6.ctx_events_in_capture));
      CHECK_EQ(c7.ctx_events - c6.ctx_events, 0u);
      CHECK_EQ(c7.ctx_events_in_capture - c6.ctx_events_in_capture, 0u);
    }
    {
      // A wait is shared: a thread whose piece's fence a synchronization in
      // flight covers (another thread's, started after that free) waits for
      // it and runs none of its own. Without marks (the driver refused one:
      // the context is synchronized from then on), last in this scenario.
      free_held();
      api.fail_next("cuCtxRecordEvent", 1000, CUDA_ERROR_NOT_SUPPORTED);
      CUdeviceptr x = 0, y = 0, x2 = 0;
      std::atomic<bool> main_done{false};
      OK(api.mem_alloc(&x, m));
      OK(api.mem_free(x));  // pending: its fence is older than the helper's
      std::thread helper([&] {
        OK(api.ctx_set_current(ctx));
        OK(api.mem_alloc(&y, m));
        OK(api.mem_free(y));
        api.hold_syncs(1);
        CUdeviceptr y2 = 0;
        OK(api.mem_alloc(&y2, m));  // a synchronization, held in the driver
        // Freed once the main thread has its piece: freed sooner, it would
        // be a pending piece newer than any synchronization so far.
        while (!main_done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        OK(api.mem_free(y2));
      });
      while (api.syncs_held() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      StandinCounters c8 = snap();
      std::thread release([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));  // this thread waiting
        api.hold_syncs(0);
      });
      OK(api.mem_alloc(&x2, m));
      main_done = true;
      release.join();
      helper.join();
      StandinCounters c9 = snap();
      fprintf(stderr, "fence shared: ctx-syncs=%llu reused=%d\n",
              (unsigned long long)(c9.ctx_sync - c8.ctx_sync), x2 == x || x2 == y);
      // The helper's alone (counted as it returns). Where the pieces went
      // depends on which thread came first after it.
      CHECK_EQ(c9.ctx_sync - c8.ctx_sync, 1u);
      OK(api.mem_free(x2));
    }
  }
}

// The solo rule (safe reuse in stream order): one thread, one context, no
// stream of the program's own. A freed block whose old work is still queued
// on the legacy stream is handed out again at once, as PyCUDA's
// DeviceMemoryPool does (the program's next work on it is queued behind);
// pinned blocks never. CLIENT_SOLO_END names the first sign of another order,
// which ends the rule after the old work of every block it lent is done.
void scenario_solo() {
  const char* env_end = getenv("CLIENT_SOLO_END");
  CHECK(env_end != nullptr);
  const std::string end = env_end;
  CUcontext ctx = setup();
  const size_t n = 4096;
  // procaddr asks for per-thread entry points, as cudart built for them
  // does: no rule there.
  const char* reuse = getenv("GPUPOOL_REUSE");
  const bool fenced = reuse && strcmp(reuse, "fenced") == 0;
  const bool solo = g_pooled && !g_immediate && !fenced && g_mode != "procaddr";

  CUdeviceptr p = 0, q = 0;
  OK(api.mem_alloc(&p, n));
  OK(api.memset_async(p, 0xEE, n, nullptr));  // queued until a synchronization
  OK(api.mem_free(p));
  StandinCounters c0 = snap();
  OK(api.mem_alloc(&q, n));
  StandinCounters c1 = snap();
  const int pending = api.pending_ops(q, n);
  fprintf(stderr, "solo: reused=%d syncs=%llu pending=%d\n", q == p,
          (unsigned long long)(c1.ctx_sync - c0.ctx_sync), pending);
  if (solo || (g_pooled && g_immediate)) {
    CHECK_EQ(q, p);
    CHECK_EQ(c1.ctx_sync - c0.ctx_sync, 0u);
    CHECK_EQ(c1.mem_alloc - c0.mem_alloc, 0u);
    CHECK_EQ(pending, 1);
  } else {
    CHECK_EQ(pending, 0);
  }
  // The program's next work on it is queued behind the old: no harm.
  OK(api.memset_async(q, 0x22, n, nullptr));
  OK(api.ctx_sync());
  CHECK(all_equal(q, n, 0x22));

  // Pinned blocks wait for their fence all the same: the host writes them
  // at once.
  void* h = nullptr;
  void* h2 = nullptr;
  OK(api.host_alloc(&h, n, 0));
  OK(api.memset_async(reinterpret_cast<CUdeviceptr>(h), 0xEE, n, nullptr));
  OK(api.free_host(h));
  OK(api.host_alloc(&h2, n, 0));
  CHECK_EQ(api.pending_ops(reinterpret_cast<CUdeviceptr>(h2), n), g_pooled && g_immediate ? 1 : 0);
  OK(api.free_host(h2));
  OK(api.ctx_sync());

  // Lent again, its old work queued, and then the end.
  CUdeviceptr r = 0;
  OK(api.memset_async(q, 0xEE, n, nullptr));
  OK(api.mem_free(q));
  OK(api.mem_alloc(&r, n));
  if (solo) CHECK_EQ(api.pending_ops(r, n), 1);
  StandinCounters c2 = snap();
  CUstream ended_by = nullptr;
  if (end == "stream") {
    OK(api.stream_create(&ended_by, CU_STREAM_NON_BLOCKING));
  } else if (end == "peer") {
    CUcontext b = create_ctx(0);  // current now; never allocates
    OK(api.ctx_set_current(ctx));
    OK(api.enable_peer(b, 0));
  } else if (end == "context") {
    create_ctx(0);  // current now
    CUdeviceptr x = 0;
    OK(api.mem_alloc(&x, 2 * n));
    OK(api.mem_free(x));
    OK(api.ctx_set_current(ctx));
  } else if (end == "thread_alloc") {
    std::thread([&] {
      OK(api.ctx_set_current(ctx));
      CUdeviceptr x = 0;
      OK(api.mem_alloc(&x, 2 * n));
      OK(api.mem_free(x));
    }).join();
  } else if (end == "thread_free") {
    CUdeviceptr x = 0;
    OK(api.mem_alloc(&x, 2 * n));
    std::thread([&] { OK(api.mem_free(x)); }).join();
  } else if (end == "symbol") {
    // A per-thread default stream entry point: by name through dlsym in the
    // dlsym modes, else by cuGetProcAddress's flag.
    void* fn = nullptr;
#ifndef CLIENT_LINKED
    if (g_mode != "procaddr") fn = dlsym(g_handle, "cuMemsetD8Async_ptsz");
#endif
    if (!fn)
      OK(api.get_proc("cuMemsetD8Async", &fn, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                      nullptr));
    CHECK(fn != nullptr);
  } else {
    fprintf(stderr, "unknown CLIENT_SOLO_END %s\n", end.c_str());
    exit(2);
  }
  StandinCounters c3 = snap();
  fprintf(stderr, "solo ended by %s: syncs=%llu pending=%d\n", end.c_str(),
          (unsigned long long)(c3.ctx_sync - c2.ctx_sync), api.pending_ops(r, n));
  if (solo) {
    // One synchronization of each context, before the call returned.
    CHECK_EQ(c3.ctx_sync - c2.ctx_sync, end == "context" ? 2u : 1u);
    CHECK_EQ(api.pending_ops(r, n), 0);
  }
  // A non-blocking stream's work runs at once: had the old work still been
  // queued, it would land on top of the program's new data.
  CUstream s2 = nullptr;
  OK(api.stream_create(&s2, CU_STREAM_NON_BLOCKING));
  OK(api.memset_async(r, 0x33, n, s2));
  OK(api.ctx_sync());
  const bool corrupted = !all_equal(r, n, 0x33);
  CHECK_EQ(corrupted, g_pooled && g_immediate);
  OK(api.mem_free(r));

  // From now on freed blocks wait for the device.
  CUdeviceptr y = 0, z = 0;
  OK(api.mem_alloc(&y, n));
  OK(api.memset_async(y, 0xEE, n, nullptr));
  OK(api.mem_free(y));
  OK(api.mem_alloc(&z, n));
  CHECK_EQ(api.pending_ops(z, n), g_pooled && g_immediate ? 1 : 0);
  OK(api.mem_free(z));
  OK(api.ctx_sync());
}

// Ordering on the device (GPUPOOL_REUSE=ordered) and what ends it
// (CLIENT_ORDERED_END): a pending block is handed out with the legacy stream
// and the program's non-blocking stream made to wait for its old work, no
// wait on the host; once the driver refused to destroy a stream the pool
// had stopped ordering (the program may still use it: "destroy"), or the
// program set a block for GPUDirect RDMA ("sync_memops") or exported one as
// a dma-buf ("dma_buf"), memory reached outside any stream, pending blocks
// wait on the host instead.
void scenario_ordered() {
  setup();
  CUstream s = nullptr;
  OK(api.stream_create(&s, CU_STREAM_NON_BLOCKING));
  // A pending block asked for again: the streams' waits, and the host's.
  auto reuse = [&](unsigned long long* device_waits, unsigned long long* host_waits) {
    CUdeviceptr p = 0, q = 0;
    OK(api.mem_alloc(&p, 4096));
    OK(api.memset_async(p, 0xEE, 4096, nullptr));  // queued, runs at a synchronization
    OK(api.mem_free(p));
    const StandinCounters c0 = snap();
    OK(api.mem_alloc(&q, 4096));
    const StandinCounters c1 = snap();
    CHECK_EQ(q, p);
    *device_waits = c1.stream_waits - c0.stream_waits;
    *host_waits = (c1.ctx_sync - c0.ctx_sync) + (c1.event_sync - c0.event_sync);
    OK(api.mem_free(q));
    OK(api.ctx_sync());
  };
  unsigned long long device_waits = 0, host_waits = 0;
  reuse(&device_waits, &host_waits);
  fprintf(stderr, "ordered: stream waits %llu, host waits %llu\n", device_waits, host_waits);
  CHECK_EQ(device_waits, 2u);  // the legacy stream and `s`
  CHECK_EQ(host_waits, 0u);

  const char* env = getenv("CLIENT_ORDERED_END");
  const std::string end = env ? env : "destroy";
  if (end == "destroy") {
    api.fail_next("cuStreamDestroy_v2", 1, CUDA_ERROR_NOT_PERMITTED);
    CHECK_EQ(api.stream_destroy(s), CUDA_ERROR_NOT_PERMITTED);
  } else {
    CUdeviceptr b = 0;
    OK(api.mem_alloc(&b, 8192));
    if (end == "sync_memops") {
      const unsigned one = 1;
      OK(api.ptr_set_attr(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, b));
    } else {
      CHECK(end == "dma_buf");
      int fd = -1;
      OK(api.dma_buf_export(&fd, b, 8192, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
      CHECK(fd >= 0);
      close(fd);
    }
    OK(api.mem_free(b));
  }
  reuse(&device_waits, &host_waits);
  fprintf(stderr, "ordered, then %s: stream waits %llu, host waits %llu\n", end.c_str(),
          device_waits, host_waits);
  CHECK_EQ(device_waits, 0u);
  CHECK(host_waits >= 1);
  OK(api.stream_destroy(s));
}

}  // namespace client
