// The solo rule on the real driver (interpose/cuda/contexts.hpp): while a
// program has one context, one allocating thread and no stream of its own,
// gpupool's safe reuse hands a freed block out again at once, trusting the
// legacy default stream's order; the first stream ends the rule after the
// lent blocks' old work is done. Run without gpupool and under it (with
// GPUPOOL_LOG=debug, whose "freed blocks wait for the device from now on
// (...)" line says what ended the rule, if anything did), built as is and
// with --default-stream per-thread.
//
// 1. A slow kernel writes 0xEE into A on the default stream; A is freed and
//    B allocated (A's block under the rule) and set to 0x22 on the default
//    stream: queued behind the kernel, B ends 0x22.
// 2. The same with C and D, then a non-blocking stream is created and D is
//    set to 0x33 on it: D ends 0x33 only if the kernel on C was done before
//    the stream existed (without the rule's end wait, the kernel lands last).
// 3. A stream-free allocation loop: pairs per second, to show the rule on
//    the hit path.
// Prints one line per check ("ok"/"FAILED") and exits 1 if any failed.
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <vector>

__global__ void slow_fill(unsigned char* p, size_t n, unsigned char v, long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] = v;
}

static int g_failed = 0;

static void check(bool ok, const char* what) {
  printf("%s: %s\n", what, ok ? "ok" : "FAILED");
  if (!ok) g_failed = 1;
}

#define CU(call)                                                                   \
  do {                                                                             \
    cudaError_t e_ = (call);                                                       \
    if (e_ != cudaSuccess) {                                                       \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      return 2;                                                                    \
    }                                                                              \
  } while (0)

static bool all(const unsigned char* p, size_t n, unsigned char v) {
  std::vector<unsigned char> h(n);
  if (cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  for (size_t i = 0; i < n; ++i)
    if (h[i] != v) return false;
  return true;
}

static double now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main() {
  const size_t n = 8 << 20;
  const long long cycles = 50LL * 1000 * 1000;  // about 25 ms at 2 GHz
  CU(cudaFree(0));

  unsigned char *a = nullptr, *b = nullptr;
  CU(cudaMalloc(&a, n));
  slow_fill<<<132, 256>>>(a, n, 0xEE, cycles);
  CU(cudaFree(a));
  CU(cudaMalloc(&b, n));
  printf("1. reused at once: %s\n", a == b ? "yes" : "no");
  CU(cudaMemsetAsync(b, 0x22, n, 0));
  CU(cudaDeviceSynchronize());
  check(all(b, n, 0x22), "1. default stream after a reused block's old kernel");
  CU(cudaFree(b));

  // 3 before 2, while no stream exists.
  const int pairs = 200000;
  void* p = nullptr;
  CU(cudaMalloc(&p, 1 << 20));
  CU(cudaFree(p));
  double t0 = now();
  for (int i = 0; i < pairs; ++i) {
    CU(cudaMalloc(&p, 1 << 20));
    CU(cudaFree(p));
  }
  printf("3. alloc+free pairs (1 MiB): %.0f ns a pair\n", (now() - t0) / pairs * 1e9);

  unsigned char *c = nullptr, *d = nullptr;
  CU(cudaMalloc(&c, n));
  slow_fill<<<132, 256>>>(c, n, 0xEE, cycles);
  CU(cudaFree(c));
  CU(cudaMalloc(&d, n));
  printf("2. reused at once: %s\n", c == d ? "yes" : "no");
  cudaStream_t s;
  CU(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CU(cudaMemsetAsync(d, 0x33, n, s));
  CU(cudaDeviceSynchronize());
  check(all(d, n, 0x33), "2. new non-blocking stream after a reused block's old kernel");
  CU(cudaFree(d));
  CU(cudaStreamDestroy(s));
  return g_failed;
}
