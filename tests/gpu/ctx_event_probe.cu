// Context events (cuCtxRecordEvent, CUDA 12.5 on) as fences, without gpupool:
// what a mark costs, which streams' work it covers, and what waiting for it
// costs against cuCtxSynchronize when newer work is queued behind the free
// (interpose/cuda/contexts.hpp's marks; figures in docs/memory.md).
//   nvcc -O2 -arch=sm_90 -o ctx_event_probe tests/gpu/ctx_event_probe.cu -lcuda
#include <cuda.h>
#include <cstdio>
#include <ctime>
static double now() { timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
__global__ void spin(long long cycles) { long long t0 = clock64(); while (clock64() - t0 < cycles) {} }
#define C(x) do { CUresult r = (x); if (r) { printf("%s -> %d (line %d)\n", #x, int(r), __LINE__); } } while (0)
int main() {
  CUdevice d; CUcontext ctx; C(cuInit(0)); C(cuDeviceGet(&d, 0)); C(cuDevicePrimaryCtxRetain(&ctx, d)); C(cuCtxSetCurrent(ctx));
  int khz = 0; cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, d);
  long long per_ms = (long long)khz;  // cycles per ms
  CUevent ev[64]; for (auto& e : ev) C(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CUstream nb, bl; C(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING)); C(cuStreamCreate(&bl, CU_STREAM_DEFAULT));
  spin<<<1, 1>>>(1); C(cuCtxSynchronize());
  // 1. costs on an idle context
  const int N = 20000;
  double t0 = now(); for (int i = 0; i < N; i++) C(cuCtxRecordEvent(ctx, ev[i & 63])); double rec = (now() - t0) / N;
  C(cuCtxSynchronize());
  t0 = now(); for (int i = 0; i < N; i++) cuEventQuery(ev[i & 63]); double q = (now() - t0) / N;
  t0 = now(); for (int i = 0; i < N; i++) C(cuEventRecord(ev[i & 63], 0)); double rec0 = (now() - t0) / N;
  C(cuCtxSynchronize());
  t0 = now(); for (int i = 0; i < N; i++) C(cuCtxSynchronize()); double sy = (now() - t0) / N;
  printf("idle: cuCtxRecordEvent %.0f ns, cuEventQuery (done) %.0f ns, cuEventRecord(0) %.0f ns, cuCtxSynchronize %.0f ns\n", rec, q, rec0, sy);
  // costs with two streams busy (3 streams created)
  spin<<<1, 1, 0, (cudaStream_t)nb>>>(200 * per_ms); spin<<<1, 1, 0, (cudaStream_t)bl>>>(200 * per_ms);
  t0 = now(); for (int i = 0; i < 2000; i++) C(cuCtxRecordEvent(ctx, ev[i & 63])); rec = (now() - t0) / 2000;
  t0 = now(); for (int i = 0; i < 2000; i++) cuEventQuery(ev[i & 63]); q = (now() - t0) / 2000;
  printf("busy: cuCtxRecordEvent %.0f ns, cuEventQuery (pending) %.0f ns\n", rec, q);
  C(cuCtxSynchronize());
  // 2. coverage: work on a non-blocking stream, a blocking one, the legacy stream, per-thread stream
  const char* names[] = {"non-blocking stream", "blocking stream", "legacy stream", "per-thread stream"};
  CUstream ss[] = {nb, bl, (CUstream)0, CU_STREAM_PER_THREAD};
  for (int k = 0; k < 4; k++) {
    spin<<<1, 1, 0, (cudaStream_t)ss[k]>>>(50 * per_ms);
    C(cuCtxRecordEvent(ctx, ev[0]));
    CUresult r1 = cuEventQuery(ev[0]);
    t0 = now(); C(cuEventSynchronize(ev[0])); double w = (now() - t0) / 1e6;
    printf("coverage, 50 ms kernel on the %s: query right after %d (600 = not ready), wait %.1f ms\n", names[k], int(r1), w);
    C(cuCtxSynchronize());
  }
  // 3. stall: 2 ms of work, the free's event, then 20 ms of newer work queued
  for (int mode = 0; mode < 2; mode++) for (int rep = 0; rep < 3; rep++) {
    spin<<<1, 1, 0, (cudaStream_t)nb>>>(2 * per_ms);
    C(cuCtxRecordEvent(ctx, ev[1]));
    for (int i = 0; i < 10; i++) spin<<<1, 1, 0, (cudaStream_t)nb>>>(2 * per_ms);
    t0 = now();
    if (mode == 0) C(cuEventSynchronize(ev[1])); else C(cuCtxSynchronize());
    printf("stall, %s: %.2f ms\n", mode == 0 ? "wait on the free's ctx event" : "cuCtxSynchronize", (now() - t0) / 1e6);
    C(cuCtxSynchronize());
  }
  return 0;
}
