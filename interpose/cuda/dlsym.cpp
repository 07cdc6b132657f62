// The dlsym hook's C++ half (the entry is dlsym_entry.S).
//
// Programs that dlopen libcuda.so.1 and dlsym its functions (libcudart asks
// for cuGetProcAddress_v2 this way, then gets everything else from it) never
// see a preloaded cu* export: dlsym on a handle searches only that object.
// So for "cu[A-Z]*" lookups on a specific handle we let the real dlsym
// answer and, if the answer is a libcuda entry point we hook, return our
// hook instead. Nothing here initialises CUDA, NVML or cudart; names we do
// not hook (cuGetExportTable, cuInit, ...) come back untouched.
#include <dlfcn.h>

#include "interpose/cuda/contexts.hpp"
#include "interpose/cuda/driver.hpp"
#include "interpose/runtime.hpp"

extern "C" {
// Read by dlsym_entry.S; hidden so the entry reaches it without the GOT.
__attribute__((visibility("hidden"))) void* gpupool_real_dlsym_ptr = nullptr;
__attribute__((visibility("hidden"))) void* gpupool_resolve_real_dlsym();
__attribute__((visibility("hidden"))) void* gpupool_dlsym_cu(void* handle,
                                                             const char* name) noexcept;
}

namespace {

// Set while this thread is inside our lookup: a dlsym that our own lookup
// triggers (dlopen of libcuda runs its constructors) goes straight through.
thread_local bool t_inside = false;

}  // namespace

// Not instrumented: sanitizer runtimes look up their interceptors' targets
// with dlsym(RTLD_NEXT, ...) while they initialise, which lands here before
// instrumented code may run.
#define GPUPOOL_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))

GPUPOOL_NO_SANITIZE void* gpupool_resolve_real_dlsym() {
  void* p = __atomic_load_n(&gpupool_real_dlsym_ptr, __ATOMIC_ACQUIRE);
  if (p) return p;
  // RTLD_NEXT from here is the object after us: libc (glibc >= 2.34) or
  // libdl. Newest version first; both name the same function in 2.34+.
  p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
  if (!p) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
  if (!p) dlerror();
  // Never our own entry: that would recurse forever.
  if (p == reinterpret_cast<void*>(&dlsym)) p = nullptr;
  if (p) __atomic_store_n(&gpupool_real_dlsym_ptr, p, __ATOMIC_RELEASE);
  return p;
}

void* gpupool_dlsym_cu(void* handle, const char* name) noexcept {
  auto real = reinterpret_cast<gpupool::cuda::DlsymFn>(gpupool_resolve_real_dlsym());
  if (!real) return nullptr;
  void* r = real(handle, name);
  // Only "cu" + an upper-case letter: cublas*, cudnn*, cufft* are not ours.
  if (!r || name[2] < 'A' || name[2] > 'Z' || t_inside) return r;
  t_inside = true;
  void* hook = nullptr;
  // Only a libcuda the program already loaded: its entry points are the
  // only ones we could substitute, and we must not load a driver here.
  try {
    if (gpupool::cuda::driver_if_loaded()) {
      hook = gpupool::cuda::hook_for(r);
      gpupool::cuda::solo_note_symbol(name, 0);
    }
  } catch (...) {
    gpupool::internal_failure("dlsym");  // the program gets the driver's own function
  }
  t_inside = false;
  return hook ? hook : r;
}

namespace gpupool::cuda {

DlsymFn real_dlsym() { return reinterpret_cast<DlsymFn>(gpupool_resolve_real_dlsym()); }

}  // namespace gpupool::cuda

#if !defined(__x86_64__)
// Without the assembly entry RTLD_NEXT lookups through this wrapper are
// resolved relative to libgpupool instead of the caller: a known limitation
// on these architectures.
extern "C" __attribute__((visibility("default"))) void* dlsym(void* handle, const char* name) {
  if (handle == RTLD_NEXT || handle == RTLD_DEFAULT || !name || name[0] != 'c' || name[1] != 'u') {
    auto real = gpupool::cuda::real_dlsym();
    return real ? real(handle, name) : nullptr;
  }
  return gpupool_dlsym_cu(handle, name);
}
#endif
