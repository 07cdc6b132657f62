// The GPU's free memory as the whole node sees it, from NVML: no CUDA
// context needed, and it counts every process's use. libnvidia-ml.so.1 is
// loaded on first use, from the control thread, only once gpupool holds
// device memory; a process that never does never loads it.
//
// The few declarations below are NVML's stable C ABI (nvml.h is not part of
// the CUDA Toolkit's headers everywhere).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <new>
#include <vector>

#include "config/log.hpp"
#include "interpose/node/internal.hpp"

namespace gpupool::node {
namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;

struct Nvml {
  bool tried = false;
  bool ok = false;
  long pid = 0;  // the process that initialised it
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  struct Handle {
    Uuid uuid;
    nvmlDevice_t dev;
  };
  std::vector<Handle> handles;
};
// Never destroyed: the control thread may still use them while exit runs.
// A forked child gets new ones (the parent's may be mid-use by a thread the
// child does not have).
struct Session {
  std::mutex mu;
  Nvml nvml;
};
std::atomic<Session*> g_session{new Session};

bool load(Nvml& n) {
  if (n.tried) return n.ok;
  n.tried = true;
  n.pid = getpid();
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    log().info("NVML not available ({}): held memory is released for other processes only "
               "when gpupool processes ask",
               dlerror());
    return false;
  }
  n.init = reinterpret_cast<decltype(n.init)>(dlsym(lib, "nvmlInit_v2"));
  n.by_uuid = reinterpret_cast<decltype(n.by_uuid)>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
  n.memory = reinterpret_cast<decltype(n.memory)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  nvmlReturn_t r = -1;
  if (n.init && n.by_uuid && n.memory) r = n.init();
  if (r != kNvmlSuccess) {
    log().info("NVML did not start (error {}): held memory is released for other processes "
               "only when gpupool processes ask",
               r);
    return false;  // the library stays loaded: unloading NVML is not worth its risks
  }
  n.ok = true;
  return true;
}

}  // namespace

bool nvml_memory(const Uuid& uuid, std::uint64_t* free, std::uint64_t* total) {
  Session* sp = g_session.load(std::memory_order_acquire);
  if (!sp) return false;  // a forked child out of host memory: no watch
  Session& session = *sp;
  std::lock_guard lock(session.mu);
  Nvml& n = session.nvml;
  if (!load(n) || n.pid != getpid()) return false;
  nvmlDevice_t dev = nullptr;
  bool known = false;
  for (const Nvml::Handle& h : n.handles)
    if (h.uuid == uuid) dev = h.dev, known = true;
  if (!known) {
    if (n.by_uuid(uuid_text(uuid).c_str(), &dev) != kNvmlSuccess) dev = nullptr;
    if (!dev) log().info("NVML does not know {}: its free memory is not watched", uuid_text(uuid));
    n.handles.push_back({uuid, dev});
  }
  if (!dev) return false;
  nvmlMemory_t m{};
  if (n.memory(dev, &m) != kNvmlSuccess) return false;
  *free = m.free;
  *total = m.total;
  return true;
}

void nvml_fork_child() noexcept {
  // The NVML library stays loaded; the child starts its own session.
  g_session.store(new (std::nothrow) Session, std::memory_order_release);
}

}  // namespace gpupool::node
