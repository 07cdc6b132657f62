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
#include <string>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "sys/io.hpp"

#include "interpose/node/internal.hpp"
#include "sys/log.hpp"

namespace gpupool::node {

// NVML's types, which internal.hpp's Nvml names.
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// nvmlDeviceGetComputeRunningProcesses' element (the unversioned symbol
// keeps this first layout).
struct nvmlProcessInfo_v1_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
};

namespace {

using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;

// The session's fork() gate (NvmlSession): open unless a fork is under way.
class Gate {
 public:
  explicit Gate(NvmlSession& s) : s_(s) {
    s_.inside.store(true, std::memory_order_seq_cst);
    if (s_.forking.load(std::memory_order_seq_cst))
      s_.inside.store(false, std::memory_order_seq_cst);
  }
  ~Gate() { s_.inside.store(false, std::memory_order_seq_cst); }
  bool open() const { return s_.inside.load(std::memory_order_relaxed); }

 private:
  NvmlSession& s_;
};

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
bool with_nvml(NvmlSession& s, F&& fn) {
  Gate gate(s);
  if (!gate.open()) return false;  // forking now
  LockGuard lock(s.mu);
  if (s.parents) return false;
  bool ok = false;
  std::string why;
  Nvml* n = &s.nvml;  // the lambda runs here, under the lock
  io::in_private([&] { ok = fn(*n, &why); });
  if (!why.empty()) log().info("{}", why);
  return ok;
}
}  // namespace

namespace {
// Room for the processes of a busy GPU; more than this and we do without.
constexpr unsigned kMaxProcesses = 64;

// NVML's list of the processes computing on the GPU: *count entries of
// infos[kMaxProcesses]. False when NVML cannot say.
bool list_processes(NvmlSession& s, const wire::DeviceKey& uuid, nvmlProcessInfo_v1_t* infos,
                    unsigned* count) {
  return with_nvml(s, [&](Nvml& n, std::string* why) {
    nvmlDevice_t dev = device_of(n, uuid, why);
    if (!dev || !n.processes) return false;
    *count = kMaxProcesses;
    if (n.processes(dev, count, infos) != kNvmlSuccess) return false;
    *count = std::min(*count, kMaxProcesses);
    return true;
  });
}
}  // namespace

bool nvml_process_used(NvmlSession& s, const wire::DeviceKey& uuid, long pid, std::uint64_t* used) {
  nvmlProcessInfo_v1_t infos[kMaxProcesses];
  unsigned count = 0;
  if (!list_processes(s, uuid, infos, &count)) return false;
  for (unsigned i = 0; i < count; ++i)
    if (static_cast<long>(infos[i].pid) == pid) {
      *used = infos[i].usedGpuMemory;
      return true;
    }
  return false;  // not listed (another PID namespace, or nothing used yet)
}

bool nvml_processes(NvmlSession& s, const wire::DeviceKey& uuid, std::vector<unsigned>* pids) {
  nvmlProcessInfo_v1_t infos[kMaxProcesses];
  unsigned count = 0;
  if (!list_processes(s, uuid, infos, &count)) return false;
  pids->clear();
  for (unsigned i = 0; i < count; ++i) pids->push_back(infos[i].pid);
  std::sort(pids->begin(), pids->end());
  return true;
}

bool nvml_memory(NvmlSession& s, const wire::DeviceKey& uuid, std::uint64_t* free,
                 std::uint64_t* total) {
  return with_nvml(s, [&](Nvml& n, std::string* why) {
    nvmlDevice_t dev = device_of(n, uuid, why);
    if (!dev) return false;
    nvmlMemory_t m{};
    if (n.memory(dev, &m) != kNvmlSuccess) return false;
    *free = m.free;
    *total = m.total;
    return true;
  });
}

void nvml_fork_prepare(NvmlSession& s) noexcept {
  s.forking.store(true, std::memory_order_seq_cst);
  fork_wait::journal([](void* p) { nvml_fork_parent(*static_cast<NvmlSession*>(p)); }, &s);
  for (unsigned turn = 0; s.inside.load(std::memory_order_seq_cst); ++turn)
    if (!fork_wait::keep_waiting(turn)) return;
}

void nvml_fork_parent(NvmlSession& s) noexcept {
  s.forking.store(false, std::memory_order_seq_cst);
}

// The NVML library stays loaded; the child's session is its own, and does
// without one its parent started in gpupool's descriptor table. (No NVML
// call was in flight: prepare waited, so the parent's lock is free.)
void nvml_fork_child(NvmlSession& parents,
                     NvmlSession* fresh) noexcept GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  NvmlSession& child = fresh ? *fresh : parents;
  child.inside.store(false, std::memory_order_relaxed);
  child.forking.store(false, std::memory_order_relaxed);
  child.parents = !fresh || parents.parents || (parents.nvml.ok && parents.nvml.in_private_table);
}

}  // namespace gpupool::node
