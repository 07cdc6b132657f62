// Scenarios of the process around the pool: fork, exit, and finding the
// driver's entry points with dlsym and cuGetProcAddress.
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#ifdef CLIENT_LINKED
extern "C" int client_call_next(void);  // next_a.c
#endif

#include "client.hpp"

namespace client {

// fork() while another thread is inside the pool: the child allocates and
// frees without deadlock. (A hang fails the test by its timeout.)
void scenario_fork() {
  CUcontext ctx = setup();
  CUdeviceptr warm;  // gpupool starts (and registers its fork handlers) here
  OK(api.mem_alloc(&warm, 4096));
  OK(api.mem_free(warm));
  // Large blocks the parent keeps across the forks (with GPUPOOL_SPLIT,
  // two pieces of one segment): their bytes stay the parent's.
  CUdeviceptr seg = 0, keep[2] = {};
  OK(api.mem_alloc(&seg, 8 << 20));
  OK(api.mem_free(seg));
  OK(api.ctx_sync());
  for (int i = 0; i < 2; ++i) {
    OK(api.mem_alloc(&keep[i], (3 << 20) + 100));
    fill(keep[i], (3 << 20) + 100, static_cast<unsigned char>(0x70 + i));
  }
  std::atomic<bool> stop{false};
  std::thread worker([&] {
    OK(api.ctx_set_current(ctx));
    while (!stop.load()) {
      CUdeviceptr p;
      OK(api.mem_alloc(&p, 4096));
      OK(api.mem_free(p));
      void* h;
      OK(api.host_alloc(&h, 4096, 0));
      OK(api.free_host(h));
    }
  });
  for (int i = 0; i < 30; ++i) {
    const pid_t pid = fork();
    // A failed fork() says why (ENOMEM: the parent's commit charge above RAM).
    if (pid < 0) fprintf(stderr, "fork %d: %s\n", i, strerror(errno));
    CHECK(pid >= 0);
    if (pid == 0) {
      for (int k = 0; k < 50; ++k) {
        CUdeviceptr p;
        if (api.mem_alloc(&p, 4096 + k) != CUDA_SUCCESS) _exit(2);
        if (api.mem_free(p) != CUDA_SUCCESS) _exit(3);
        if (k % 10 == 0) {  // a large one too (a piece, when splitting)
          if (api.mem_alloc(&p, (2 << 20) + 512 * k) != CUDA_SUCCESS) _exit(6);
          if (api.mem_free(p) != CUDA_SUCCESS) _exit(7);
        }
        void* h;
        if (api.host_alloc(&h, 4096, 0) != CUDA_SUCCESS) _exit(4);
        if (api.free_host(h) != CUDA_SUCCESS) _exit(5);
      }
      free_held();
      _exit(0);
    }
    int status = 0;
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
  }
  stop = true;
  worker.join();
  for (int i = 0; i < 2; ++i) {
    CHECK(all_equal(keep[i], (3 << 20) + 100, static_cast<unsigned char>(0x70 + i)));
    OK(api.mem_free(keep[i]));
  }
}

// Exit: blocks alive and held at exit, atexit handlers and a static
// destructor that free memory, a thread still allocating while the process
// exits. No crash, no hang; frees keep succeeding.
namespace {

CUdeviceptr g_exit_early = 0, g_exit_late = 0, g_exit_static = 0;
void* g_exit_host = nullptr;

struct StaticFreer {
  ~StaticFreer() {
    if (g_exit_static && api.mem_free(g_exit_static) != CUDA_SUCCESS) _exit(7);
  }
};

}  // namespace

void scenario_exit() {
  static StaticFreer freer;
  // Registered before gpupool starts: runs after its exit handler.
  atexit([] {
    if (api.mem_free(g_exit_early) != CUDA_SUCCESS) _exit(5);
    if (api.free_host(g_exit_host) != CUDA_SUCCESS) _exit(6);
  });
  CUcontext ctx = setup();
  OK(api.mem_alloc(&g_exit_early, 10000));
  OK(api.host_alloc(&g_exit_host, 10000, 0));
  OK(api.mem_alloc(&g_exit_static, 20000));
  OK(api.mem_alloc(&g_exit_late, 30000));
  for (int i = 0; i < 10; ++i) {  // held blocks at exit
    CUdeviceptr p;
    OK(api.mem_alloc(&p, 1000 * (i + 1)));
    OK(api.mem_free(p));
  }
  CUdeviceptr alive;
  OK(api.mem_alloc(&alive, 40000));  // never freed
  // Registered after: runs before gpupool's exit handler.
  atexit([] {
    if (api.mem_free(g_exit_late) != CUDA_SUCCESS) _exit(4);
  });
  std::thread([ctx] {
    api.ctx_set_current(ctx);
    for (;;) {
      CUdeviceptr p;
      if (api.mem_alloc(&p, 777) == CUDA_SUCCESS) api.mem_free(p);
    }
  }).detach();
  usleep(1000);
}

// dlsym and cuGetProcAddress: only our hooks replace driver entry points,
// everything else comes back untouched.
void scenario_lookup() {
  const bool preloaded = dlsym(RTLD_DEFAULT, "gpupool_version") != nullptr;
#ifndef CLIENT_LINKED
  CHECK(dlsym(g_handle, "cuGetExportTable") == api.own("cuGetExportTable"));
  void* alloc = dlsym(g_handle, "cuMemAlloc_v2");
  CHECK(dlerror() == nullptr);  // a successful lookup leaves no error behind
  CHECK((alloc != api.own("cuMemAlloc_v2")) == preloaded);
  CHECK(dlsym(g_handle, "cuNoSuchFunction") == nullptr);
  CHECK(dlerror() != nullptr);
  CHECK(dlsym(g_handle, "standin_counters") == reinterpret_cast<void*>(api.counters));

  auto gpa = reinterpret_cast<GetProcV2>(dlsym(g_handle, "cuGetProcAddress_v2"));
  CHECK((reinterpret_cast<void*>(gpa) != api.own("cuGetProcAddress_v2")) == preloaded);
  void* f = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  OK(gpa("cuMemAlloc", &f, 3020, 0, &status));
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK((f != api.own("cuMemAlloc_v2")) == preloaded);
  OK(gpa("cuGetProcAddress", &f, 11030, 0, nullptr));
  CHECK((f != api.own("cuGetProcAddress")) == preloaded);
  auto gpa1 = reinterpret_cast<GetProcV1>(f);
  void* f1 = nullptr;
  OK(gpa1("cuMemFreeHost", &f1, 2000, 0));
  CHECK((f1 != api.own("cuMemFreeHost")) == preloaded);
  OK(gpa("cuDevicePrimaryCtxRelease", &f, 7000, 0, nullptr));
  CHECK((f != api.own("cuDevicePrimaryCtxRelease")) == preloaded);
  // Entry points we do not hook, and per-thread variants, stay the driver's.
  OK(gpa("cuMemsetD8Async", &f, 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, nullptr));
  CHECK(f == api.own("cuMemsetD8Async_ptsz"));
  OK(gpa("cuGetExportTable", &f, 3000, 0, nullptr));
  CHECK(f == api.own("cuGetExportTable"));
  f = reinterpret_cast<void*>(1);
  CHECK_EQ(gpa("cuNoSuchFunction", &f, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK(f == nullptr);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  CHECK_EQ(gpa("cuMemAlloc", &f, 2000, 0, &status), CUDA_ERROR_NOT_FOUND);
  CHECK_EQ(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
#else
  CHECK((reinterpret_cast<void*>(&cuMemAlloc_v2) != api.own("cuMemAlloc_v2")) == preloaded);
  // RTLD_NEXT keeps the caller: libclient_next_a's lookup of its own symbol
  // must find libclient_next_b's definition, not start from libgpupool.
  CHECK_EQ(client_call_next(), 2);
  CHECK(dlsym(RTLD_DEFAULT, "client_next_probe") != nullptr);
#endif
}

}  // namespace client
