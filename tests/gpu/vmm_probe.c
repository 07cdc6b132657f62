/* What the virtual memory API answers and costs on a real GPU: the behaviour
   gpupool's virtual-memory units (interpose/cuda/vmm.hpp) and the stand-in
   driver (tests/cuda/standin.cpp) follow. No gpupool: run it alone.
     cc -O2 -o vmm_probe tests/gpu/vmm_probe.c -I$CUDA/include -L$CUDA/lib64/stubs -lcuda
   Prints one line per answer ("answer NAME = CODE") and the mean cost of
   each call of XLA's allocate/free sequence at several sizes.
   VMM_PROBE_POSIX_FD=1: the allocations made exportable as POSIX file
   descriptors (as gpupool's range granules are where the device can), and
   what an export and an import of a 2 MiB one cost. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define CK(x)                                \
  do {                                       \
    CUresult r_ = (x);                       \
    if (r_) {                                \
      printf("FAIL %s = %d\n", #x, (int)r_); \
      return 1;                              \
    }                                        \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static CUmemAllocationProp prop_of(int dev) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  return p;
}
static CUmemAccessDesc access_of(int dev) {
  CUmemAccessDesc a;
  memset(&a, 0, sizeof a);
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = dev;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  return a;
}
#define ANSWER(name, call) printf("answer %-40s = %d\n", name, (int)(call))

int main(void) {
  CUdevice dev;
  CUcontext ctx;
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUmemAllocationProp prop = prop_of(0);
  const int posix_fd = getenv("VMM_PROBE_POSIX_FD") && atoi(getenv("VMM_PROBE_POSIX_FD"));
  if (posix_fd) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  printf("posix descriptors requested: %d\n", posix_fd);
  CUmemAccessDesc acc = access_of(0);
  size_t gran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  printf("granularity %zu\n", gran);

  /* Costs: XLA's sequence, 200 rounds per size. */
  size_t sizes[] = {2 * MIB, 8 * MIB, 64 * MIB, 512 * MIB};
  for (int s = 0; s < 4; ++s) {
    double t[8] = {0};
    const int n = sizes[s] >= 512 * MIB ? 20 : 200;
    for (int i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle h;
      CUdeviceptr va;
      double a = now_us();
      CK(cuMemCreate(&h, sizes[s], &prop, 0));
      double b = now_us();
      t[0] += b - a;
      CK(cuMemAddressReserve(&va, sizes[s], 0, 0, 0));
      a = now_us();
      t[1] += a - b;
      CK(cuMemMap(va, sizes[s], 0, h, 0));
      b = now_us();
      t[2] += b - a;
      CK(cuMemSetAccess(va, sizes[s], &acc, 1));
      a = now_us();
      t[3] += a - b;
      CK(cuCtxSynchronize());
      b = now_us();
      t[4] += b - a;
      CK(cuMemUnmap(va, sizes[s]));
      a = now_us();
      t[5] += a - b;
      CK(cuMemRelease(h));
      b = now_us();
      t[6] += b - a;
      CK(cuMemAddressFree(va, sizes[s]));
      a = now_us();
      t[7] += a - b;
    }
    printf(
        "cost %4zu MiB us: create %.1f reserve %.1f map %.1f setaccess %.1f ctxsync %.1f "
        "unmap %.1f release %.1f addrfree %.1f total %.1f\n",
        sizes[s] / MIB, t[0] / n, t[1] / n, t[2] / n, t[3] / n, t[4] / n, t[5] / n, t[6] / n,
        t[7] / n, (t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7]) / n);
  }

  if (posix_fd) {
    double te = 0, ti = 0;
    const int n = 200;
    for (int i = 0; i < n; ++i) {
      CUmemGenericAllocationHandle h, hi;
      int fd = -1;
      CK(cuMemCreate(&h, 2 * MIB, &prop, 0));
      double a = now_us();
      CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      double b = now_us();
      CK(cuMemImportFromShareableHandle(&hi, (void*)(long)fd,
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      double c = now_us();
      te += b - a;
      ti += c - b;
      close(fd);
      CK(cuMemRelease(hi));
      CK(cuMemRelease(h));
    }
    printf("cost 2 MiB us: export %.1f import %.1f\n", te / n, ti / n);
  }

  /* Answers. */
  CUmemGenericAllocationHandle h, h2;
  CUdeviceptr va, va2;
  ANSWER("create 3 MiB", cuMemCreate(&h, 3 * MIB, &prop, 0));
  CK(cuMemCreate(&h, 8 * MIB, &prop, 0));
  CK(cuMemAddressReserve(&va, 16 * MIB, 0, 0, 0));
  ANSWER("map half a handle", cuMemMap(va, 4 * MIB, 0, h, 0));
  CK(cuMemMap(va, 8 * MIB, 0, h, 0));
  CK(cuMemSetAccess(va, 8 * MIB, &acc, 1));
  ANSWER("set access again", cuMemSetAccess(va, 8 * MIB, &acc, 1));
  ANSWER("cuMemFree of a mapping", cuMemFree(va));
  ANSWER("retain handle of mapped address", cuMemRetainAllocationHandle(&h2, (void*)va));
  printf("answer %-40s = %d\n", "retained handle is the same", h2 == h);
  CK(cuMemRelease(h2));
  ANSWER("address free while mapped", cuMemAddressFree(va, 16 * MIB));
  ANSWER("release while mapped", cuMemRelease(h));
  ANSWER("memset after release, still mapped", cuMemsetD8(va, 1, 8 * MIB));
  ANSWER("unmap", cuMemUnmap(va, 8 * MIB));
  ANSWER("unmap again", cuMemUnmap(va, 8 * MIB));
  ANSWER("release again", cuMemRelease(h));
  ANSWER("set access unmapped", cuMemSetAccess(va, 8 * MIB, &acc, 1));
  ANSWER("address free", cuMemAddressFree(va, 16 * MIB));
  ANSWER("address free again", cuMemAddressFree(va, 16 * MIB));
  ANSWER("unmap of a freed reservation", cuMemUnmap(va, 8 * MIB));

  /* Memory outlives the created context that made it. */
  CUcontext c2;
  CK(cuCtxCreate(&c2, NULL, 0, dev));
  CK(cuMemCreate(&h, 4 * MIB, &prop, 0));
  CK(cuMemAddressReserve(&va2, 4 * MIB, 0, 0, 0));
  CK(cuMemMap(va2, 4 * MIB, 0, h, 0));
  CK(cuMemSetAccess(va2, 4 * MIB, &acc, 1));
  CK(cuMemsetD8(va2, 7, 4 * MIB));
  CK(cuCtxDestroy(c2));
  CK(cuCtxSetCurrent(ctx));
  unsigned char byte = 0;
  ANSWER("read after its context ended", cuMemcpyDtoH(&byte, va2 + 1234, 1));
  printf("answer %-40s = %d\n", "byte read (7 expected)", byte);
  ANSWER("unmap after its context ended", cuMemUnmap(va2, 4 * MIB));
  ANSWER("release after its context ended", cuMemRelease(h));
  ANSWER("address free after its context ended", cuMemAddressFree(va2, 4 * MIB));
  printf("done\n");
  return 0;
}
