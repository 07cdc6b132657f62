// The GPU's free memory as the whole node sees it, from NVML: no CUDA
// context needed, and it counts every process's use. libnvidia-ml.so.1 is
// loaded on first use, from the control thread, only once gpupool holds
// device memory; a process that never does never loads it.
//
// Every NVML call, its dlopen and nvmlInit included, runs in gpupool's own
// descriptor table (io::in_private): NVML opens the driver's device files
// at its start and keeps them, and in the program's table they would take
// the lowest free number, one of 0-2 if the program has just closed it.
// NVML then works only on threads of that table; a forked child, which
// does not have it, leaves an NVML its parent started alone.
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
#include <string>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "sys/io.hpp"

#include "interpose/node/internal.hpp"
#include "sys/log.hpp"

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
  // Started in gpupool's own descriptor table: NVML's descriptors are
  // there, so a forked child (which has the program's) cannot use it.
  bool in_private_table = false;
  long pid = 0;  // the process that initialised it
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*by_uuid)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  // Optional: without it a process's memory outside the pool counts as
  // the other processes'.
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned*, nvmlProcessInfo_v1_t*) = nullptr;
  struct Handle {
    wire::DeviceKey uuid;
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
  Ranked<LockRank::node_nvml> mu;
  Nvml nvml;
  // A forked child's session whose parent had started NVML in its own
  // descriptor table: NVML's state names descriptors this child does not
  // have, so the child does without (a child that uses the GPU again is
  // one that exec'd, and starts afresh).
  bool parents = false;
};
// A pointer, not a NoDestructor: a forked child swaps in a new session
// (null where it could not make one, and before this static initialiser
// ran: NVML is then not asked).
std::atomic<Session*> g_session{new Session};

// Loads and starts NVML once. Runs in the private table, where nothing may
// log: what went wrong is left in *why for the caller to say.
bool load(Nvml& n, std::string* why) {
  if (n.tried) return n.ok;
  n.tried = true;
  n.pid = getpid();
  n.in_private_table = io::on_private_thread();
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    *why = std::string("NVML not available (") + (e ? e : "dlopen failed") +
           "): held memory is released for other processes only when gpupool processes ask";
    return false;
  }
  n.init = reinterpret_cast<decltype(n.init)>(dlsym(lib, "nvmlInit_v2"));
  n.by_uuid = reinterpret_cast<decltype(n.by_uuid)>(dlsym(lib, "nvmlDeviceGetHandleByUUID"));
  n.memory = reinterpret_cast<decltype(n.memory)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  n.processes =
      reinterpret_cast<decltype(n.processes)>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses"));
  nvmlReturn_t r = -1;
  if (n.init && n.by_uuid && n.memory) r = n.init();
  if (r != kNvmlSuccess) {
    *why = "NVML did not start (error " + std::to_string(r) +
           "): held memory is released for other processes only when gpupool processes ask";
    return false;  // the library stays loaded: unloading NVML is not worth its risks
  }
  n.ok = true;
  return true;
}

}  // namespace

namespace {
// The device's handle (cached); nullptr when NVML or the device is not
// available. Caller holds the session's lock; private table, no logging.
nvmlDevice_t device_of(Nvml& n, const wire::DeviceKey& uuid, std::string* why) {
  if (!load(n, why) || n.pid != getpid()) return nullptr;
  for (const Nvml::Handle& h : n.handles)
    if (h.uuid == uuid) return h.dev;
  nvmlDevice_t dev = nullptr;
  if (n.by_uuid(wire::key_text(uuid).c_str(), &dev) != kNvmlSuccess) dev = nullptr;
  if (!dev)
    *why = "NVML does not know " + wire::key_text(uuid) + ": its free memory is not watched";
  n.handles.push_back({uuid, dev});
  return dev;
}

// Runs fn(nvml) in gpupool's descriptor table under the session's lock,
// unless a fork is under way or this child's NVML is its parent's; says
// what NVML's start reported. False when fn did not run or returned false.
template <class F>
bool with_nvml(F&& fn) {
  Gate gate;
  Session* sp = g_session.load(std::memory_order_acquire);
  if (!sp || !gate.open()) return false;  // forking now, or a child out of host memory
  LockGuard lock(sp->mu);
  if (sp->parents) return false;
  bool ok = false;
  std::string why;
  io::in_private([&] { ok = fn(sp->nvml, &why); });
  if (!why.empty()) log().info("{}", why);
  return ok;
}
}  // namespace

namespace {
// Room for the processes of a busy GPU; more than this and we do without.
constexpr unsigned kMaxProcesses = 64;

// NVML's list of the processes computing on the GPU: *count entries of
// infos[kMaxProcesses]. False when NVML cannot say.
bool list_processes(const wire::DeviceKey& uuid, nvmlProcessInfo_v1_t* infos, unsigned* count) {
  return with_nvml([&](Nvml& n, std::string* why) {
    nvmlDevice_t dev = device_of(n, uuid, why);
    if (!dev || !n.processes) return false;
    *count = kMaxProcesses;
    if (n.processes(dev, count, infos) != kNvmlSuccess) return false;
    *count = std::min(*count, kMaxProcesses);
    return true;
  });
}
}  // namespace

bool nvml_process_used(const wire::DeviceKey& uuid, long pid, std::uint64_t* used) {
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

bool nvml_processes(const wire::DeviceKey& uuid, std::vector<unsigned>* pids) {
  nvmlProcessInfo_v1_t infos[kMaxProcesses];
  unsigned count = 0;
  if (!list_processes(uuid, infos, &count)) return false;
  pids->clear();
  for (unsigned i = 0; i < count; ++i) pids->push_back(infos[i].pid);
  std::sort(pids->begin(), pids->end());
  return true;
}

bool nvml_memory(const wire::DeviceKey& uuid, std::uint64_t* free, std::uint64_t* total) {
  return with_nvml([&](Nvml& n, std::string* why) {
    nvmlDevice_t dev = device_of(n, uuid, why);
    if (!dev) return false;
    nvmlMemory_t m{};
    if (n.memory(dev, &m) != kNvmlSuccess) return false;
    *free = m.free;
    *total = m.total;
    return true;
  });
}

void nvml_fork_prepare() noexcept {
  g_forking.store(true, std::memory_order_seq_cst);
  fork_wait::journal([](void*) { nvml_fork_parent(); }, nullptr);
  for (unsigned turn = 0; g_inside.load(std::memory_order_seq_cst); ++turn)
    if (!fork_wait::keep_waiting(turn)) return;
}

void nvml_fork_parent() noexcept { g_forking.store(false, std::memory_order_seq_cst); }

void nvml_fork_child() noexcept {
  g_inside.store(false, std::memory_order_relaxed);
  g_forking.store(false, std::memory_order_relaxed);
  // The NVML library stays loaded; the child starts its own session, and
  // does without one its parent started in gpupool's descriptor table.
  Session* old = g_session.load(std::memory_order_relaxed);
  auto* fresh = new (std::nothrow) Session;
  if (fresh && old) fresh->parents = old->parents || (old->nvml.ok && old->nvml.in_private_table);
  g_session.store(fresh, std::memory_order_release);
}

}  // namespace gpupool::node
