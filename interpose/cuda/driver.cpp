#include "interpose/cuda/driver.hpp"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstring>

namespace gpupool::cuda {
namespace {

constexpr const char* kLibcuda = "libcuda.so.1";

struct Substitute {
  void* real;
  void* hook;
};

#define GPUPOOL_COUNT(name, field, type) +1
constexpr std::size_t kHookCount = 0 GPUPOOL_CUDA_HOOKS(GPUPOOL_COUNT);
#undef GPUPOOL_COUNT

// Resolved once and published with one atomic store; never freed (hooks run
// during exit). No lock: resolution runs dlopen/dlsym, which take the
// loader's lock, and may itself run inside a dlsym hook call or a library
// constructor; two threads racing both resolve and the first to publish wins.
struct Resolved {
  Driver driver;
  Substitute table[kHookCount];
  std::size_t size = 0;
};
std::atomic<Resolved*> g_resolved{nullptr};

// dlopen failures leave a message that the program's next dlerror() would
// read as its own: clear it.
void* open_libcuda(bool may_load) {
  void* h = dlopen(kLibcuda, RTLD_NOW | RTLD_NOLOAD);
  if (!h && may_load) h = dlopen(kLibcuda, RTLD_NOW | RTLD_LOCAL);
  if (!h) dlerror();
  return h;
}

const Driver* init(bool may_load) {
  if (Resolved* r = g_resolved.load(std::memory_order_acquire)) return &r->driver;
  DlsymFn sym = real_dlsym();
  if (!sym) return nullptr;
  void* h = open_libcuda(may_load);
  if (!h) return nullptr;
  auto* r = new Resolved;
  Driver& d = r->driver;
  d.handle = h;
  auto get = [&](const char* name) {
    void* p = sym(h, name);
    if (!p) dlerror();  // an older driver lacks some exports
    return p;
  };
  std::size_t i = 0, n = 0;
#define GPUPOOL_RESOLVE_HOOK(name, field, type)                                                 \
  d.field = reinterpret_cast<decltype(d.field)>(get(#name));                                    \
  if (d.field) {                                                                                \
    bool dup = false; /* aliases: the first export of an address wins */                        \
    for (std::size_t k = 0; k < n; ++k)                                                         \
      if (r->table[k].real == reinterpret_cast<void*>(d.field)) dup = true;                     \
    if (!dup)                                                                                   \
      r->table[n++] = {reinterpret_cast<void*>(d.field), const_cast<void*>(kHookAddresses[i])}; \
  }                                                                                             \
  ++i;
  GPUPOOL_CUDA_HOOKS(GPUPOOL_RESOLVE_HOOK)
#undef GPUPOOL_RESOLVE_HOOK
#define GPUPOOL_RESOLVE_USED(name, field, type) \
  d.field = reinterpret_cast<decltype(d.field)>(get(#name));
  GPUPOOL_CUDA_USED(GPUPOOL_RESOLVE_USED)
#undef GPUPOOL_RESOLVE_USED
  r->size = n;
  Resolved* expected = nullptr;
  if (!g_resolved.compare_exchange_strong(expected, r, std::memory_order_acq_rel)) {
    delete r;
    return &expected->driver;
  }
  detail::g_driver.store(&r->driver, std::memory_order_release);
  return &r->driver;
}

}  // namespace

std::atomic<const Driver*> detail::g_driver{nullptr};
const Driver* detail::resolve_driver() { return init(true); }
namespace {
// Whether a libcuda is mapped, from the loader's list. dlopen(RTLD_NOLOAD)
// of a library that is not loaded still searches the library path, opening
// files among the program's descriptors; the control thread asks every
// second (sys/io.hpp: gpupool takes none of the program's numbers).
bool libcuda_mapped() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, std::size_t, void*) {
               const char* slash = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
               const char* base = slash ? slash + 1 : info->dlpi_name;
               return base && std::strncmp(base, "libcuda.so", 10) == 0 ? 1 : 0;
             },
             nullptr) != 0;
}
}  // namespace

const Driver* driver_if_loaded() {
  if (Resolved* r = g_resolved.load(std::memory_order_acquire)) return &r->driver;
  return libcuda_mapped() ? init(false) : nullptr;
}

void* hook_for(void* real_function) {
  const Resolved* r = g_resolved.load(std::memory_order_acquire);
  if (!real_function || !r) return nullptr;
  for (std::size_t k = 0; k < r->size; ++k)
    if (r->table[k].real == real_function) return r->table[k].hook;
  return nullptr;
}

}  // namespace gpupool::cuda
