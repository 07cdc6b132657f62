// The solo rule on the real driver (interpose/cuda/contexts.hpp): while a
// driver-API program has one context, one allocating thread and no stream
// of its own, gpupool's safe reuse hands a freed block out again at once,
// trusting the legacy default stream's order; the first stream ends the
// rule after synchronizing the context. Run without gpupool and under it
// (GPUPOOL_LOG=debug: the line "freed blocks wait for the device from now
// on (...)" says what ended the rule).
//
//   nvcc -ptx -arch=sm_XX -o slow.ptx stream_order_probe.cu             (the kernel)
//   nvcc -DPROBE_HOST -o probe stream_order_probe.cu -lcuda              (the program)
//   probe slow.ptx            driver API only: the rule holds until step 2
//   probe slow.ptx --cudart   also initialises cudart first, which asks the
//                             driver for per-thread entry points: no rule
//
// 1. A slow kernel writes 0xEE into A on the legacy stream; A is freed and
//    B allocated (A's block under the rule) and set to 0x22 on the legacy
//    stream: queued behind the kernel, B ends 0x22.
// 3. Alloc+free pairs with no synchronization, ns a pair.
// 2. The same as 1 with C and D, then a non-blocking stream is created and
//    D set to 0x33 on it: D ends 0x33 only if the kernel on C was done
//    before the stream existed (without the end's synchronization the
//    kernel lands last).
// One line per check ("ok"/"FAILED"); exit 1 if any failed.
#ifndef PROBE_HOST

extern "C" __global__ void slow_fill(unsigned char* p, unsigned long long n, unsigned char v,
                                     long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += gridDim.x * blockDim.x)
    p[i] = v;
}

#else

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <vector>

static int g_failed = 0;
static CUfunction g_slow;

#define CU(call)                                                          \
  do {                                                                    \
    CUresult r_ = (call);                                                 \
    if (r_ != CUDA_SUCCESS) {                                             \
      printf("%s:%d: %s: %d\n", __FILE__, __LINE__, #call, int(r_));      \
      exit(2);                                                            \
    }                                                                     \
  } while (0)

static void check(bool ok, const char* what) {
  printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) g_failed = 1;
}

static bool all(CUdeviceptr p, size_t n, unsigned char v) {
  std::vector<unsigned char> h(n);
  CU(cuMemcpyDtoH(h.data(), p, n));
  for (size_t i = 0; i < n; ++i)
    if (h[i] != v) return false;
  return true;
}

static void slow(CUdeviceptr p, size_t n, unsigned char v) {
  unsigned long long nn = n;
  long long cycles = 50LL * 1000 * 1000;  // about 25 ms at 2 GHz
  void* args[] = {&p, &nn, &v, &cycles};
  CU(cuLaunchKernel(g_slow, 132, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
}

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s KERNEL.ptx [--cudart]\n", argv[0]);
    return 2;
  }
  if (argc > 2 && !strcmp(argv[2], "--cudart")) cudaFree(0);
  FILE* f = fopen(argv[1], "rb");
  if (!f) return 2;
  std::vector<char> ptx(1 << 20);
  ptx.resize(fread(ptx.data(), 1, ptx.size() - 1, f) + 1);
  fclose(f);
  CU(cuInit(0));
  CUdevice dev;
  CU(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  CU(cuCtxSetCurrent(ctx));
  CUmodule mod;
  CU(cuModuleLoadData(&mod, ptx.data()));
  CU(cuModuleGetFunction(&g_slow, mod, "slow_fill"));
  const size_t n = 8 << 20;

  CUdeviceptr a, b;
  CU(cuMemAlloc(&a, n));
  slow(a, n, 0xEE);
  CU(cuMemFree(a));
  CU(cuMemAlloc(&b, n));
  printf("1. reused at once: %s\n", a == b ? "yes" : "no");
  CU(cuMemsetD8Async(b, 0x22, n, nullptr));
  CU(cuCtxSynchronize());
  check(all(b, n, 0x22), "1. legacy stream after a reused block's old kernel");
  CU(cuMemFree(b));

  const int pairs = 200000;
  CUdeviceptr p;
  CU(cuMemAlloc(&p, 1 << 20));
  CU(cuMemFree(p));
  const double t0 = now();
  for (int i = 0; i < pairs; ++i) {
    CU(cuMemAlloc(&p, 1 << 20));
    CU(cuMemFree(p));
  }
  printf("3. alloc+free pairs (1 MiB): %.0f ns a pair\n", (now() - t0) / pairs * 1e9);

  CUdeviceptr c, d;
  CU(cuMemAlloc(&c, n));
  slow(c, n, 0xEE);
  CU(cuMemFree(c));
  CU(cuMemAlloc(&d, n));
  printf("2. reused at once: %s\n", c == d ? "yes" : "no");
  CUstream s;
  CU(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CU(cuMemsetD8Async(d, 0x33, n, s));
  CU(cuCtxSynchronize());
  check(all(d, n, 0x33), "2. new non-blocking stream after a reused block's old kernel");
  CU(cuMemFree(d));
  CU(cuStreamDestroy(s));
  return g_failed;
}

#endif
