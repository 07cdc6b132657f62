/* What the real driver does with context identity, which gpupool's context
   records rely on (interpose/cuda/contexts.cpp). Run on the GPU machine,
   without gpupool:
     ctx_lifetime_probe
   prints one line per fact:
     - cuCtxGetId(NULL) answers the current context's id (and what it
       answers with no current context, and for a destroyed current one);
     - cuCtxGetId on a destroyed handle (error, or a crash would show here);
     - whether a handle comes back after cuCtxDestroy / cuCtxDetach, and
       whether its id does;
     - whether the primary context keeps its handle and id across a reset
       and across a release to zero;
     - the cost of cuCtxGetCurrent and cuCtxGetId(NULL) per call, measured
       in 11 alternating phases of one process (medians). */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define SAY(...) (printf(__VA_ARGS__), fflush(stdout))

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static int by_value(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static unsigned long long id_of(CUcontext c, CUresult* r) {
  unsigned long long id = 0;
  *r = cuCtxGetId(c, &id);
  return id;
}

int main(void) {
  CUresult r;
  if (cuInit(0) != CUDA_SUCCESS) return SAY("cuInit failed\n"), 1;
  CUdevice dev;
  cuDeviceGet(&dev, 0);
  unsigned long long id = id_of(NULL, &r);
  SAY("no current context: cuCtxGetId(NULL) -> %d\n", (int)r);

  CUcontext a, b;
  cuCtxCreate(&a, NULL, 0, dev);
  unsigned long long ida = id_of(NULL, &r);
  SAY("created A=%p: cuCtxGetId(NULL) -> %d id %llu; cuCtxGetId(A) id %llu\n", (void*)a, (int)r,
      ida, id_of(a, &r));
  CUdeviceptr p = 0;
  cuMemAlloc(&p, 1 << 20);
  r = cuCtxDestroy(a);
  SAY("cuCtxDestroy(A) -> %d\n", (int)r);
  id = id_of(a, &r);
  SAY("after destroy: cuCtxGetId(A) -> %d id %llu\n", (int)r, id);
  id = id_of(NULL, &r);
  CUcontext cur = NULL;
  cuCtxGetCurrent(&cur);
  SAY("after destroy: current %p, cuCtxGetId(NULL) -> %d id %llu\n", (void*)cur, (int)r, id);
  r = cuMemFree(p);
  SAY("cuMemFree of A's pointer after destroy -> %d\n", (int)r);
  cuCtxCreate(&b, NULL, 0, dev);
  SAY("created B=%p (same handle as A: %d), id %llu\n", (void*)b, a == b, id_of(b, &r));
  r = cuMemFree(p);
  SAY("cuMemFree of A's pointer with B current -> %d\n", (int)r);
  unsigned long long idb = id_of(b, &r);

  /* Detach: attach count 2, detach once keeps it, twice destroys. */
  CUcontext att = NULL;
  r = cuCtxAttach(&att, 0);
  SAY("cuCtxAttach -> %d (%p, same as B: %d)\n", (int)r, (void*)att, att == b);
  r = cuCtxDetach(b);
  id = id_of(b, &r);
  SAY("first cuCtxDetach: B alive: cuCtxGetId(B) -> %d id %llu (same %d)\n", (int)r, id, id == idb);
  r = cuCtxDetach(b);
  SAY("second cuCtxDetach -> %d\n", (int)r);
  id = id_of(b, &r);
  SAY("after second detach: cuCtxGetId(B) -> %d\n", (int)r);
  cuCtxGetCurrent(&cur);
  SAY("after second detach: current %p\n", (void*)cur);
  CUcontext c;
  cuCtxCreate(&c, NULL, 0, dev);
  SAY("created C=%p (same handle as B: %d), id %llu (B's was %llu)\n", (void*)c, c == b,
      id_of(c, &r), idb);
  cuCtxDestroy(c);

  /* Primary context: reset and release to zero. */
  CUcontext pc, pc2;
  cuDevicePrimaryCtxRetain(&pc, dev);
  cuCtxSetCurrent(pc);
  unsigned long long idp = id_of(pc, &r);
  cuMemAlloc(&p, 1 << 20);
  cuDevicePrimaryCtxReset(dev);
  id = id_of(pc, &r);
  SAY("primary after reset: cuCtxGetId -> %d id %llu (before %llu)\n", (int)r, id, idp);
  id = id_of(NULL, &r);
  SAY("primary after reset, still current: cuCtxGetId(NULL) -> %d id %llu\n", (int)r, id);
  r = cuMemFree(p);
  SAY("cuMemFree of the reset primary's pointer -> %d\n", (int)r);
  cuDevicePrimaryCtxRetain(&pc2, dev);
  cuCtxSetCurrent(pc2);
  SAY("primary retained again: same handle %d, id %llu (before %llu); cuCtxGetId(NULL) id %llu\n",
      pc == pc2, id_of(pc2, &r), idp, id_of(NULL, &r));
  idp = id_of(pc2, &r);
  /* Release to zero twice: once while current to this thread, once not. */
  for (int round = 0; round < 2; ++round) {
    cuMemAlloc(&p, 1 << 20);
    if (round == 1) cuCtxSetCurrent(NULL);
    /* Every retain so far (a reset keeps the count). */
    unsigned flags = 0;
    int active = 1, releases = 0;
    while (active && releases < 8) {
      cuDevicePrimaryCtxRelease(dev);
      ++releases;
      cuDevicePrimaryCtxGetState(dev, &flags, &active);
    }
    id = id_of(pc2, &r);
    SAY("primary released to zero (%s) after %d releases: active %d, cuCtxGetId -> %d id %llu\n",
        round ? "not current" : "current", releases, active, (int)r, id);
    cuDevicePrimaryCtxRetain(&pc2, dev);
    cuCtxSetCurrent(pc2);
    CUcontext owner = NULL;
    CUresult ra = cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p);
    SAY("primary retained again: id %llu (before %llu); its earlier pointer: attribute -> %d, "
        "cuMemFree -> %d\n",
        id_of(pc2, &r), idp, (int)ra, (int)cuMemFree(p));
    idp = id_of(pc2, &r);
  }

  /* Cost per call, alternating phases. */
  enum { kPhases = 11, kCalls = 2000000 };
  double get_current[kPhases], get_id[kPhases];
  for (int ph = 0; ph < kPhases; ++ph) {
    double t0 = now_ns();
    for (int i = 0; i < kCalls; ++i) {
      CUcontext x;
      cuCtxGetCurrent(&x);
      __asm__ volatile("" ::"r"(x) : "memory");
    }
    double t1 = now_ns();
    for (int i = 0; i < kCalls; ++i) {
      unsigned long long x;
      cuCtxGetId(NULL, &x);
      __asm__ volatile("" ::"r"(x) : "memory");
    }
    double t2 = now_ns();
    get_current[ph] = (t1 - t0) / kCalls;
    get_id[ph] = (t2 - t1) / kCalls;
  }
  qsort(get_current, kPhases, sizeof(double), by_value);
  qsort(get_id, kPhases, sizeof(double), by_value);
  SAY("cost: cuCtxGetCurrent %.2f ns (%.2f-%.2f), cuCtxGetId(NULL) %.2f ns (%.2f-%.2f)\n",
      get_current[kPhases / 2], get_current[0], get_current[kPhases - 1], get_id[kPhases / 2],
      get_id[0], get_id[kPhases - 1]);
  return 0;
}
