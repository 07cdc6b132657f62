// The GPU's free memory as the whole node sees it, from NVML: no CUDA
// context needed, and it counts every process's use. libnvidia-ml.so.1 is
// loaded on first use, from the control thread, only once gpupool holds
// device memory; a process that never does never loads it.
//
// The few declarations below are NVML's stable C ABI (nvml.h is not part of
// the CUDA Toolkit's headers everywhere).
#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
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
// nvmlDeviceGetComputeRunningProcesses' element (the unversioned symbol
// keeps this first layout).
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;

struct Nvml {
  bool tried = false;
  bool ok = false;
  long pid = 0;  // the process that initialised it
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Optional: without it a process's memory outside the pool counts as
  // the other processes'.
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*) = nullptr;
  struct Handle {
    Uuid uuid;
    nvmlDevice_t dev;
  };
  std::vector<Handle> handles;
};
// fork() waits while the control thread is inside dlopen or NVML, and no
// new call starts until it is done: a child must not inherit the loader's
// or NVML's locks mid-call (its own session calls NVML again). A gate of
// two atomics, not a mutex: only the control thread calls NVML.
std::atomic<bool> g_inside{false}, g_forking{false};
class Gate {
 public:
  Gate() {
    g_inside.store(true, std::memory_order_seq_cst);
    if (g_forking.load(std::memory_order_seq_cst)) g_inside.store(false, std::memory_order_seq_cst);
  }
  ~Gate() { g_inside.store(false, std::memory_order_seq_cst); }
  bool open() const { return g_inside.load(std::memory_order_relaxed); }
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
  n.processes = reinterpret_cast<decltype(n.processes)>(
      dlsym(lib, "nvmlDeviceGetComputeRunningProcesses"));
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

namespace {
// The device's handle (cached); nullptr when NVML or the device is not
// available. Caller holds the session's lock.
nvmlDevice_t device_of(Nvml& n, const Uuid& uuid) {
  if (!load(n) || n.pid != getpid()) return nullptr;
  for (const Nvml::Handle& h : n.handles)
    if (h.uuid == uuid) return h.dev;
  nvmlDevice_t dev = nullptr;
  if (n.by_uuid(uuid_text(uuid).c_str(), &dev) != kNvmlSuccess) dev = nullptr;
  if (!dev) log().info("NVML does not know {}: its free memory is not watched", uuid_text(uuid));
  n.handles.push_back({uuid, dev});
  return dev;
}
}  // namespace

namespace {
// Room for the processes of a busy GPU; more than this and we do without.
constexpr unsigned kMaxProcesses = 64;

// NVML's list of the processes computing on the GPU: *count entries of
// infos[kMaxProcesses]. False when NVML cannot say.
bool list_processes(const Uuid& uuid, nvmlProcessInfo_v1_t* infos, unsigned* count) {
  Gate gate;
  Session* sp = g_session.load(std::memory_order_acquire);
  if (!sp || !gate.open()) return false;
  std::lock_guard lock(sp->mu);
  Nvml& n = sp->nvml;
  nvmlDevice_t dev = device_of(n, uuid);
  if (!dev || !n.processes) return false;
  *count = kMaxProcesses;
  if (n.processes(dev, count, infos) != kNvmlSuccess) return false;
  *count = std::min(*count, kMaxProcesses);
  return true;
}
}  // namespace

bool nvml_process_used(const Uuid& uuid, long pid, std::uint64_t* used) {
  nvmlProcessInfo_v1_t infos[kMaxProcesses];
  unsigned count = 0;
  if (!list_processes(uuid, infos, &count)) return false;
  for (unsigned i = 0; i < count; ++i)
    if (static_cast<long>(infos[i].pid) == pid) {
      *used = infos[i].usedGpuMemory;
      return true;
    }
  return false;  // not listed (another PID namespace, or nothing used yet)
}

bool nvml_processes(const Uuid& uuid, std::vector<unsigned>* pids) {
  nvmlProcessInfo_v1_t infos[kMaxProcesses];
  unsigned count = 0;
  if (!list_processes(uuid, infos, &count)) return false;
  pids->clear();
  for (unsigned i = 0; i < count; ++i) pids->push_back(infos[i].pid);
  std::sort(pids->begin(), pids->end());
  return true;
}

bool nvml_memory(const Uuid& uuid, std::uint64_t* free, std::uint64_t* total) {
  Gate gate;
  Session* sp = g_session.load(std::memory_order_acquire);
  if (!sp || !gate.open()) return false;  // forking now, or a child out of host memory
  std::lock_guard lock(sp->mu);
  nvmlDevice_t dev = device_of(sp->nvml, uuid);
  if (!dev) return false;
  nvmlMemory_t m{};
  if (sp->nvml.memory(dev, &m) != kNvmlSuccess) return false;
  *free = m.free;
  *total = m.total;
  return true;
}

void nvml_fork_prepare() noexcept {
  g_forking.store(true, std::memory_order_seq_cst);
  while (g_inside.load(std::memory_order_seq_cst)) sched_yield();
}

void nvml_fork_parent() noexcept { g_forking.store(false, std::memory_order_seq_cst); }

void nvml_fork_child() noexcept {
  g_inside.store(false, std::memory_order_relaxed);
  g_forking.store(false, std::memory_order_relaxed);
  // The NVML library stays loaded; the child starts its own session.
  g_session.store(new (std::nothrow) Session, std::memory_order_release);
}

}  // namespace gpupool::node
