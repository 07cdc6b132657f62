// Ordering on the device instead of waiting on the host, without gpupool: the
// facts a pool would rest on if it handed out a piece whose old work may still
// run, after making every stream that can touch it wait for the mark recorded
// at its free (cuStreamWaitEvent; docs/memory.md, "Expandable ranges (opt-in)").
//   nvcc -O2 -arch=sm_90 -o device_order_probe tests/gpu/device_order_probe.cu -lcuda
//
// 1. Which streams a wait on the legacy default stream orders. A slow kernel
//    on a non-blocking stream writes 0xEE into X; a context event (the mark)
//    is recorded; the legacy stream waits for it; then a quick kernel on the
//    stream under test writes 0x22 into X. X ends 0x22 only if the quick
//    kernel ran after the slow one. Expected ordered: the legacy stream, a
//    blocking stream made before or after, this thread's and another
//    thread's per-thread default stream, a non-blocking stream with a wait
//    of its own (before, or at its creation). Expected not ordered (the
//    control, which shows the check can fail): a non-blocking stream
//    without one.
// 2. What a wait costs: cuStreamWaitEvent on the legacy and on a non-blocking
//    stream, for a done mark and for a pending one.
// 3. Capture: a wait on a capturing stream for a mark recorded outside the
//    capture, and a wait on the legacy stream while another stream captures
//    (global and relaxed modes): what the driver answers, and whether the
//    capture still ends.
// 4. What the driver's own cuMemAlloc and cuMemFree order between two
//    non-blocking streams (a wait on the legacy stream makes every blocking
//    stream's later work wait for all their earlier work: what the driver
//    documents of an allocation, to be compared with what it does).
// One line per check ("ok"/"FAILED"), then the costs and answers; exit 1 if
// a check failed.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

static int g_failed = 0;
#define C(x)                                                             \
  do {                                                                   \
    CUresult r_ = (x);                                                   \
    if (r_) {                                                            \
      std::printf("%s -> %d (line %d)\n", #x, int(r_), __LINE__);        \
      std::exit(2);                                                      \
    }                                                                    \
  } while (0)

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

__global__ void fill(unsigned char* p, unsigned long long n, unsigned char v, long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x)
    p[i] = v;
}

static const unsigned long long kBytes = 1 << 20;
static long long g_slow_cycles = 0;  // about 50 ms

static void launch(CUstream s, CUdeviceptr x, unsigned char v, long long cycles) {
  fill<<<64, 256, 0, (cudaStream_t)s>>>((unsigned char*)x, kBytes, v, cycles);
}

static bool ends(CUdeviceptr x, unsigned char v) {
  std::vector<unsigned char> h(kBytes);
  C(cuMemcpyDtoH(h.data(), x, kBytes));
  for (unsigned char c : h)
    if (c != v) return false;
  return true;
}

static void check(bool ok, const char* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) g_failed = 1;
}

int main() {
  CUdevice d;
  CUcontext ctx;
  C(cuInit(0));
  C(cuDeviceGet(&d, 0));
  C(cuDevicePrimaryCtxRetain(&ctx, d));
  C(cuCtxSetCurrent(ctx));
  int khz = 0;
  C(cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, d));
  g_slow_cycles = 50LL * khz;
  CUdeviceptr x;
  C(cuMemAlloc(&x, kBytes));
  CUevent mark;
  C(cuEventCreate(&mark, CU_EVENT_DISABLE_TIMING));
  CUstream slow_s, nb, bl;
  C(cuStreamCreate(&slow_s, CU_STREAM_NON_BLOCKING));
  C(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
  C(cuStreamCreate(&bl, CU_STREAM_DEFAULT));

  // ---- 1. ordering ----------------------------------------------------------
  enum Target { legacy, blocking, blocking_later, per_thread, other_thread, nb_waited,
                nb_created_waited, nb_unwaited };
  struct Case {
    Target t;
    bool ordered;
    const char* what;
  } cases[] = {
      {legacy, true, "legacy stream, after the legacy stream's wait"},
      {blocking, true, "blocking stream made before, after the legacy stream's wait"},
      {blocking_later, true, "blocking stream made after the legacy stream's wait"},
      {per_thread, true, "this thread's per-thread stream, after the legacy stream's wait"},
      {other_thread, true, "another thread's per-thread stream, after the legacy stream's wait"},
      {nb_waited, true, "non-blocking stream with its own wait"},
      {nb_created_waited, true, "non-blocking stream made after, waiting at its creation"},
      {nb_unwaited, false, "non-blocking stream without a wait of its own (control)"},
  };
  for (const Case& c : cases) {
    C(cuMemsetD8(x, 0, kBytes));
    C(cuCtxSynchronize());
    launch(slow_s, x, 0xEE, g_slow_cycles);
    C(cuCtxRecordEvent(ctx, mark));  // the mark at the free
    C(cuStreamWaitEvent(CU_STREAM_LEGACY, mark, 0));
    CUstream made = nullptr;
    switch (c.t) {
      case legacy: launch(CU_STREAM_LEGACY, x, 0x22, 0); break;
      case blocking: launch(bl, x, 0x22, 0); break;
      case blocking_later:
        C(cuStreamCreate(&made, CU_STREAM_DEFAULT));
        launch(made, x, 0x22, 0);
        break;
      case per_thread: launch(CU_STREAM_PER_THREAD, x, 0x22, 0); break;
      case other_thread: {
        std::thread th([&] {
          C(cuCtxSetCurrent(ctx));
          launch(CU_STREAM_PER_THREAD, x, 0x22, 0);
          C(cuStreamSynchronize(CU_STREAM_PER_THREAD));
        });
        th.join();
        break;
      }
      case nb_waited:
        C(cuStreamWaitEvent(nb, mark, 0));
        launch(nb, x, 0x22, 0);
        break;
      case nb_created_waited:
        C(cuStreamCreate(&made, CU_STREAM_NON_BLOCKING));
        C(cuStreamWaitEvent(made, mark, 0));
        launch(made, x, 0x22, 0);
        break;
      case nb_unwaited: launch(nb, x, 0x22, 0); break;
    }
    C(cuCtxSynchronize());
    const bool after = ends(x, 0x22);
    char line[200];
    std::snprintf(line, sizeof line, "%s: %s", c.what, c.ordered ? "ordered" : "not ordered");
    check(after == c.ordered, line);
    if (made) C(cuStreamDestroy(made));
  }

  // ---- 2. costs ---------------------------------------------------------------
  // ns a cuStreamWaitEvent(s, mark), over `calls` of them.
  auto per_wait = [&](CUstream s, int calls) {
    const double t0 = now();
    for (int i = 0; i < calls; ++i) C(cuStreamWaitEvent(s, mark, 0));
    return (now() - t0) / calls;
  };
  C(cuCtxRecordEvent(ctx, mark));
  C(cuCtxSynchronize());
  const double legacy_done = per_wait(CU_STREAM_LEGACY, 20000);
  const double nb_done = per_wait(nb, 20000);
  C(cuCtxSynchronize());
  launch(slow_s, x, 0xEE, g_slow_cycles);
  C(cuCtxRecordEvent(ctx, mark));
  // A pending mark: fewer calls, each queues a wait.
  const double legacy_pending = per_wait(CU_STREAM_LEGACY, 2000);
  const double nb_pending = per_wait(nb, 2000);
  C(cuCtxSynchronize());
  std::printf(
      "cost: cuStreamWaitEvent on the legacy stream %.0f ns (mark done), %.0f ns (pending); "
      "on a non-blocking stream %.0f ns, %.0f ns\n",
      legacy_done, legacy_pending, nb_done, nb_pending);

  // ---- 3. capture -------------------------------------------------------------
  const struct {
    CUstreamCaptureMode mode;
    const char* name;
  } modes[] = {{CU_STREAM_CAPTURE_MODE_GLOBAL, "global"},
               {CU_STREAM_CAPTURE_MODE_RELAXED, "relaxed"}};
  for (const auto& md : modes) {
    CUstream cap;
    C(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING));
    C(cuCtxRecordEvent(ctx, mark));
    for (int which = 0; which < 2; ++which) {
      C(cuStreamBeginCapture(cap, md.mode));
      launch(cap, x, 0x11, 0);
      const CUresult w = cuStreamWaitEvent(which ? CU_STREAM_LEGACY : cap, mark, 0);
      CUgraph g = nullptr;
      const CUresult e = cuStreamEndCapture(cap, &g);
      std::printf("capture (%s mode): a wait on %s for a mark from outside -> %d; the capture "
                  "ends -> %d\n",
                  md.name, which ? "the legacy stream" : "the capturing stream", int(w), int(e));
      if (g) C(cuGraphDestroy(g));
      cuCtxSynchronize();  // clear what an invalidated capture leaves
    }
    C(cuStreamDestroy(cap));
  }
  // ---- 4. what the driver's own calls order -------------------------------------
  // The programming guide lists a device memory allocation among the implicit
  // synchronizations of two streams; a free waits for the device. Does a
  // cuMemAlloc (or cuMemFree) between a slow kernel on one non-blocking stream
  // and a quick one on another order them? (Reported, not checked.)
  CUstream nb2;
  C(cuStreamCreate(&nb2, CU_STREAM_NON_BLOCKING));
  for (int call = 0; call < 3; ++call) {
    C(cuMemsetD8(x, 0, kBytes));
    C(cuCtxSynchronize());
    CUdeviceptr y = 0;
    if (call == 2) C(cuMemAlloc(&y, 4 << 20));  // freed below, between the kernels
    launch(nb, x, 0xEE, g_slow_cycles);
    const double t = now();
    if (call == 1) C(cuMemAlloc(&y, 4 << 20));
    if (call == 2) C(cuMemFree(y));
    const double took = (now() - t) / 1e6;
    launch(nb2, x, 0x22, 0);
    C(cuCtxSynchronize());
    if (call == 1) C(cuMemFree(y));
    const char* what[] = {"nothing", "a cuMemAlloc", "a cuMemFree"};
    std::printf("two non-blocking streams with %s between their kernels: %s (the call took %.1f ms)\n",
                what[call], ends(x, 0x22) ? "ordered" : "not ordered", took);
  }
  C(cuStreamDestroy(nb2));

  C(cuCtxSynchronize());
  std::printf("DONE %s\n", g_failed ? "with failures" : "all ok");
  return g_failed;
}
