// A stand-in libcuda.so.1 for CI machines without a GPU.
//
// It implements the part of the driver API that gpupool and the test clients
// use, on host memory, with the real driver's error codes (the measured table
// in shared/research/cuda-interposition.md), a capacity, and contexts with
// the lifetimes of the real driver's (measured on the H100 and H200, driver
// 580: tests/gpu/ctx_lifetime_probe.c):
//   - a dead context's handle may be handed out to a context created after
//     it (the real driver did so for some, not all; the stand-in always
//     does, lowest free slot first: the harshest case), and its memory dies
//     with it (calls naming it are counted: dead_ptr_calls);
//   - every context has a unique id (cuCtxGetId), never reused: a primary
//     context that comes back to life after a reset or its last release has
//     the same handle and a new id;
//   - cuCtxAttach / cuCtxDetach count a created context's users, and the
//     last detach destroys it (popping it if current);
//   - primary contexts count retains; a reset destroys the context and
//     keeps the count, the next retain makes it anew;
//   - any thread may destroy any context, also one current elsewhere (which
//     then gets CUDA_ERROR_CONTEXT_IS_DESTROYED);
// asynchronous work that runs
// only at a synchronization, cuGetProcAddress answering by name + version +
// per-thread flag like the real one, call counters and failure injection.
//
// With STANDIN_SHARED=<file>, processes naming the same file share one
// device budget per ordinal (shared_budget.h), so tests can play several
// processes on one GPU; device UUIDs then name the file, else the process.
//
// STANDIN_HOST_CAPACITY=<n> (default 1 GiB): pinned host memory
// (cuMemHostAlloc, cuMemAllocHost_v2) a process may hold. Set together with
// STANDIN_SHARED, it is one budget for every process on the file (the
// pseudo-device SB_HOST in the file's slots: a dead process stops counting),
// so tests can play neighbours that compete for pinned memory. Unset, each
// process keeps its own 1 GiB as before, shared file or not.
//
// STANDIN_CONTEXT_BYTES=<n> (default 0): each live context (created, or a
// primary context while retained) holds n bytes of its device, as a real
// context and the libraries it loads do outside any allocator; creating one
// where they do not fit fails with CUDA_ERROR_OUT_OF_MEMORY.
//
// STANDIN_OOM_DELAY_US=<n> (default 0): cuMemAlloc_v2 failing with
// out-of-memory returns n µs later (the lock released meanwhile), so tests
// can let another process act between the failure and what gpupool does
// about it.
//
// Exports are defined under their real names with asm labels so that cuda.h's
// _v2 macros do not get in the way; the library is linked -Bsymbolic so that
// standin_own() reports its own addresses.
#include "standin.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "shared_budget.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

struct Event;  // the events section

namespace {

constexpr std::uint32_t kCtxMagic = 0x43545831;  // "CTX1"

struct Op {
  std::uintptr_t dst;
  std::size_t n;
  unsigned char value;
};

struct Ctx {
  std::uint32_t magic = kCtxMagic;
  int dev = 0;
  bool alive = true;
  bool primary = false;
  unsigned refcount = 0;      // primary contexts: retains
  unsigned usage = 0;         // created contexts: cuCtxCreate and each cuCtxAttach
  unsigned long long id = 0;  // cuCtxGetId: new at each creation or activation
  std::size_t charged = 0;    // STANDIN_CONTEXT_BYTES it holds while alive
  std::vector<Op> pending;
  std::uint64_t queued = 0;  // operations ever queued here; pending holds the last ones
  std::uint64_t ran() const { return queued - pending.size(); }  // operations run so far
  std::vector<::Event*> events;                                  // live, made here
};

struct Alloc {
  std::uintptr_t base = 0;
  std::size_t size = 0;
  Ctx* ctx = nullptr;
  bool host = false;
  unsigned flags = 0;
  std::uint64_t buffer_id = 0;
  // cuMemAllocAsync and cuMemAllocManaged memory: a context's end does not
  // free it (the real driver's stream-ordered memory is no context's).
  bool outlives_context = false;
  struct MemPool* pool = nullptr;  // stream-ordered: its pool's chunk
  // A cuMemMap mapping (readable and writable), as the queries and copies
  // see it: the mapping is the range; legacy IPC cannot share it.
  bool vmm = false;
};

// p lies in a cuMemMap mapping; [p, p + n) in mappings that follow each
// other, each accessible to `dev`.
bool vmm_mapped(std::uintptr_t p);
bool vmm_span_accessible(std::uintptr_t p, std::size_t n, int dev);
// The accessible cuMemMap mapping containing p, as an allocation of the
// current context (the VMM section below), or nullptr.
const Alloc* mapped_alloc(std::uintptr_t p);

// Streams the program makes (the streams section below says how work on
// them is ordered).
constexpr std::uint32_t kStreamMagic = 0x5354524d;  // "STRM"
struct Stream {
  std::uint32_t magic = kStreamMagic;
  Ctx* ctx = nullptr;
  unsigned flags = 0;
  bool alive = true;
  bool capturing = false;
  bool global_capture = false;  // CU_STREAM_CAPTURE_MODE_GLOBAL
  // cuStreamWaitEvent: the context's operations up to this one run before
  // the stream's later work (a non-blocking stream's work then queues).
  std::uint64_t wait_mark = 0;
};

Stream* stream_of(CUstream s) {
  if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return nullptr;
  return reinterpret_cast<Stream*>(s);
}

// A synchronization of a context ran (memory pools below).
void synchronized(Ctx* c);

struct Fail {
  std::string function;
  int count = 0;
  CUresult error = CUDA_SUCCESS;
};

// Containers are never destroyed: threads of the test programs may still
// call in while the process exits (as they may into the real driver).
// The driver's lock, knowing whether this thread holds it: a fork() from a
// signal handler that interrupted a driver call on this thread
// (host.*.fork.signal) must not wait for it, as a driver that handles fork
// would not.
class DriverLock {
 public:
  // Counted from before the lock is taken to after it is given back: a
  // handler never sees it held and uncounted.
  void lock() {
    ++t_held_;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    m_.lock();
  }
  void unlock() {
    m_.unlock();
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --t_held_;
  }
  // fork(): every thread's hold, unless this one holds it (then none is
  // taken, and the child gets the lock as the interrupted call left it).
  void fork_prepare() {
    t_skipped_ = t_held_ != 0;
    if (!t_skipped_) m_.lock();
  }
  void fork_release() {
    if (!t_skipped_) m_.unlock();
    t_skipped_ = false;
  }

 private:
  std::mutex m_;
  static thread_local int t_held_;
  static thread_local bool t_skipped_;
};
thread_local int DriverLock::t_held_ = 0;
thread_local bool DriverLock::t_skipped_ = false;
DriverLock& g_mu = *new DriverLock;
bool g_initialized = false;
bool g_torn_down = false;
int g_devices = 2;
std::size_t g_capacity = std::size_t{1} << 30;
std::size_t g_host_capacity = std::size_t{1} << 30;
std::size_t g_context_bytes = 0;  // STANDIN_CONTEXT_BYTES
std::size_t g_oom_delay_us = 0;   // STANDIN_OOM_DELAY_US
std::size_t g_used[8] = {};       // this process's; published to the shared file too
bool g_shared = false;            // STANDIN_SHARED set
pid_t g_shared_pid = 0;           // the process whose usage the shared file has
std::size_t g_host_used = 0;      // this process's; published to the file if g_host_shared
bool g_host_shared = false;       // STANDIN_SHARED and STANDIN_HOST_CAPACITY both set
std::uint64_t g_next_buffer_id = 1;
std::map<std::uintptr_t, Alloc>& g_live = *new std::map<std::uintptr_t, Alloc>;  // by base
std::map<std::uintptr_t, Alloc>& g_dead =
    *new std::map<std::uintptr_t, Alloc>;  // freed by a context teardown
// Every context ever made, in order: a created context's slot (its handle)
// goes to the next context created once it dies, lowest slot first.
std::vector<Ctx*>& g_all_ctx = *new std::vector<Ctx*>;
unsigned long long g_next_ctx_id = 1;
Ctx* g_primary[8] = {};
std::vector<Fail>& g_fail = *new std::vector<Fail>;
StandinCounters g_counters;

// Plain data: thread_local objects with destructors are destroyed before
// atexit handlers run, and those may still call the driver.
struct CtxStack {
  Ctx* items[32];
  int depth;
  bool empty() const { return depth == 0; }
  Ctx*& back() { return items[depth - 1]; }
  void pop_back() { --depth; }
  void push_back(Ctx* c) {
    if (depth < 32) items[depth++] = c;
  }
};
thread_local CtxStack t_stack;

std::size_t env_size(const char* name, std::size_t def) {
  const char* v = getenv(name);
  if (!v || !*v) return def;
  return static_cast<std::size_t>(strtoull(v, nullptr, 0));
}

__attribute__((constructor)) void standin_load() {
  g_capacity = env_size("STANDIN_CAPACITY", g_capacity);
  g_host_capacity = env_size("STANDIN_HOST_CAPACITY", g_host_capacity);
  g_context_bytes = env_size("STANDIN_CONTEXT_BYTES", 0);
  g_oom_delay_us = env_size("STANDIN_OOM_DELAY_US", 0);
  g_devices = static_cast<int>(std::min<std::size_t>(env_size("STANDIN_DEVICES", 2), 8));
  g_shared = sb_path() != nullptr;
  // Only an explicit host capacity is shared: tests that never asked for it
  // keep the private default they were written against.
  const char* host = getenv("STANDIN_HOST_CAPACITY");
  g_host_shared = g_shared && host && *host;
  // A thread of the test program may hold the lock when another forks.
  pthread_atfork([] { g_mu.fork_prepare(); }, [] { g_mu.fork_release(); },
                 [] { g_mu.fork_release(); });
}

// The real driver is torn down at exit; calls after that get DEINITIALIZED.
__attribute__((destructor)) void standin_unload() {
  std::lock_guard lock(g_mu);
  g_torn_down = true;
}

bool should_fail(const char* function, CUresult* error) {
  for (Fail& f : g_fail)
    if (f.count > 0 && f.function == function) {
      --f.count;
      *error = f.error;
      return true;
    }
  return false;
}

CUresult state_error() {
  if (g_torn_down) return CUDA_ERROR_DEINITIALIZED;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  return CUDA_SUCCESS;
}

Ctx* current() { return t_stack.empty() ? nullptr : t_stack.back(); }

bool valid_ctx(CUcontext c) {
  if (!c) return false;
  const Ctx* x = reinterpret_cast<Ctx*>(c);
  // Contexts are never freed, so reading a stale one is safe.
  return x->magic == kCtxMagic;
}

// The current context for an allocation: 201 without one, 709 if destroyed.
CUresult usable_current(Ctx** out) {
  Ctx* c = current();
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *out = c;
  return CUDA_SUCCESS;
}

const Alloc* containing(const std::map<std::uintptr_t, Alloc>& m, std::uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return nullptr;
  --it;
  return p - it->second.base < it->second.size ? &it->second : nullptr;
}

bool in_freed_reservation(std::uintptr_t p);  // the VMM section below

void note_dead(std::uintptr_t p) {
  if (containing(g_dead, p) || in_freed_reservation(p)) ++g_counters.dead_ptr_calls;
}

// The queued operations of `c` run, in order: all of them, or those queued
// before the `upto`th (a context event's position).
void run_pending(Ctx* c, std::uint64_t upto = UINT64_MAX) {
  const std::uint64_t first = c->ran();
  const std::size_t n =
      upto <= first ? 0 : std::min<std::uint64_t>(c->pending.size(), upto - first);
  for (std::size_t i = 0; i < n; ++i) {
    const Op& op = c->pending[i];
    memset(reinterpret_cast<void*>(op.dst), op.value, op.n);
    ++g_counters.ops_executed;
  }
  c->pending.erase(c->pending.begin(), c->pending.begin() + std::ptrdiff_t(n));
}

std::uintptr_t new_memory(std::size_t size, std::size_t align) {
  const std::size_t rounded = (size + align - 1) / align * align;
  void* p = aligned_alloc(align, rounded);
  if (!p) return 0;
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  // The address is live again: forget any teardown record overlapping it.
  for (auto it = g_dead.begin(); it != g_dead.end();)
    if (it->second.base < base + size && base < it->second.base + it->second.size)
      it = g_dead.erase(it);
    else ++it;
  return base;
}

std::size_t charge(std::size_t size) { return (size + 511) / 512 * 512; }

// Shared mode: this process's slot in the file, taken at first use and again
// in a forked child (which carries its parent's allocations, so it publishes
// them as its own). Called with g_mu held.
void shared_sync() {
  if (!g_shared || g_shared_pid == getpid()) return;
  sb_attach(1);
  for (int d = 0; d < 8; ++d) sb_set_mine(d, g_used[d]);
  if (g_host_shared) sb_set_mine(SB_HOST, g_host_used);
  g_shared_pid = getpid();
}

// Device memory in use on `dev`: all live processes on the shared file, or
// this process alone.
std::size_t device_used(int dev) {
  if (!g_shared) return g_used[dev];
  shared_sync();
  return sb_used_all(dev);
}

// Takes exactly `bytes` from device `dev`'s budget, atomically across the
// processes sharing it; false if they do not fit.
bool take_device(int dev, std::size_t bytes) {
  if (g_shared) {
    shared_sync();
    if (!sb_try_charge(dev, g_used[dev], bytes, g_capacity)) return false;
  } else if (g_used[dev] > g_capacity || bytes > g_capacity - g_used[dev]) {
    return false;  // (written so that no huge size wraps around)
  }
  g_used[dev] += bytes;
  return true;
}

void give_device(int dev, std::size_t bytes) {
  g_used[dev] -= bytes;
  if (g_shared) {
    shared_sync();
    sb_set_mine(dev, g_used[dev]);
  }
}

// Pinned host memory, the same way: exactly `bytes` from the host budget,
// shared by the processes on the file with g_host_shared, else this
// process's own; false (and nothing changed) if they do not fit.
bool take_host(std::size_t bytes) {
  if (g_host_shared) {
    shared_sync();
    if (!sb_try_charge(SB_HOST, g_host_used, bytes, g_host_capacity)) return false;
  } else if (g_host_used > g_host_capacity || bytes > g_host_capacity - g_host_used) {
    return false;
  }
  g_host_used += bytes;
  return true;
}

void give_host(std::size_t bytes) {
  g_host_used -= bytes;
  if (g_host_shared) {
    shared_sync();
    sb_set_mine(SB_HOST, g_host_used);
  }
}

// cuMemFree/cuMemFreeHost and context teardown (which frees the context's
// pinned memory too) give the budget back here.
void uncharge_memory(const Alloc& a) {
  if (a.host) give_host(charge(a.size));
  else give_device(a.ctx->dev, charge(a.size));
}

void release_memory(const Alloc& a) {
  uncharge_memory(a);
  free(reinterpret_cast<void*>(a.base));
}

// Memory that died with its context is poisoned and kept aside for a while
// (the last 64 MiB of it) before its addresses can be handed out again, so
// that a write into it shows (dead_writes, counted when it finally goes)
// instead of corrupting whatever the address serves next.
constexpr unsigned char kPoison = 0xDE;
constexpr std::size_t kQuarantineBytes = std::size_t{64} << 20;
std::vector<Alloc>& g_quarantine = *new std::vector<Alloc>;  // oldest first
std::size_t g_quarantine_bytes = 0;

void bury(const Alloc& a) {
  memset(reinterpret_cast<void*>(a.base), kPoison, a.size);
  g_quarantine.push_back(a);
  g_quarantine_bytes += a.size;
  while (g_quarantine_bytes > kQuarantineBytes) {
    const Alloc old = g_quarantine.front();
    g_quarantine.erase(g_quarantine.begin());
    g_quarantine_bytes -= old.size;
    const auto* b = reinterpret_cast<const unsigned char*>(old.base);
    for (std::size_t i = 0; i < old.size; ++i)
      if (b[i] != kPoison) {
        ++g_counters.dead_writes;
        break;
      }
    free(reinterpret_cast<void*>(old.base));
  }
}

// An allocation of `size`, rounded as the driver's.
bool charge_device(int dev, std::size_t size) {
  if (size > g_capacity) return false;  // before charge() can overflow
  return take_device(dev, charge(size));
}

void uncharge_device(int dev, std::size_t size) { give_device(dev, charge(size)); }

// STANDIN_CONTEXT_BYTES for a context coming to life: a real context's own
// device memory (its state, the libraries it loads), which no allocator sees
// but cuMemGetInfo and NVML do. Nothing is charged (no slot taken) when 0.
bool charge_context(int dev, std::size_t* charged) {
  *charged = 0;
  if (g_context_bytes == 0) return true;
  if (!take_device(dev, g_context_bytes)) return false;
  *charged = g_context_bytes;
  return true;
}

void uncharge_context(Ctx* c) {
  if (c->charged) give_device(c->dev, c->charged);
  c->charged = 0;
}

void events_die(Ctx* c);  // the events section below

// Context teardown: pending work is dropped, memory freed by the driver,
// and the context's events with it.
void teardown(Ctx* c) {
  c->pending.clear();
  events_die(c);
  for (auto it = g_live.begin(); it != g_live.end();) {
    if (it->second.ctx == c && !it->second.outlives_context) {
      g_dead[it->first] = it->second;
      uncharge_memory(it->second);
      bury(it->second);
      it = g_live.erase(it);
    } else {
      ++it;
    }
  }
  uncharge_context(c);
  c->alive = false;
}

CUresult alloc_host(void** pp, std::size_t size, unsigned flags) {
  if (CUresult e = state_error()) return e;
  ++g_counters.host_alloc_calls;
  if (!pp) return CUDA_ERROR_INVALID_VALUE;
  if (flags & ~7u) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0) {
    *pp = nullptr;
    return CUDA_SUCCESS;
  }
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  CUresult injected;
  if (should_fail("cuMemHostAlloc", &injected)) return injected;
  // (size first, so that charge() cannot overflow)
  if (size > g_host_capacity || !take_host(charge(size))) return CUDA_ERROR_OUT_OF_MEMORY;
  const std::uintptr_t p = new_memory(size, 4096);
  if (!p) {
    give_host(charge(size));
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  // The real driver reports DEVICEMAP for every pinned allocation (UVA).
  g_live[p] = Alloc{p, size, c, true, flags | CU_MEMHOSTALLOC_DEVICEMAP, g_next_buffer_id++};
  ++g_counters.host_alloc;
  *pp = reinterpret_cast<void*>(p);
  return CUDA_SUCCESS;
}

CUresult ctx_destroy(CUcontext ctx) {
  if (CUresult e = state_error()) return e;
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = reinterpret_cast<Ctx*>(ctx);
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  teardown(c);
  if (!t_stack.empty() && t_stack.back() == c) t_stack.pop_back();
  return CUDA_SUCCESS;
}

CUresult primary_release(CUdevice dev) {
  if (CUresult e = state_error()) return e;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  Ctx* c = g_primary[dev];
  if (!c || c->refcount == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c->refcount == 0 && c->alive) teardown(c);
  return CUDA_SUCCESS;
}

CUresult primary_reset(CUdevice dev) {
  if (CUresult e = state_error()) return e;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  // The retain count stays (measured): the next retain makes it anew.
  Ctx* c = g_primary[dev];
  if (c && c->alive) teardown(c);
  return CUDA_SUCCESS;
}

CUresult attribute(void* data, CUpointer_attribute attr, const Alloc& a, std::uintptr_t p) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = reinterpret_cast<CUcontext>(a.ctx);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = a.host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = p;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!a.host) return CUDA_ERROR_INVALID_VALUE;
      *static_cast<void**>(data) = reinterpret_cast<void*>(p);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = a.buffer_id;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *static_cast<int*>(data) = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = a.ctx->dev;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = a.base;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = a.size;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *static_cast<int*>(data) = 1;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *static_cast<int*>(data) = a.host || a.vmm || a.outlives_context ? 0 : 1;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

// Default values for memory the driver does not know (cuPointerGetAttributes).
void attribute_default(void* data, CUpointer_attribute attr) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<unsigned*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *static_cast<CUdeviceptr*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      *static_cast<void**>(data) = nullptr;
      break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *static_cast<unsigned long long*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *static_cast<int*>(data) = -2;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *static_cast<CUdeviceptr*>(data) = 0;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *static_cast<size_t*>(data) = 0;
      break;
    default:
      *static_cast<int*>(data) = 0;
      break;
  }
}

}  // namespace

#define SI(ret, name, params)                                                            \
  extern "C" __attribute__((visibility("default"))) ret si_##name params __asm__(#name); \
  extern "C" ret si_##name params

// ---- initialisation, devices ---------------------------------------------

SI(CUresult, cuInit, (unsigned int flags)) {
  std::lock_guard lock(g_mu);
  if (g_torn_down) return CUDA_ERROR_DEINITIALIZED;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  g_initialized = true;
  shared_sync();  // the process is on the shared device from now on
  return CUDA_SUCCESS;
}

SI(CUresult, cuDriverGetVersion, (int* v)) {
  if (!v) return CUDA_ERROR_INVALID_VALUE;
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceGetCount, (int* n)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!n) return CUDA_ERROR_INVALID_VALUE;
  *n = g_devices;
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceGet, (CUdevice * d, int ordinal)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!d) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceTotalMem_v2, (size_t * bytes, CUdevice dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = g_capacity;
  return CUDA_SUCCESS;
}

// Only what pools ask: whether the virtual memory API's allocations can be
// exported as POSIX descriptors (STANDIN_NO_POSIX_FD=1: not). Other
// attributes are not modelled.
SI(CUresult, cuDeviceGetAttribute, (int* value, CUdevice_attribute attr, CUdevice dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  if (attr != CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)
    return CUDA_ERROR_INVALID_VALUE;
  const char* no = getenv("STANDIN_NO_POSIX_FD");
  *value = no && *no == '1' ? 0 : 1;
  return CUDA_SUCCESS;
}

// The same 16 bytes as the stand-in NVML's "GPU-..." for this device.
static CUresult device_uuid(CUuuid* uuid, CUdevice dev) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  unsigned char bytes[16];
  sb_uuid(dev, bytes);
  memcpy(uuid->bytes, bytes, 16);
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceGetUuid, (CUuuid * uuid, CUdevice dev)) { return device_uuid(uuid, dev); }

// No MIG here: the _v2 (MIG-aware) UUID is the device's.
SI(CUresult, cuDeviceGetUuid_v2, (CUuuid * uuid, CUdevice dev)) { return device_uuid(uuid, dev); }

// ---- contexts --------------------------------------------------------------

static CUresult ctx_create(CUcontext* pctx, CUdevice dev) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  // Its device memory first: on a full device the real cuCtxCreate fails
  // with out of memory, and nothing is created or pushed.
  std::size_t charged;
  if (!charge_context(dev, &charged)) return CUDA_ERROR_OUT_OF_MEMORY;
  // A destroyed context's handle is handed out again, as the real driver
  // does: the lowest free slot.
  Ctx* c = nullptr;
  for (Ctx* old : g_all_ctx)
    if (!old->alive && !old->primary) {
      c = old;
      break;
    }
  if (c) {
    *c = Ctx{};
  } else {
    c = new Ctx;
    g_all_ctx.push_back(c);
  }
  c->dev = dev;
  c->charged = charged;
  c->usage = 1;
  c->id = g_next_ctx_id++;
  t_stack.push_back(c);
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxCreate_v2, (CUcontext * pctx, unsigned int flags, CUdevice dev)) {
  (void)flags;
  return ctx_create(pctx, dev);
}

SI(CUresult, cuCtxCreate_v4,
   (CUcontext * pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev)) {
  (void)params;
  (void)flags;
  return ctx_create(pctx, dev);
}

SI(CUresult, cuCtxDestroy, (CUcontext ctx)) {
  std::lock_guard lock(g_mu);
  return ctx_destroy(ctx);
}

SI(CUresult, cuCtxDestroy_v2, (CUcontext ctx)) {
  std::lock_guard lock(g_mu);
  return ctx_destroy(ctx);
}

SI(CUresult, cuCtxGetCurrent, (CUcontext * pctx)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  *pctx = reinterpret_cast<CUcontext>(current());
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxSetCurrent, (CUcontext ctx)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!ctx) {
    if (!t_stack.empty()) t_stack.pop_back();
    return CUDA_SUCCESS;
  }
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_stack.empty()) t_stack.push_back(reinterpret_cast<Ctx*>(ctx));
  else t_stack.back() = reinterpret_cast<Ctx*>(ctx);
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxPushCurrent_v2, (CUcontext ctx)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  t_stack.push_back(reinterpret_cast<Ctx*>(ctx));
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxPopCurrent_v2, (CUcontext * pctx)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx) *pctx = reinterpret_cast<CUcontext>(t_stack.back());
  t_stack.pop_back();
  return CUDA_SUCCESS;
}

// STANDIN_CTX_ID=0: a driver that gives no context ids (as a compatibility
// layer may): CUDA_ERROR_NOT_SUPPORTED.
SI(CUresult, cuCtxGetId, (CUcontext ctx, unsigned long long* id)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  static const bool ids = env_size("STANDIN_CTX_ID", 1) != 0;
  if (!ids) return CUDA_ERROR_NOT_SUPPORTED;
  if (!id) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = ctx ? reinterpret_cast<Ctx*>(ctx) : current();
  if (!c || !valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *id = c->id;
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxGetApiVersion, (CUcontext ctx, unsigned int* version)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = ctx ? reinterpret_cast<Ctx*>(ctx) : current();
  if (!c || !valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *version = 3020;
  return CUDA_SUCCESS;
}

// One more user of the current context (deprecated, still exported: PyCUDA
// calls it).
SI(CUresult, cuCtxAttach, (CUcontext * pctx, unsigned int flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pctx || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  if (c->primary) ++c->refcount;
  else ++c->usage;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

// One user fewer; the last destroys the context (popped if current), as
// cuCtxDestroy does.
SI(CUresult, cuCtxDetach, (CUcontext ctx)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  Ctx* c = reinterpret_cast<Ctx*>(ctx);
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (c->primary) return CUDA_ERROR_INVALID_CONTEXT;
  if (--c->usage > 0) return CUDA_SUCCESS;
  teardown(c);
  if (!t_stack.empty() && t_stack.back() == c) t_stack.pop_back();
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxGetDevice, (CUdevice * dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  *dev = c->dev;
  return CUDA_SUCCESS;
}

// standin_hold_syncs: synchronizations held on entry, outside g_mu. Unless
// a test holds them, no lock is taken: g_hold_mu has no fork handlers, and a
// child forked while another thread of its parent held it (entering a
// synchronization) got it locked for ever (cuda.*.fork: 4 hangs in about
// 265 runs beside each other, in the child's first cuCtxSynchronize).
std::mutex g_hold_mu;
std::condition_variable g_hold_cv;
std::atomic<bool> g_hold_syncs{false};
int g_syncs_held = 0;
void hold_point() {
  if (!g_hold_syncs.load(std::memory_order_acquire)) return;
  std::unique_lock lock(g_hold_mu);
  if (!g_hold_syncs) return;
  ++g_syncs_held;
  g_hold_cv.notify_all();
  g_hold_cv.wait(lock, [] { return !g_hold_syncs; });
  --g_syncs_held;
}

SI(CUresult, cuCtxSynchronize, (void)) {
  hold_point();
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  synchronized(c);
  ++g_counters.ctx_sync;
  return CUDA_SUCCESS;
}

SI(CUresult, cuCtxSynchronize_v2, (CUcontext ctx)) {
  hold_point();
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = ctx ? reinterpret_cast<Ctx*>(ctx) : current();
  if (!c || !valid_ctx(reinterpret_cast<CUcontext>(c))) return CUDA_ERROR_INVALID_CONTEXT;
  if (!c->alive) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  synchronized(c);
  ++g_counters.ctx_sync;
  return CUDA_SUCCESS;
}

SI(CUresult, cuDevicePrimaryCtxRetain, (CUcontext * pctx, CUdevice dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  // One handle per device for the life of the process, as on the real
  // driver: after a reset the same handle comes back to life.
  if (!g_primary[dev]) {
    g_primary[dev] = new Ctx;
    g_primary[dev]->dev = dev;
    g_primary[dev]->primary = true;
    g_primary[dev]->alive = false;
    g_all_ctx.push_back(g_primary[dev]);
  }
  Ctx* c = g_primary[dev];
  // Activation (the first retain, or the first after a reset) takes the
  // context's memory; if it does not fit the retain fails and the context
  // stays inactive. A context made anew has a new id.
  if (!c->alive) {
    if (!charge_context(dev, &c->charged)) return CUDA_ERROR_OUT_OF_MEMORY;
    c->alive = true;
    c->id = g_next_ctx_id++;
  }
  ++c->refcount;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

SI(CUresult, cuDevicePrimaryCtxRelease, (CUdevice dev)) {
  std::lock_guard lock(g_mu);
  return primary_release(dev);
}

SI(CUresult, cuDevicePrimaryCtxRelease_v2, (CUdevice dev)) {
  std::lock_guard lock(g_mu);
  return primary_release(dev);
}

SI(CUresult, cuDevicePrimaryCtxReset, (CUdevice dev)) {
  std::lock_guard lock(g_mu);
  return primary_reset(dev);
}

SI(CUresult, cuDevicePrimaryCtxReset_v2, (CUdevice dev)) {
  std::lock_guard lock(g_mu);
  return primary_reset(dev);
}

SI(CUresult, cuDevicePrimaryCtxGetState, (CUdevice dev, unsigned int* flags, int* active)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = g_primary[dev] && g_primary[dev]->alive ? 1 : 0;
  return CUDA_SUCCESS;
}

// ---- memory ----------------------------------------------------------------

namespace {
// cuMemAlloc_v2's allocation, under g_mu, after its argument checks.
CUresult device_alloc_locked(const char* function, CUdeviceptr* dptr, size_t size) {
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  CUresult injected;
  if (should_fail(function, &injected)) return injected;
  // A failed allocation leaves *dptr = 0, as a size-0 one does (measured);
  // assumed for out-of-memory.
  if (!charge_device(c->dev, size)) {
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const std::uintptr_t p = new_memory(size, 512);
  if (!p) {
    uncharge_device(c->dev, size);
    *dptr = 0;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  g_live[p] = Alloc{p, size, c, false, 0, g_next_buffer_id++};
  ++g_counters.mem_alloc;
  g_counters.last_alloc_size = size;
  *dptr = p;
  return CUDA_SUCCESS;
}
}  // namespace

// Managed allocations, as far as gpupool meets them: device memory it does
// not pool, out of the same capacity.
static CUresult other_alloc(const char* function, CUdeviceptr* dptr, size_t size) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = device_alloc_locked(function, dptr, size);
  if (r == CUDA_SUCCESS) g_live[*dptr].outlives_context = true;
  return r;
}

// ---- memory pools (stream-ordered allocation) -------------------------------
// The driver's pools as the CUDA documentation describes them: each
// allocation is a chunk of physical memory (2 MiB granules) that the pool
// creates (pool_creations) or reuses. A chunk freed with cuMemFreeAsync is
// reusable at once on the stream that freed it, and on another stream only
// once the free's position has executed (here: the next synchronization of
// its context, stream or event, where queued work runs), with
// REUSE_ALLOW_OPPORTUNISTIC (default on). At each synchronization a pool
// gives executed free chunks back (pool_releases) until it holds no more
// than its release threshold (default 0: everything). cuMemPoolTrimTo gives
// back executed free chunks until the pool holds at most its argument; not
// while a stream is capturing in global mode, where the stand-in refuses it
// (trims_refused), as a call that is not allowed during capture.
namespace {
constexpr std::uint32_t kPoolMagic = 0x504f4f4c;  // "POOL"
constexpr std::size_t kPoolGranule = std::size_t{2} << 20;

struct Chunk {
  std::uintptr_t base;
  std::size_t size;
  CUstream freed_on;  // the stream whose free made it free
  Ctx* ctx;           // the context of that stream
  bool executed;      // the free's position has run
};

struct MemPool {
  std::uint32_t magic = kPoolMagic;
  int dev = 0;
  bool alive = true;
  std::uint64_t threshold = 0;
  std::uint64_t reserved = 0, reserved_high = 0, used = 0, used_high = 0;
  int reuse_follow = 1, reuse_opportunistic = 1, reuse_internal = 1;
  std::vector<Chunk> free_chunks;
};

MemPool* g_default_pool[8] = {};
MemPool* g_current_pool[8] = {};
int g_global_captures = 0;                                    // streams capturing in global mode
std::vector<MemPool*>& g_pools = *new std::vector<MemPool*>;  // every pool made, defaults too

MemPool* pool_of(CUmemoryPool p) {
  auto* m = reinterpret_cast<MemPool*>(p);
  if (m && m->magic == kPoolMagic && !m->alive) ++g_counters.dead_pool_calls;
  return m && m->magic == kPoolMagic && m->alive ? m : nullptr;
}

MemPool* default_pool(int dev) {
  if (!g_default_pool[dev]) {
    g_default_pool[dev] = new MemPool;  // never freed: handles stay recognisable
    g_default_pool[dev]->dev = dev;
    g_pools.push_back(g_default_pool[dev]);
  }
  return g_default_pool[dev];
}

MemPool* current_pool(int dev) {
  return g_current_pool[dev] ? g_current_pool[dev] : default_pool(dev);
}

void give_chunk(MemPool* m, const Chunk& c) {
  give_device(m->dev, c.size);
  free(reinterpret_cast<void*>(c.base));
  m->reserved -= c.size;
  ++g_counters.pool_releases;
}

// Executed free chunks given back, largest first, while the pool holds more
// than `keep`.
void pool_trim_locked(MemPool* m, std::uint64_t keep) {
  std::sort(m->free_chunks.begin(), m->free_chunks.end(),
            [](const Chunk& a, const Chunk& b) { return a.size > b.size; });
  for (auto it = m->free_chunks.begin(); it != m->free_chunks.end() && m->reserved > keep;) {
    if (!it->executed) {
      ++it;
      continue;
    }
    give_chunk(m, *it);
    it = m->free_chunks.erase(it);
  }
}

// A synchronization of `c` (all of it: the stand-in queues work per
// context) ran: frees queued there have executed, and every pool goes down
// to its threshold.
void synchronized(Ctx* c) {
  run_pending(c);
  for (MemPool* m : g_pools) {
    if (!m->alive) continue;
    for (Chunk& ch : m->free_chunks)
      if (ch.ctx == c) ch.executed = true;
    pool_trim_locked(m, m->threshold);
  }
}

bool same_stream(CUstream a, CUstream b) {
  auto legacy = [](CUstream s) { return s == nullptr || s == CU_STREAM_LEGACY; };
  return a == b || (legacy(a) && legacy(b));
}

CUresult pool_alloc_locked(MemPool* m, CUdeviceptr* dptr, size_t size, CUstream s) {
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  Stream* st = stream_of(s);
  if (st && (st->magic != kStreamMagic || !st->alive)) return CUDA_ERROR_INVALID_HANDLE;
  CUresult injected;
  if (should_fail("cuMemAllocAsync", &injected)) return injected;
  ++g_counters.async_allocs;
  const std::size_t granule = (size + kPoolGranule - 1) / kPoolGranule * kPoolGranule;
  // A free chunk this stream may use: its own free, or an executed one.
  auto usable = [&](const Chunk& ch) {
    return ch.size >= granule && ch.size < 2 * granule &&
           (same_stream(ch.freed_on, s) || (ch.executed && m->reuse_opportunistic));
  };
  // The smallest that fits.
  auto it = m->free_chunks.end();
  for (auto c = m->free_chunks.begin(); c != m->free_chunks.end(); ++c)
    if (usable(*c) && (it == m->free_chunks.end() || c->size < it->size)) it = c;
  std::uintptr_t p = 0;
  std::size_t chunk = granule;
  if (it != m->free_chunks.end()) {
    p = it->base;
    chunk = it->size;
    m->free_chunks.erase(it);
  } else {
    // Out of device memory: the pool's own executed free chunks go first.
    if (!take_device(m->dev, granule)) {
      pool_trim_locked(m, 0);
      if (!take_device(m->dev, granule)) {
        *dptr = 0;
        return CUDA_ERROR_OUT_OF_MEMORY;
      }
    }
    p = new_memory(granule, 512);
    if (!p) {
      give_device(m->dev, granule);
      *dptr = 0;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    m->reserved += granule;
    m->reserved_high = std::max(m->reserved_high, m->reserved);
    ++g_counters.pool_creations;
  }
  m->used += chunk;
  m->used_high = std::max(m->used_high, m->used);
  Alloc a{p, chunk, c, false, 0, g_next_buffer_id++};
  a.outlives_context = true;
  a.pool = m;
  g_live[p] = a;
  *dptr = p;
  return CUDA_SUCCESS;
}

}  // namespace

static CUresult alloc_async(CUdeviceptr* dptr, size_t size, CUstream s, CUmemoryPool pool,
                            bool from_pool) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  MemPool* m = nullptr;
  if (from_pool) {
    m = pool_of(pool);
    if (!m) return CUDA_ERROR_INVALID_VALUE;
  } else {
    Ctx* c = nullptr;
    if (CUresult e = usable_current(&c)) return e;
    m = current_pool(c->dev);
  }
  return pool_alloc_locked(m, dptr, size, s);
}

SI(CUresult, cuMemAllocAsync, (CUdeviceptr * dptr, size_t size, CUstream s)) {
  return alloc_async(dptr, size, s, nullptr, false);
}

SI(CUresult, cuMemAllocAsync_ptsz, (CUdeviceptr * dptr, size_t size, CUstream s)) {
  return alloc_async(dptr, size, s, nullptr, false);
}

SI(CUresult, cuMemAllocFromPoolAsync,
   (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream s)) {
  return alloc_async(dptr, size, s, pool, true);
}

SI(CUresult, cuMemAllocFromPoolAsync_ptsz,
   (CUdeviceptr * dptr, size_t size, CUmemoryPool pool, CUstream s)) {
  return alloc_async(dptr, size, s, pool, true);
}

// A pool chunk's free: back into its pool (at once executed for cuMemFree,
// which waits for the device).
static void pool_free_locked(std::map<std::uintptr_t, Alloc>::iterator it, CUstream s,
                             bool executed) {
  MemPool* m = it->second.pool;
  Ctx* c = current();
  m->used -= it->second.size;
  m->free_chunks.push_back(
      Chunk{it->second.base, it->second.size, s, c ? c : it->second.ctx, executed});
  g_live.erase(it);
  if (!m->alive && m->used == 0) pool_trim_locked(m, 0);
}

SI(CUresult, cuMemPoolCreate, (CUmemoryPool * pool, const CUmemPoolProps* props)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
      props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || props->location.id < 0 ||
      props->location.id >= g_devices)
    return CUDA_ERROR_INVALID_VALUE;
  auto* m = new MemPool;
  m->dev = props->location.id;
  g_pools.push_back(m);
  *pool = reinterpret_cast<CUmemoryPool>(m);
  return CUDA_SUCCESS;
}

// Its free memory goes at once; chunks still allocated when their free comes.
SI(CUresult, cuMemPoolDestroy, (CUmemoryPool pool)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  MemPool* m = pool_of(pool);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  for (int d = 0; d < 8; ++d) {
    if (g_default_pool[d] == m) return CUDA_ERROR_INVALID_VALUE;
    if (g_current_pool[d] == m) g_current_pool[d] = nullptr;
  }
  for (Chunk& ch : m->free_chunks) ch.executed = true;
  pool_trim_locked(m, 0);
  m->alive = false;
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceGetDefaultMemPool, (CUmemoryPool * pool, CUdevice dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(default_pool(dev));
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceGetMemPool, (CUmemoryPool * pool, CUdevice dev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!pool) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  *pool = reinterpret_cast<CUmemoryPool>(current_pool(dev));
  return CUDA_SUCCESS;
}

SI(CUresult, cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
  MemPool* m = pool_of(pool);
  if (!m || m->dev != dev) return CUDA_ERROR_INVALID_VALUE;
  g_current_pool[dev] = m;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  MemPool* m = pool_of(pool);
  if (!m || !value) return CUDA_ERROR_INVALID_VALUE;
  const auto u64 = *static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      m->threshold = u64;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      m->reuse_follow = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      m->reuse_opportunistic = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      m->reuse_internal = *static_cast<int*>(value);
      return CUDA_SUCCESS;
    // The high-water marks may only be reset (to 0): they restart at the current value.
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      if (u64 != 0) return CUDA_ERROR_INVALID_VALUE;
      m->reserved_high = m->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      if (u64 != 0) return CUDA_ERROR_INVALID_VALUE;
      m->used_high = m->used;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SI(CUresult, cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void* value)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  MemPool* m = pool_of(pool);
  if (!m || !value) return CUDA_ERROR_INVALID_VALUE;
  auto u64 = [&](std::uint64_t v) {
    *static_cast<cuuint64_t*>(value) = v;
    return CUDA_SUCCESS;
  };
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      return u64(m->threshold);
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      return u64(m->reserved);
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      return u64(m->reserved_high);
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      return u64(m->used);
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      return u64(m->used_high);
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
      *static_cast<int*>(value) = m->reuse_follow;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
      *static_cast<int*>(value) = m->reuse_opportunistic;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      *static_cast<int*>(value) = m->reuse_internal;
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

SI(CUresult, cuMemPoolTrimTo, (CUmemoryPool pool, size_t keep)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  MemPool* m = pool_of(pool);
  if (!m) return CUDA_ERROR_INVALID_VALUE;
  ++g_counters.trim_calls;
  if (g_global_captures > 0) {
    ++g_counters.trims_refused;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  pool_trim_locked(m, keep);
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemAllocManaged, (CUdeviceptr * dptr, size_t size, unsigned int flags)) {
  (void)flags;
  return other_alloc("cuMemAllocManaged", dptr, size);
}

SI(CUresult, cuMemAlloc_v2, (CUdeviceptr * dptr, size_t size)) {
  CUresult r;
  {
    std::lock_guard lock(g_mu);
    if (CUresult e = state_error()) return e;
    ++g_counters.mem_alloc_calls;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (size == 0) {
      *dptr = 0;
      return CUDA_ERROR_INVALID_VALUE;
    }
    r = device_alloc_locked("cuMemAlloc_v2", dptr, size);
  }
  if (r == CUDA_ERROR_OUT_OF_MEMORY && g_oom_delay_us)
    usleep(static_cast<useconds_t>(g_oom_delay_us));
  return r;
}

// Rows padded to STANDIN_PITCH_ALIGN (default 512) bytes; element sizes 4,
// 8 and 16 only, as the driver documents, and rows up to the H100's
// CU_DEVICE_ATTRIBUTE_MAX_PITCH; counted as device allocations.
SI(CUresult, cuMemAllocPitch_v2,
   (CUdeviceptr * dptr, size_t* pitch, size_t width, size_t height, unsigned int element)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.mem_alloc_pitch_calls;
  if (!dptr || !pitch || width == 0 || height == 0 || width > 2147483647 ||
      (element != 4 && element != 8 && element != 16))
    return CUDA_ERROR_INVALID_VALUE;
  const char* align_env = getenv("STANDIN_PITCH_ALIGN");
  const size_t align = align_env ? strtoull(align_env, nullptr, 0) : 512;
  const size_t row = (width + align - 1) / align * align;
  if (height > SIZE_MAX / row) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = device_alloc_locked("cuMemAllocPitch_v2", dptr, row * height);
  if (r == CUDA_SUCCESS) *pitch = row;
  return r;
}

SI(CUresult, cuMemFree_v2, (CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (p == 0) return CUDA_SUCCESS;
  auto it = g_live.find(p);
  if (it == g_live.end() || it->second.host) {
    if (containing(g_dead, p)) {
      ++g_counters.dead_ptr_calls;
      Ctx* c = current();
      return c && !c->alive ? CUDA_ERROR_CONTEXT_IS_DESTROYED : CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_ERROR_INVALID_VALUE;
  }
  // The real cuMemFree waits for all work of the context.
  run_pending(it->second.ctx);
  if (it->second.pool) {  // stream-ordered memory: back to its pool
    pool_free_locked(it, nullptr, true);
    ++g_counters.mem_free;
    return CUDA_SUCCESS;
  }
  release_memory(it->second);
  g_live.erase(it);
  ++g_counters.mem_free;
  return CUDA_SUCCESS;
}

static CUresult free_async(CUdeviceptr p, CUstream s) {
  {
    std::lock_guard lock(g_mu);
    if (CUresult e = state_error()) return e;
    auto it = g_live.find(p);
    if (it != g_live.end() && it->second.pool) {
      Stream* st = stream_of(s);
      if (st && (st->magic != kStreamMagic || !st->alive)) return CUDA_ERROR_INVALID_HANDLE;
      pool_free_locked(it, s, false);
      return CUDA_SUCCESS;
    }
  }
  return si_cuMemFree_v2(p);  // other memory: freed at once
}

SI(CUresult, cuMemFreeAsync, (CUdeviceptr p, CUstream s)) { return free_async(p, s); }

SI(CUresult, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s)) { return free_async(p, s); }

SI(CUresult, cuMemAllocHost_v2, (void** pp, size_t size)) {
  std::lock_guard lock(g_mu);
  return alloc_host(pp, size, 0);
}

SI(CUresult, cuMemHostAlloc, (void** pp, size_t size, unsigned int flags)) {
  std::lock_guard lock(g_mu);
  return alloc_host(pp, size, flags);
}

SI(CUresult, cuMemFreeHost, (void* p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!p) return CUDA_SUCCESS;
  auto it = g_live.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == g_live.end() || !it->second.host) {
    note_dead(reinterpret_cast<std::uintptr_t>(p));
    return CUDA_ERROR_INVALID_VALUE;
  }
  run_pending(it->second.ctx);
  release_memory(it->second);
  g_live.erase(it);
  ++g_counters.host_free;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemGetInfo_v2, (size_t * free_bytes, size_t* total)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  *total = g_capacity;
  *free_bytes = g_capacity - std::min(g_capacity, device_used(c->dev));
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemGetAddressRange_v2, (CUdeviceptr * pbase, size_t* psize, CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  const Alloc* a = containing(g_live, p);
  if (!a) a = mapped_alloc(p);
  if (!a || a->host) {
    note_dead(p);
    return CUDA_ERROR_NOT_FOUND;
  }
  if (pbase) *pbase = a->base;
  if (psize) *psize = a->size;
  return CUDA_SUCCESS;
}

SI(CUresult, cuPointerGetAttribute, (void* data, CUpointer_attribute attr, CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  const Alloc* a = containing(g_live, p);
  if (!a) a = mapped_alloc(p);
  if (!a) {
    note_dead(p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  return attribute(data, attr, *a, p);
}

// Only SYNC_MEMOPS can be set (as on the driver: CUDA-aware MPI and UCX set
// it on buffers that GPUDirect RDMA reaches).
SI(CUresult, cuPointerSetAttribute, (const void* value, CUpointer_attribute attr, CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!value || attr != CU_POINTER_ATTRIBUTE_SYNC_MEMOPS) return CUDA_ERROR_INVALID_VALUE;
  if (!containing(g_live, p) && !mapped_alloc(p)) {
    note_dead(p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  ++g_counters.sync_memops_set;
  return CUDA_SUCCESS;
}

// A dma-buf of device memory: a descriptor (of /dev/null here) for a range
// inside one allocation.
SI(CUresult, cuMemGetHandleForAddressRange,
   (void* handle, CUdeviceptr p, size_t n, CUmemRangeHandleType type, unsigned long long flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!handle || n == 0 || flags != 0 || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)
    return CUDA_ERROR_INVALID_VALUE;
  const Alloc* a = containing(g_live, p);
  if (!a) a = mapped_alloc(p);
  if (!a || a->host || n > a->size - (p - a->base)) return CUDA_ERROR_INVALID_VALUE;
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(handle) = fd;
  ++g_counters.dma_buf_exports;
  return CUDA_SUCCESS;
}

SI(CUresult, cuPointerGetAttributes,
   (unsigned int n, CUpointer_attribute* attrs, void** data, CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (n == 0 || !attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  const Alloc* a = containing(g_live, p);
  if (!a) a = mapped_alloc(p);
  if (!a) note_dead(p);
  for (unsigned k = 0; k < n; ++k) {
    if (!data[k]) return CUDA_ERROR_INVALID_VALUE;
    if (!a) {
      attribute_default(data[k], attrs[k]);
    } else if (CUresult e = attribute(data[k], attrs[k], *a, p)) {
      if (attrs[k] == CU_POINTER_ATTRIBUTE_HOST_POINTER) *static_cast<void**>(data[k]) = nullptr;
      else return e;
    }
  }
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemHostGetFlags, (unsigned int* flags, void* p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  const Alloc* a = containing(g_live, reinterpret_cast<std::uintptr_t>(p));
  if (!a || !a->host) {
    note_dead(reinterpret_cast<std::uintptr_t>(p));
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (!flags) return CUDA_ERROR_INVALID_VALUE;
  *flags = a->flags;
  return CUDA_SUCCESS;
}

SI(CUresult, cuIpcGetMemHandle, (CUipcMemHandle * handle, CUdeviceptr p)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  auto it = g_live.find(p);
  if (!handle || it == g_live.end() || it->second.host) {
    note_dead(p);
    return CUDA_ERROR_INVALID_VALUE;
  }
  memset(handle, 0, sizeof *handle);
  memcpy(handle->reserved, &it->second.buffer_id, sizeof it->second.buffer_id);
  ++g_counters.ipc_handles;
  return CUDA_SUCCESS;
}

// ---- streams ---------------------------------------------------------------
// Streams the program makes. Work on the legacy stream (0), a per-thread
// default stream or a blocking stream is queued behind the context's
// earlier work, as the real driver orders it; work on a non-blocking stream
// runs at once, ahead of whatever is still queued (the stream was idle):
// the overtaking a pool must not let touch a block whose old work is queued.

static CUresult stream_create(CUstream* s, unsigned flags) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  if (!s || (flags & ~unsigned(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  auto* st = new Stream;  // never freed: a destroyed handle stays recognisable
  st->ctx = c;
  st->flags = flags;
  *s = reinterpret_cast<CUstream>(st);
  ++g_counters.streams_created;
  return CUDA_SUCCESS;
}

SI(CUresult, cuStreamCreate, (CUstream * s, unsigned int flags)) { return stream_create(s, flags); }

SI(CUresult, cuStreamCreateWithPriority, (CUstream * s, unsigned int flags, int priority)) {
  (void)priority;
  return stream_create(s, flags);
}

SI(CUresult, cuStreamDestroy_v2, (CUstream s)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = CUDA_SUCCESS; should_fail("cuStreamDestroy_v2", &e)) return e;
  Stream* st = stream_of(s);
  if (!st || st->magic != kStreamMagic || !st->alive) return CUDA_ERROR_INVALID_HANDLE;
  st->alive = false;
  // Its capture, if any, ends with it.
  if (st->capturing && st->global_capture) --g_global_captures;
  st->capturing = false;
  return CUDA_SUCCESS;
}

// A stream's synchronization runs its context's queued work (the stand-in
// queues per context), so the frees queued there have executed.
static CUresult stream_synchronize(CUstream s) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Stream* st = stream_of(s);
  Ctx* c = nullptr;
  if (st) {
    if (st->magic != kStreamMagic || !st->alive) return CUDA_ERROR_INVALID_HANDLE;
    if (st->capturing) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    c = st->ctx;
  } else if (CUresult e = usable_current(&c)) {
    return e;
  }
  synchronized(c);
  ++g_counters.stream_sync;
  return CUDA_SUCCESS;
}

SI(CUresult, cuStreamSynchronize, (CUstream s)) { return stream_synchronize(s); }

SI(CUresult, cuStreamSynchronize_ptsz, (CUstream s)) { return stream_synchronize(s); }

// Events: recorded on a context's work; their synchronization is that
// context's (as above).
constexpr std::uint32_t kEventMagic = 0x45564e54;  // "EVNT"
struct Event {
  std::uint32_t magic = kEventMagic;
  Ctx* ctx = nullptr;
  bool alive = true;
  // Recorded on the whole context (cuCtxRecordEvent): the work queued there
  // before this position is what it waits for; 0: on a stream, where the
  // stand-in runs all of its context's work.
  std::uint64_t mark = 0;
};

// Events that died (destroyed, or with their context) are made again: a
// handle kept past its event's end may name a new event, as with the real
// driver, and a program that makes contexts and events over and over does
// not grow.
namespace {

std::vector<Event*>& g_dead_events = *new std::vector<Event*>;

void event_dies(Event* e) {
  e->alive = false;
  g_dead_events.push_back(e);
}

void events_die(Ctx* c) {
  for (Event* e : c->events) event_dies(e);
  c->events.clear();
}

}  // namespace

SI(CUresult, cuEventCreate, (CUevent * ev, unsigned int flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  if (!ev) return CUDA_ERROR_INVALID_VALUE;
  (void)flags;
  Event* e = nullptr;
  if (g_dead_events.empty()) {
    e = new Event;  // never freed, as streams: handles stay recognisable
  } else {
    e = g_dead_events.back();
    g_dead_events.pop_back();
    *e = Event{};
  }
  e->ctx = c;
  c->events.push_back(e);
  *ev = reinterpret_cast<CUevent>(e);
  return CUDA_SUCCESS;
}

static Event* event_of(CUevent ev) {
  auto* e = reinterpret_cast<Event*>(ev);
  return e && e->magic == kEventMagic && e->alive ? e : nullptr;
}

SI(CUresult, cuEventRecord, (CUevent ev, CUstream s)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  (void)s;
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  e->mark = 0;
  return CUDA_SUCCESS;
}

// All the context's work queued so far, whatever its stream (CUDA 12.5).
// The real driver refuses it while a stream captures in global mode, and
// invalidates the capture: counted (ctx_events_in_capture).
SI(CUresult, cuCtxRecordEvent, (CUcontext ctx, CUevent ev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (CUresult injected; should_fail("cuCtxRecordEvent", &injected)) return injected;
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  Ctx* c = reinterpret_cast<Ctx*>(ctx);
  if (!c || !valid_ctx(ctx) || !c->alive) return CUDA_ERROR_INVALID_CONTEXT;
  if (e->ctx != c) return CUDA_ERROR_INVALID_HANDLE;
  if (g_global_captures > 0) {
    ++g_counters.ctx_events_in_capture;
    return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  }
  ++g_counters.ctx_events;
  e->mark = c->queued;
  return CUDA_SUCCESS;
}

// Work runs only at synchronizations here: a context event is done once
// what it waits for has run.
SI(CUresult, cuEventQuery, (CUevent ev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  return e->mark && e->ctx->ran() < e->mark ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

SI(CUresult, cuEventSynchronize, (CUevent ev)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  if (e->mark) {
    run_pending(e->ctx, e->mark);
    ++g_counters.event_sync;
  } else {
    synchronized(e->ctx);
  }
  return CUDA_SUCCESS;
}

// A stream waits for an event's work: on the legacy, a per-thread or a
// blocking stream the work is queued behind it anyway (the stand-in queues
// per context, in order); a non-blocking stream's later work queues too
// while that work has not run, instead of overtaking it.
SI(CUresult, cuStreamWaitEvent, (CUstream s, CUevent ev, unsigned int flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (flags & ~unsigned(CU_EVENT_WAIT_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  Stream* st = stream_of(s);
  if (st && (st->magic != kStreamMagic || !st->alive)) return CUDA_ERROR_INVALID_HANDLE;
  ++g_counters.stream_waits;
  if (st && e->mark && st->ctx == e->ctx) st->wait_mark = std::max(st->wait_mark, e->mark);
  return CUDA_SUCCESS;
}

SI(CUresult, cuEventDestroy_v2, (CUevent ev)) {
  std::lock_guard lock(g_mu);
  Event* e = event_of(ev);
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  auto& mine = e->ctx->events;
  mine.erase(std::find(mine.begin(), mine.end(), e));
  event_dies(e);
  return CUDA_SUCCESS;
}

// Stream capture, as far as pools meet it: a created stream captures
// between begin and end; while one does in global mode, calls that are not
// allowed then (cuMemPoolTrimTo here) fail.
static CUresult begin_capture(CUstream s, CUstreamCaptureMode mode) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Stream* st = stream_of(s);
  if (!st) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // the legacy stream cannot
  if (st->magic != kStreamMagic || !st->alive) return CUDA_ERROR_INVALID_HANDLE;
  if (st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = true;
  st->global_capture = mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
  if (st->global_capture) ++g_global_captures;
  return CUDA_SUCCESS;
}

SI(CUresult, cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode)) {
  return begin_capture(s, mode);
}

SI(CUresult, cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode mode)) {
  return begin_capture(s, mode);
}

static CUresult end_capture(CUstream s, CUgraph* graph) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Stream* st = stream_of(s);
  if (!st || st->magic != kStreamMagic || !st->alive || !graph) return CUDA_ERROR_INVALID_VALUE;
  if (!st->capturing) return CUDA_ERROR_ILLEGAL_STATE;
  st->capturing = false;
  if (st->global_capture) --g_global_captures;
  static char graph_handle;
  *graph = reinterpret_cast<CUgraph>(&graph_handle);
  return CUDA_SUCCESS;
}

SI(CUresult, cuStreamEndCapture, (CUstream s, CUgraph* graph)) { return end_capture(s, graph); }

SI(CUresult, cuStreamEndCapture_ptsz, (CUstream s, CUgraph* graph)) {
  return end_capture(s, graph);
}

static CUresult is_capturing(CUstream s, CUstreamCaptureStatus* status) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = stream_of(s);
  *status = st && st->magic == kStreamMagic && st->capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                                                             : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

SI(CUresult, cuStreamIsCapturing, (CUstream s, CUstreamCaptureStatus* status)) {
  return is_capturing(s, status);
}

SI(CUresult, cuStreamIsCapturing_ptsz, (CUstream s, CUstreamCaptureStatus* status)) {
  return is_capturing(s, status);
}

SI(CUresult, cuCtxEnablePeerAccess, (CUcontext peer, unsigned int flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_ctx(peer) || !reinterpret_cast<Ctx*>(peer)->alive) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

// Asynchronous work: queued on the current context, run at its next
// synchronization (or a free there), unless its stream overtakes (above).
// Writing a block after the program reused it is the corruption the fence
// tests look for.
static CUresult memset_async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  Ctx* c = nullptr;
  if (CUresult e = usable_current(&c)) return e;
  Stream* st = stream_of(s);
  if (st && (st->magic != kStreamMagic || !st->alive || st->ctx != c))
    return CUDA_ERROR_INVALID_HANDLE;
  const Alloc* a = containing(g_live, dst);
  if (!a && vmm_mapped(dst)) {
    // Virtual memory: mapped all along, and this context's device given
    // access to every mapping (else the device faults, as a real one).
    if (!vmm_span_accessible(dst, n, c->dev)) return CUDA_ERROR_ILLEGAL_ADDRESS;
  } else if (!a || dst + n > a->base + a->size) {
    note_dead(dst);
    return CUDA_ERROR_INVALID_VALUE;
  }
  if (st && (st->flags & CU_STREAM_NON_BLOCKING) && st->wait_mark <= c->ran()) {
    memset(reinterpret_cast<void*>(dst), value, n);
    ++g_counters.ops_executed;
  } else {
    c->pending.push_back(Op{dst, n, value});
    ++c->queued;
  }
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t n, CUstream s)) {
  return memset_async(dst, value, n, s);
}

SI(CUresult, cuMemsetD8Async_ptsz, (CUdeviceptr dst, unsigned char value, size_t n, CUstream s)) {
  return memset_async(dst, value, n, s);
}

// ---- the virtual memory API ------------------------------------------------
// Physical allocations (cuMemCreate) are memfds, charged to the device's
// budget; reservations (cuMemAddressReserve) are PROT_NONE mappings; cuMemMap
// maps a whole handle there, inaccessible until cuMemSetAccess. What the
// H200 answered (tests/gpu/vmm_probe.c, driver 580) is what this answers:
// sizes not a multiple of the granularity and addresses freed while mapped
// are INVALID_VALUE, mapping part of a handle NOT_SUPPORTED, unmapping an
// unmapped range of a reservation SUCCESS, a handle released while mapped
// lives until unmapped, and the memory is no context's: it outlives them.

namespace {

constexpr std::size_t kVmmGranularity = std::size_t{2} << 20;

struct Physical {
  int fd = -1;
  std::size_t size = 0;
  int dev = 0;
  unsigned refs = 1;      // the creation, and each cuMemRetainAllocationHandle
  unsigned mappings = 0;  // ranges mapping it
  CUmemAllocationProp prop{};
  bool imported = false;  // another allocation's memory: charged to its maker
};
struct Reservation {
  std::size_t size = 0;
};
struct Mapping {
  std::size_t size = 0;
  unsigned long long handle = 0;
  bool accessible = false;  // to some device: readable and writable here
  unsigned devices = 0;     // the devices cuMemSetAccess gave access (a mask)
};

std::map<unsigned long long, Physical>& g_physical = *new std::map<unsigned long long, Physical>;
std::map<std::uintptr_t, Reservation>& g_reserved = *new std::map<std::uintptr_t, Reservation>;
std::map<std::uintptr_t, Mapping>& g_mapped = *new std::map<std::uintptr_t, Mapping>;
// Address space given back (cuMemAddressFree): kept, inaccessible, never
// handed out again, so that a call on a pointer into it is seen as one on
// dead memory, as for memory freed with its context (g_dead).
std::map<std::uintptr_t, Reservation>& g_freed_reserved =
    *new std::map<std::uintptr_t, Reservation>;
unsigned long long g_next_handle = 0x1000;

template <class T>
typename std::map<std::uintptr_t, T>::iterator vmm_containing(std::map<std::uintptr_t, T>& m,
                                                              std::uintptr_t p) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return m.end();
  --it;
  return p - it->first < it->second.size ? it : m.end();
}

// [p, p + n) lies in one reservation.
bool reserved_range(std::uintptr_t p, std::size_t n) {
  auto r = vmm_containing(g_reserved, p);
  return r != g_reserved.end() && n <= r->second.size - (p - r->first);
}

bool any_mapping_in(std::uintptr_t p, std::size_t n) {
  auto it = g_mapped.lower_bound(p);
  if (it != g_mapped.end() && it->first < p + n) return true;
  auto c = vmm_containing(g_mapped, p);
  return c != g_mapped.end();
}

void drop_physical_locked(unsigned long long h) {
  auto it = g_physical.find(h);
  if (it == g_physical.end() || it->second.refs || it->second.mappings) return;
  close(it->second.fd);
  if (!it->second.imported) give_device(it->second.dev, it->second.size);
  ++g_counters.vmm_freed;
  g_physical.erase(it);
}

bool in_freed_reservation(std::uintptr_t p) {
  return vmm_containing(g_freed_reserved, p) != g_freed_reserved.end();
}

bool vmm_mapped(std::uintptr_t p) { return vmm_containing(g_mapped, p) != g_mapped.end(); }

bool vmm_span_accessible(std::uintptr_t p, std::size_t n, int dev) {
  auto m = vmm_containing(g_mapped, p);
  for (std::uintptr_t at = p; at < p + n; ++m) {
    if (m == g_mapped.end() || m->first > at || !(m->second.devices & (1u << dev))) return false;
    at = m->first + m->second.size;
  }
  return true;
}

const Alloc* mapped_alloc(std::uintptr_t p) {
  static Alloc a;  // read under g_mu only
  auto m = vmm_containing(g_mapped, p);
  Ctx* c = current();
  if (m == g_mapped.end() || !m->second.accessible || !c) return nullptr;
  a = Alloc{};
  a.base = m->first;
  a.size = m->second.size;
  a.ctx = c;
  a.buffer_id = 0x7000000 + m->second.handle;
  a.vmm = true;
  return &a;
}

bool valid_prop(const CUmemAllocationProp* prop) {
  return prop && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && prop->location.id >= 0 &&
         prop->location.id < g_devices;
}

}  // namespace

SI(CUresult, cuMemGetAllocationGranularity,
   (size_t * g, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags option)) {
  (void)option;
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!g || !valid_prop(prop)) return CUDA_ERROR_INVALID_VALUE;
  *g = kVmmGranularity;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemCreate,
   (CUmemGenericAllocationHandle * handle, size_t size, const CUmemAllocationProp* prop,
    unsigned long long flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_create_calls;
  if (!handle || !valid_prop(prop) || flags != 0 || size == 0 || size % kVmmGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  CUresult injected;
  if (should_fail("cuMemCreate", &injected)) return injected;
  if (!take_device(prop->location.id, size)) return CUDA_ERROR_OUT_OF_MEMORY;
  const int fd = memfd_create("standin-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    give_device(prop->location.id, size);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const unsigned long long h = g_next_handle++;
  Physical& p = g_physical[h];
  p.fd = fd;
  p.size = size;
  p.dev = prop->location.id;
  p.prop = *prop;
  *handle = h;
  ++g_counters.vmm_created;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemRelease, (CUmemGenericAllocationHandle handle)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  auto it = g_physical.find(handle);
  if (it == g_physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  --it->second.refs;
  drop_physical_locked(handle);
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemAddressReserve,
   (CUdeviceptr * ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_reserve_calls;
  if (!ptr || size == 0 || size % kVmmGranularity || flags != 0 || (alignment & (alignment - 1)))
    return CUDA_ERROR_INVALID_VALUE;
  const std::size_t align = std::max(alignment, kVmmGranularity);
  // Over-reserve, then trim to the alignment (addr is only a hint: ignored).
  (void)addr;
  void* raw =
      mmap(nullptr, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  const auto base = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (base + align - 1) / align * align;
  if (aligned > base) munmap(raw, aligned - base);
  if (base + size + align > aligned + size)
    munmap(reinterpret_cast<void*>(aligned + size), base + size + align - (aligned + size));
  g_reserved[aligned].size = size;
  *ptr = aligned;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemAddressFree, (CUdeviceptr ptr, size_t size)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_address_free_calls;
  auto it = g_reserved.find(ptr);
  if (it == g_reserved.end() || it->second.size != size || any_mapping_in(ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  g_freed_reserved[ptr].size = size;  // still mapped PROT_NONE
  g_reserved.erase(it);
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemMap,
   (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
    unsigned long long flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_map_calls;
  auto ph = g_physical.find(handle);
  if (ph == g_physical.end() || ph->second.refs == 0 || flags != 0 || size == 0 ||
      ptr % kVmmGranularity || !reserved_range(ptr, size) || any_mapping_in(ptr, size))
    return CUDA_ERROR_INVALID_VALUE;
  if (offset != 0 || size != ph->second.size) return CUDA_ERROR_NOT_SUPPORTED;
  void* m =
      mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, ph->second.fd, 0);
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  g_mapped[ptr] = {size, handle, false};
  ++ph->second.mappings;
  ++g_counters.vmm_mapped;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemUnmap, (CUdeviceptr ptr, size_t size)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_unmap_calls;
  if (size == 0 || !reserved_range(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
  // Every mapping in the range goes; one reaching past it is refused.
  for (auto it = g_mapped.begin(); it != g_mapped.end(); ++it)
    if (it->first < ptr + size && ptr < it->first + it->second.size &&
        (it->first < ptr || it->first + it->second.size > ptr + size))
      return CUDA_ERROR_INVALID_VALUE;
  for (auto it = g_mapped.lower_bound(ptr); it != g_mapped.end() && it->first < ptr + size;) {
    mmap(reinterpret_cast<void*>(it->first), it->second.size, PROT_NONE,
         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    const unsigned long long h = it->second.handle;
    it = g_mapped.erase(it);
    --g_physical[h].mappings;
    drop_physical_locked(h);
  }
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemSetAccess,
   (CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  ++g_counters.vmm_set_access_calls;
  if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
  // The whole range must be mapped.
  for (std::uintptr_t p = ptr; p < ptr + size;) {
    auto m = g_mapped.find(p);
    if (m == g_mapped.end()) return CUDA_ERROR_INVALID_VALUE;
    p += m->second.size;
  }
  // Each named device's access set; the others' kept.
  for (size_t i = 0; i < count; ++i)
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
        desc[i].location.id >= g_devices)
      return CUDA_ERROR_INVALID_DEVICE;
  for (auto m = g_mapped.find(ptr); m != g_mapped.end() && m->first < ptr + size; ++m) {
    for (size_t i = 0; i < count; ++i) {
      const unsigned bit = 1u << desc[i].location.id;
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) m->second.devices |= bit;
      else m->second.devices &= ~bit;
    }
    m->second.accessible = m->second.devices != 0;
    mprotect(reinterpret_cast<void*>(m->first), m->second.size,
             m->second.accessible ? PROT_READ | PROT_WRITE : PROT_NONE);
  }
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemRetainAllocationHandle, (CUmemGenericAllocationHandle * handle, void* addr)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  auto m = vmm_containing(g_mapped, reinterpret_cast<std::uintptr_t>(addr));
  if (!handle || m == g_mapped.end()) return CUDA_ERROR_INVALID_VALUE;
  ++g_physical[m->second.handle].refs;
  *handle = m->second.handle;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemGetAllocationPropertiesFromHandle,
   (CUmemAllocationProp * prop, CUmemGenericAllocationHandle handle)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  auto it = g_physical.find(handle);
  if (!prop || it == g_physical.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
  *prop = it->second.prop;
  return CUDA_SUCCESS;
}

SI(CUresult, cuMemExportToShareableHandle,
   (void* shareable, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType type,
    unsigned long long flags)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  auto it = g_physical.find(handle);
  if (!shareable || flags != 0 || it == g_physical.end() || it->second.refs == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR ||
      !(it->second.prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
    return CUDA_ERROR_NOT_PERMITTED;
  const int fd = dup(it->second.fd);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  *static_cast<int*>(shareable) = fd;
  return CUDA_SUCCESS;
}

// The descriptor's memory as a new physical allocation of this process
// (another process's memfd, when it came through a socket).
SI(CUresult, cuMemImportFromShareableHandle,
   (CUmemGenericAllocationHandle * handle, void* shareable, CUmemAllocationHandleType type)) {
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!handle || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
  struct stat st {};
  const int src = static_cast<int>(reinterpret_cast<std::intptr_t>(shareable));
  if (fstat(src, &st) != 0 || st.st_size <= 0 || st.st_size % kVmmGranularity)
    return CUDA_ERROR_INVALID_VALUE;
  const int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
  const unsigned long long h = g_next_handle++;
  Physical& p = g_physical[h];
  p.fd = fd;
  p.size = static_cast<std::size_t>(st.st_size);
  p.dev = 0;
  p.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  p.imported = true;
  *handle = h;
  ++g_counters.vmm_imported;
  return CUDA_SUCCESS;
}

// Legacy IPC of another process's cuMemAlloc memory is not modelled: every
// handle is one this driver cannot open.
SI(CUresult, cuIpcOpenMemHandle_v2, (CUdeviceptr * p, CUipcMemHandle handle, unsigned int flags)) {
  (void)handle;
  (void)flags;
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  if (!p) return CUDA_ERROR_INVALID_VALUE;
  ++g_counters.ipc_opens_refused;
  return CUDA_ERROR_INVALID_VALUE;
}

SI(CUresult, cuIpcCloseMemHandle, (CUdeviceptr p)) {
  (void)p;
  std::lock_guard lock(g_mu);
  if (CUresult e = state_error()) return e;
  return CUDA_ERROR_INVALID_VALUE;
}

SI(CUresult, cuGetExportTable, (const void** table, const CUuuid* id)) {
  (void)id;
  if (table) *table = nullptr;
  return CUDA_ERROR_NOT_SUPPORTED;
}

// ---- cuGetProcAddress ------------------------------------------------------

namespace {
CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status);
}  // namespace

SI(CUresult, cuGetProcAddress_v2,
   (const char* symbol, void** pfn, int version, cuuint64_t flags,
    CUdriverProcAddressQueryResult* status)) {
  return lookup(symbol, pfn, version, flags, status);
}

SI(CUresult, cuGetProcAddress, (const char* symbol, void** pfn, int version, cuuint64_t flags)) {
  return lookup(symbol, pfn, version, flags, nullptr);
}

namespace {

struct Export {
  const char* name;
  void* address;
};

#define E(n) \
  { #n, reinterpret_cast < void*>(&si_##n) }
const Export kExports[] = {
    E(cuInit),
    E(cuDriverGetVersion),
    E(cuDeviceGetCount),
    E(cuDeviceGet),
    E(cuDeviceTotalMem_v2),
    E(cuDeviceGetUuid),
    E(cuDeviceGetUuid_v2),
    E(cuCtxCreate_v2),
    E(cuCtxCreate_v4),
    E(cuCtxDestroy),
    E(cuCtxDestroy_v2),
    E(cuCtxGetCurrent),
    E(cuCtxSetCurrent),
    E(cuCtxPushCurrent_v2),
    E(cuCtxPopCurrent_v2),
    E(cuCtxGetDevice),
    E(cuCtxGetId),
    E(cuCtxGetApiVersion),
    E(cuCtxAttach),
    E(cuCtxDetach),
    E(cuCtxSynchronize),
    E(cuCtxSynchronize_v2),
    E(cuDevicePrimaryCtxRetain),
    E(cuDevicePrimaryCtxRelease),
    E(cuDevicePrimaryCtxRelease_v2),
    E(cuDevicePrimaryCtxReset),
    E(cuDevicePrimaryCtxReset_v2),
    E(cuDevicePrimaryCtxGetState),
    E(cuMemAlloc_v2),
    E(cuMemAllocPitch_v2),
    E(cuMemFree_v2),
    E(cuMemAllocHost_v2),
    E(cuMemHostAlloc),
    E(cuMemFreeHost),
    E(cuMemGetInfo_v2),
    E(cuMemAllocAsync),
    E(cuMemAllocAsync_ptsz),
    E(cuMemFreeAsync),
    E(cuMemAllocManaged),
    E(cuMemGetAddressRange_v2),
    E(cuPointerGetAttribute),
    E(cuPointerSetAttribute),
    E(cuMemGetHandleForAddressRange),
    E(cuPointerGetAttributes),
    E(cuMemHostGetFlags),
    E(cuIpcGetMemHandle),
    E(cuMemsetD8Async),
    E(cuMemsetD8Async_ptsz),
    E(cuStreamCreate),
    E(cuStreamCreateWithPriority),
    E(cuStreamDestroy_v2),
    E(cuCtxEnablePeerAccess),
    E(cuStreamSynchronize),
    E(cuStreamSynchronize_ptsz),
    E(cuEventCreate),
    E(cuEventRecord),
    E(cuEventQuery),
    E(cuCtxRecordEvent),
    E(cuEventSynchronize),
    E(cuEventDestroy_v2),
    E(cuStreamWaitEvent),
    E(cuStreamBeginCapture_v2),
    E(cuStreamBeginCapture_v2_ptsz),
    E(cuStreamEndCapture),
    E(cuStreamEndCapture_ptsz),
    E(cuStreamIsCapturing),
    E(cuStreamIsCapturing_ptsz),
    E(cuMemAllocFromPoolAsync),
    E(cuMemAllocFromPoolAsync_ptsz),
    E(cuMemFreeAsync_ptsz),
    E(cuMemPoolCreate),
    E(cuMemPoolDestroy),
    E(cuDeviceGetDefaultMemPool),
    E(cuDeviceGetMemPool),
    E(cuDeviceSetMemPool),
    E(cuMemPoolSetAttribute),
    E(cuMemPoolGetAttribute),
    E(cuMemPoolTrimTo),
    E(cuMemGetAllocationGranularity),
    E(cuMemCreate),
    E(cuMemRelease),
    E(cuMemAddressReserve),
    E(cuMemAddressFree),
    E(cuMemMap),
    E(cuMemUnmap),
    E(cuMemSetAccess),
    E(cuMemRetainAllocationHandle),
    E(cuMemGetAllocationPropertiesFromHandle),
    E(cuMemExportToShareableHandle),
    E(cuMemImportFromShareableHandle),
    E(cuDeviceGetAttribute),
    E(cuIpcOpenMemHandle_v2),
    E(cuIpcCloseMemHandle),
    E(cuGetExportTable),
    E(cuGetProcAddress),
    E(cuGetProcAddress_v2),
};

// Base name, the CUDA version that introduced this ABI, the export serving it.
struct Version {
  const char* base;
  int since;
  const char* name;
};
const Version kVersions[] = {
    {"cuInit", 2000, "cuInit"},
    {"cuDriverGetVersion", 2020, "cuDriverGetVersion"},
    {"cuDeviceGetCount", 2000, "cuDeviceGetCount"},
    {"cuDeviceGet", 2000, "cuDeviceGet"},
    {"cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2"},
    {"cuDeviceGetUuid", 9020, "cuDeviceGetUuid"},
    {"cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2"},
    {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
    {"cuCtxCreate", 12050, "cuCtxCreate_v4"},
    {"cuCtxDestroy", 2000, "cuCtxDestroy"},
    {"cuCtxDestroy", 4000, "cuCtxDestroy_v2"},
    {"cuCtxGetCurrent", 4000, "cuCtxGetCurrent"},
    {"cuCtxSetCurrent", 4000, "cuCtxSetCurrent"},
    {"cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2"},
    {"cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2"},
    {"cuCtxGetDevice", 2000, "cuCtxGetDevice"},
    {"cuCtxGetId", 12000, "cuCtxGetId"},
    {"cuCtxGetApiVersion", 3020, "cuCtxGetApiVersion"},
    {"cuCtxAttach", 2000, "cuCtxAttach"},
    {"cuCtxDetach", 2000, "cuCtxDetach"},
    {"cuCtxSynchronize", 2000, "cuCtxSynchronize"},
    {"cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain"},
    {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease"},
    {"cuDevicePrimaryCtxRelease", 11000, "cuDevicePrimaryCtxRelease_v2"},
    {"cuDevicePrimaryCtxReset", 7000, "cuDevicePrimaryCtxReset"},
    {"cuDevicePrimaryCtxReset", 11000, "cuDevicePrimaryCtxReset_v2"},
    {"cuDevicePrimaryCtxGetState", 7000, "cuDevicePrimaryCtxGetState"},
    {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
    {"cuMemAllocPitch", 3020, "cuMemAllocPitch_v2"},
    {"cuMemFree", 3020, "cuMemFree_v2"},
    {"cuMemAllocAsync", 11020, "cuMemAllocAsync"},
    {"cuMemFreeAsync", 11020, "cuMemFreeAsync"},
    {"cuMemAllocManaged", 6000, "cuMemAllocManaged"},
    {"cuMemAllocHost", 3020, "cuMemAllocHost_v2"},
    {"cuMemHostAlloc", 2020, "cuMemHostAlloc"},
    {"cuMemFreeHost", 2000, "cuMemFreeHost"},
    {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
    {"cuMemGetAddressRange", 3020, "cuMemGetAddressRange_v2"},
    {"cuPointerGetAttribute", 4000, "cuPointerGetAttribute"},
    {"cuPointerSetAttribute", 6000, "cuPointerSetAttribute"},
    {"cuMemGetHandleForAddressRange", 11070, "cuMemGetHandleForAddressRange"},
    {"cuPointerGetAttributes", 7000, "cuPointerGetAttributes"},
    {"cuMemHostGetFlags", 2030, "cuMemHostGetFlags"},
    {"cuIpcGetMemHandle", 4010, "cuIpcGetMemHandle"},
    {"cuMemsetD8Async", 3020, "cuMemsetD8Async"},
    {"cuStreamCreate", 2000, "cuStreamCreate"},
    {"cuStreamCreateWithPriority", 5050, "cuStreamCreateWithPriority"},
    {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
    {"cuCtxEnablePeerAccess", 4000, "cuCtxEnablePeerAccess"},
    {"cuMemGetAllocationGranularity", 10020, "cuMemGetAllocationGranularity"},
    {"cuMemCreate", 10020, "cuMemCreate"},
    {"cuMemRelease", 10020, "cuMemRelease"},
    {"cuMemAddressReserve", 10020, "cuMemAddressReserve"},
    {"cuMemAddressFree", 10020, "cuMemAddressFree"},
    {"cuMemMap", 10020, "cuMemMap"},
    {"cuMemUnmap", 10020, "cuMemUnmap"},
    {"cuMemSetAccess", 10020, "cuMemSetAccess"},
    {"cuMemRetainAllocationHandle", 11000, "cuMemRetainAllocationHandle"},
    {"cuMemGetAllocationPropertiesFromHandle", 10020, "cuMemGetAllocationPropertiesFromHandle"},
    {"cuMemExportToShareableHandle", 10020, "cuMemExportToShareableHandle"},
    {"cuMemImportFromShareableHandle", 10020, "cuMemImportFromShareableHandle"},
    {"cuDeviceGetAttribute", 2000, "cuDeviceGetAttribute"},
    {"cuIpcOpenMemHandle", 11000, "cuIpcOpenMemHandle_v2"},
    {"cuIpcCloseMemHandle", 4010, "cuIpcCloseMemHandle"},
    {"cuStreamSynchronize", 2000, "cuStreamSynchronize"},
    {"cuEventCreate", 2000, "cuEventCreate"},
    {"cuEventRecord", 2000, "cuEventRecord"},
    {"cuEventQuery", 2000, "cuEventQuery"},
    {"cuCtxRecordEvent", 12050, "cuCtxRecordEvent"},
    {"cuEventSynchronize", 2000, "cuEventSynchronize"},
    {"cuEventDestroy", 4000, "cuEventDestroy_v2"},
    {"cuStreamWaitEvent", 2000, "cuStreamWaitEvent"},
    {"cuStreamBeginCapture", 10010, "cuStreamBeginCapture_v2"},
    {"cuStreamEndCapture", 10000, "cuStreamEndCapture"},
    {"cuStreamIsCapturing", 10000, "cuStreamIsCapturing"},
    {"cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync"},
    {"cuMemPoolCreate", 11020, "cuMemPoolCreate"},
    {"cuMemPoolDestroy", 11020, "cuMemPoolDestroy"},
    {"cuDeviceGetDefaultMemPool", 11020, "cuDeviceGetDefaultMemPool"},
    {"cuDeviceGetMemPool", 11020, "cuDeviceGetMemPool"},
    {"cuDeviceSetMemPool", 11020, "cuDeviceSetMemPool"},
    {"cuMemPoolSetAttribute", 11020, "cuMemPoolSetAttribute"},
    {"cuMemPoolGetAttribute", 11020, "cuMemPoolGetAttribute"},
    {"cuMemPoolTrimTo", 11020, "cuMemPoolTrimTo"},
    {"cuGetExportTable", 3000, "cuGetExportTable"},
    {"cuGetProcAddress", 11030, "cuGetProcAddress"},
    {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
};

void* own(const char* name) {
  for (const Export& e : kExports)
    if (strcmp(e.name, name) == 0) return e.address;
  return nullptr;
}

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  {
    std::lock_guard lock(g_mu);
    ++g_counters.get_proc_address;
  }
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  const Version* best = nullptr;
  bool exists = false;
  for (const Version& v : kVersions)
    if (strcmp(v.base, symbol) == 0) {
      exists = true;
      if (v.since <= version && (!best || v.since > best->since)) best = &v;
    }
  if (!best) {
    if (status)
      *status = exists ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                       : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  std::string name = best->name;
  // Per-thread default stream variants, where the entry point has one.
  if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
    if (own((name + "_ptsz").c_str())) name += "_ptsz";
  *pfn = own(name.c_str());
  if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}

}  // namespace

// ---- the test interface ----------------------------------------------------

extern "C" __attribute__((visibility("default"))) StandinCounters* standin_counters(void) {
  return &g_counters;
}

extern "C" __attribute__((visibility("default"))) void standin_fail_next(const char* function,
                                                                         int count,
                                                                         CUresult error) {
  std::lock_guard lock(g_mu);
  g_fail.push_back(Fail{function, count, error});
}

extern "C" __attribute__((visibility("default"))) void standin_set_capacity(size_t bytes) {
  std::lock_guard lock(g_mu);
  g_capacity = bytes;
}

extern "C" __attribute__((visibility("default"))) size_t standin_used(int dev) {
  std::lock_guard lock(g_mu);
  return dev >= 0 && dev < 8 ? g_used[dev] : 0;
}

extern "C" __attribute__((visibility("default"))) size_t standin_used_all(int dev) {
  std::lock_guard lock(g_mu);
  return dev >= 0 && dev < 8 ? device_used(dev) : 0;
}

extern "C" __attribute__((visibility("default"))) uint64_t standin_nvml_memory_info_calls(void) {
  std::lock_guard lock(g_mu);
  return g_shared ? sb_nvml_calls() : 0;
}

extern "C" __attribute__((visibility("default"))) void* standin_own(const char* name) {
  return own(name);
}

extern "C" __attribute__((visibility("default"))) uint64_t standin_dead_writes(void) {
  std::lock_guard lock(g_mu);
  uint64_t written = 0;
  for (const Alloc& a : g_quarantine) {
    const auto* b = reinterpret_cast<const unsigned char*>(a.base);
    for (std::size_t i = 0; i < a.size; ++i)
      if (b[i] != kPoison) {
        ++written;
        break;
      }
  }
  return g_counters.dead_writes + written;
}

extern "C" __attribute__((visibility("default"))) void standin_hold_syncs(int hold) {
  {
    std::lock_guard lock(g_hold_mu);
    g_hold_syncs = hold != 0;
  }
  g_hold_cv.notify_all();
}

extern "C" __attribute__((visibility("default"))) int standin_syncs_held(void) {
  std::lock_guard lock(g_hold_mu);
  return g_syncs_held;
}

extern "C" __attribute__((visibility("default"))) int standin_pending_ops(CUdeviceptr p, size_t n) {
  std::lock_guard lock(g_mu);
  int count = 0;
  auto scan = [&](Ctx* c) {
    if (!c) return;
    for (const Op& op : c->pending)
      if (op.dst < p + n && p < op.dst + op.n) ++count;
  };
  for (Ctx* c : g_all_ctx) scan(c);
  return count;
}
