#include "interpose/cuda_driver.hpp"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

namespace gpupool::cuda {
namespace {

constexpr const char* kLibcuda = "libcuda.so.1";

struct Substitute {
  void* real;
  void* hook;
};

#define GPUPOOL_COUNT(name, field) +1
constexpr std::size_t kHookCount = 0 GPUPOOL_CUDA_HOOKS(GPUPOOL_COUNT);
#undef GPUPOOL_COUNT

// Written once under g_init_mu, then published through g_driver; never freed
// (hooks run during exit).
Driver g_storage;
Substitute g_table[kHookCount];
std::size_t g_table_size = 0;
std::atomic<const Driver*> g_driver{nullptr};
std::mutex g_init_mu;
std::atomic<std::size_t> g_substitutions{0};

// dlopen failures leave a message that the program's next dlerror() would
// read as its own: clear it.
void* open_libcuda(bool may_load) {
  void* h = dlopen(kLibcuda, RTLD_NOW | RTLD_NOLOAD);
  if (!h && may_load) h = dlopen(kLibcuda, RTLD_NOW | RTLD_LOCAL);
  if (!h) dlerror();
  return h;
}

const Driver* init(bool may_load) {
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  DlsymFn sym = real_dlsym();
  if (!sym) return nullptr;
  std::lock_guard lock(g_init_mu);
  if (const Driver* d = g_driver.load(std::memory_order_acquire)) return d;
  void* h = open_libcuda(may_load);
  if (!h) return nullptr;
  Driver& d = g_storage;
  d.handle = h;
  auto get = [&](const char* name) {
    void* p = sym(h, name);
    if (!p) dlerror();  // an older driver lacks some exports
    return p;
  };
  std::size_t i = 0, n = 0;
#define GPUPOOL_RESOLVE_HOOK(name, field)                                       \
  d.field = reinterpret_cast<decltype(d.field)>(get(#name));                    \
  if (d.field) {                                                                \
    bool dup = false; /* aliases: the first export of an address wins */        \
    for (std::size_t k = 0; k < n; ++k)                                         \
      if (g_table[k].real == reinterpret_cast<void*>(d.field)) dup = true;      \
    if (!dup) g_table[n++] = {reinterpret_cast<void*>(d.field),                 \
                              const_cast<void*>(kHookAddresses[i])};            \
  }                                                                             \
  ++i;
  GPUPOOL_CUDA_HOOKS(GPUPOOL_RESOLVE_HOOK)
#undef GPUPOOL_RESOLVE_HOOK
#define GPUPOOL_RESOLVE_USED(name, field) d.field = reinterpret_cast<decltype(d.field)>(get(#name));
  GPUPOOL_CUDA_USED(GPUPOOL_RESOLVE_USED)
#undef GPUPOOL_RESOLVE_USED
  g_table_size = n;
  g_driver.store(&d, std::memory_order_release);
  return &d;
}

}  // namespace

const Driver* driver() { return init(true); }
const Driver* driver_if_loaded() { return init(false); }

void* hook_for(void* real_function) {
  if (!real_function) return nullptr;
  if (!g_driver.load(std::memory_order_acquire)) return nullptr;
  for (std::size_t k = 0; k < g_table_size; ++k)
    if (g_table[k].real == real_function) {
      g_substitutions.fetch_add(1, std::memory_order_relaxed);
      return g_table[k].hook;
    }
  return nullptr;
}

std::size_t substitutions() { return g_substitutions.load(std::memory_order_relaxed); }

}  // namespace gpupool::cuda

namespace gpupool::cuda {
void driver_fork_prepare() { g_init_mu.lock(); }
void driver_fork_parent() { g_init_mu.unlock(); }
void driver_fork_child() { g_init_mu.unlock(); }
}  // namespace gpupool::cuda
