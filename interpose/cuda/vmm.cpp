#include "interpose/cuda/vmm.hpp"

#include <atomic>
#include <map>
#include <optional>
#include <unordered_map>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "interpose/cuda/contexts.hpp"
#include "interpose/node/node.hpp"
#include "interpose/runtime.hpp"
#include "sys/log.hpp"

namespace gpupool::cuda::vmm {
namespace {

// The answer for a handle or address the program has given up (released,
// freed): what the driver says for one it does not know.
constexpr CUresult kGone = CUDA_ERROR_INVALID_VALUE;

// One physical allocation, mapped whole with read-write access in a
// reservation of its own: so it is in the driver whether held or the
// program's. While the program has it (active), the flags say what the
// program believes it has of it.
struct Unit {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr va = 0;
  std::size_t size = 0;
  CtxState* st = nullptr;
  Block* block = nullptr;    // while active
  std::uint64_t serial = 0;  // buffer ids (pooled_buffer_id)
  std::uint32_t uses = 0;    // hand-outs
  bool active = false;       // the pool handed it out
  bool claimed = false;      // the program took its reservation since the hand-out
  bool handle_out = false;   // the program has the handle (created, not released)
  bool va_out = false;       // ... the reservation (reserved, not freed)
  bool mapped = false;       // ... the handle mapped at the reservation
  bool escaped = false;      // the program's own now: the pool only forgets it
  bool inherited = false;    // a forked parent's: no driver call about it
};

}  // namespace

// The units, found by handle and by address (cuda::State::vmm). Unit's
// fields are read and written under mu too (the analysis cannot say so:
// the lock is not the unit's).
struct Registry {
  Ranked<LockRank::cuda_vmm> mu;
  std::unordered_map<CUmemGenericAllocationHandle, Unit*> by_handle GPUPOOL_GUARDED_BY(mu);
  std::map<CUdeviceptr, Unit*> by_va GPUPOOL_GUARDED_BY(mu);
  // Units in the registry: calls of programs that never had one skip the
  // lock.
  std::atomic<std::size_t> units{0};
};

Registry* make_registry() { return new Registry; }

namespace {

// The registry, where the runtime exists: every caller but none() runs
// where it does (a unit, a backend, the runtime's fork handlers).
Registry& registry() { return *runtime_if_started()->cuda->vmm; }
// The handle the pool gave this thread's last cuMemCreate, for its next
// cuMemAddressReserve.
thread_local CUmemGenericAllocationHandle t_claim = 0;

// No unit (none without a runtime): the call is the driver's alone.
bool none() {
  const Runtime* rt = runtime_if_started();
  return !rt || rt->cuda->vmm->units.load(std::memory_order_acquire) == 0;
}

Unit* by_handle_locked(Registry& r, CUmemGenericAllocationHandle h) GPUPOOL_REQUIRES(r.mu) {
  auto it = r.by_handle.find(h);
  return it == r.by_handle.end() ? nullptr : it->second;
}

Unit* containing_locked(Registry& r, CUdeviceptr p) GPUPOOL_REQUIRES(r.mu) {
  auto it = r.by_va.upper_bound(p);
  if (it == r.by_va.begin()) return nullptr;
  --it;
  return p - it->first < it->second->size ? it->second : nullptr;
}

void add_locked(Registry& r, Unit* u) GPUPOOL_REQUIRES(r.mu) {
  r.by_handle.emplace(u->handle, u);  // may throw: the caller undoes
  try {
    r.by_va.emplace(u->va, u);
  } catch (...) {
    r.by_handle.erase(u->handle);
    throw;
  }
  r.units.fetch_add(1, std::memory_order_release);
}

void remove_locked(Registry& r, Unit* u) GPUPOOL_REQUIRES(r.mu) {
  if (r.by_handle.erase(u->handle)) r.units.fetch_sub(1, std::memory_order_release);
  r.by_va.erase(u->va);
}

// A driver call on a unit that should not fail; if it does (a driver torn
// down, a context state the probe did not cover), the log says so.
void expect_success(CUresult r, const char* what, const Unit& u) {
  if (r != CUDA_SUCCESS)
    log().debug("cuda: {} of a virtual memory unit ({} bytes at {:#x}) failed: {}", what, u.size,
                u.va, int(r));
}

// The driver frees the unit (its unmap, release and address free).
void free_in_driver(const Driver& d, const Unit& u) {
  expect_success(d.mem_unmap(u.va, u.size), "unmap", u);
  expect_success(d.mem_release(u.handle), "release", u);
  expect_success(d.mem_address_free(u.va, u.size), "address free", u);
}

// The program does something with an active unit that the pool cannot
// follow: the driver is brought to the state the program believes (what
// gpupool kept mapped, reserved or created for it is undone), the unit
// leaves the registry, and its block is returned for the caller to forget
// (Pool::forget, outside the lock).
Block* escape_locked(Registry& r, const Driver* d, Unit* u) GPUPOOL_REQUIRES(r.mu) {
  if (d && !u->inherited) {
    if (!u->mapped) expect_success(d->mem_unmap(u->va, u->size), "unmap", *u);
    if (!u->va_out) expect_success(d->mem_address_free(u->va, u->size), "address free", *u);
    if (!u->handle_out) expect_success(d->mem_release(u->handle), "release", *u);
  }
  remove_locked(r, u);
  u->escaped = true;
  log().debug(
      "cuda: a virtual memory allocation of {} bytes left the pool (the program uses it "
      "in a way the pool does not follow)",
      u->size);
  return u->block;
}

// The program gave up both the handle and the reservation: the unit goes
// back to the pool (its block returned, for the caller to free outside the
// lock).
Block* take_back_locked(Registry& r, Unit* u) GPUPOOL_REQUIRES(r.mu) {
  (void)r;
  if (u->handle_out || u->va_out) return nullptr;
  u->active = false;
  Block* b = u->block;
  u->block = nullptr;
  return b;
}

// What one hook's visit to the registry leaves for after its lock: blocks
// whose units escaped (the pool forgets them) and one the pool takes back.
// Declared before the lock, so settled once it is let go.
struct AfterLock {
  std::vector<Block*> escaped;
  Block* back = nullptr;

  // Whichever of two units (a handle's, an address's) is active escapes.
  void escape(Registry& r, const Driver& d, Unit* a, Unit* b) GPUPOOL_REQUIRES(r.mu) {
    if (a && a->active) escaped.push_back(escape_locked(r, &d, a));
    if (b && b != a && b->active) escaped.push_back(escape_locked(r, &d, b));
  }
  void settle() {
    Runtime* rt = escaped.empty() && !back ? nullptr : runtime_if_started();
    for (Block* b : escaped)
      if (b && rt) rt->pool.forget(b);
    escaped.clear();
    if (back && rt) rt->pool.free(back);
    back = nullptr;
  }
  ~AfterLock() { settle(); }
};

// Plain device memory. Not a tile pool (usage): sparse arrays map those
// through calls gpupool does not follow.
bool poolable(const CUmemAllocationProp* prop, unsigned long long flags) {
  return prop && flags == 0 && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !prop->win32HandleMetaData &&
         prop->allocFlags.usage == 0;
}

class VmmBackend final : public ContextFenced {
 public:
  VmmBackend(CtxState* st, const CUmemAllocationProp& prop, bool fenced)
      : ContextFenced(st, fenced, /*marks=*/false), prop_(prop) {}

  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    const Driver& d = *driver();
    CUmemGenericAllocationHandle h = 0;
    CUresult r = d.mem_create(&h, bytes, &prop_, 0);
    if (r != CUDA_SUCCESS) return failed(r);
    CUdeviceptr va = 0;
    if ((r = d.mem_address_reserve(&va, bytes, 0, 0, 0)) != CUDA_SUCCESS) {
      d.mem_release(h);
      return failed(r);
    }
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = d.mem_map(va, bytes, 0, h, 0)) != CUDA_SUCCESS ||
        (r = d.mem_set_access(va, bytes, &access, 1)) != CUDA_SUCCESS) {
      d.mem_unmap(va, bytes);
      d.mem_address_free(va, bytes);
      d.mem_release(h);
      return failed(r);
    }
    auto* u = new Unit;
    u->serial = next_serial();
    u->handle = h;
    u->va = va;
    u->size = bytes;
    u->st = st_;
    try {
      Registry& r = registry();
      LockGuard lock(r.mu);
      add_locked(r, u);
    } catch (...) {
      free_in_driver(d, *u);
      delete u;
      throw;
    }
    return {BackendStatus::ok, static_cast<Handle>(h), 0, u};
  }

  void release(Handle, std::size_t, void* data) override { let_go(static_cast<Unit*>(data)); }
  // The context ended: the memory did not end with it (not in a forked
  // child, whose units are its parent's).
  void drop(Handle, std::size_t, void* data) override { let_go(static_cast<Unit*>(data)); }

  bool relieve(std::size_t bytes) override {
    return escape_ghosts() || node::ask_neighbours(device_group(st_->dev), bytes);
  }

 private:
  static BackendResult failed(CUresult r) {
    return {r == CUDA_ERROR_OUT_OF_MEMORY ? BackendStatus::out_of_memory : BackendStatus::error, 0,
            static_cast<int>(r)};
  }
  static void let_go(Unit* u) {
    bool call_driver = false;
    {
      Registry& r = registry();
      LockGuard lock(r.mu);
      if (!u->escaped) {
        remove_locked(r, u);
        call_driver = !u->inherited && !exiting();
      }
    }
    if (call_driver)
      if (const Driver* d = driver()) free_in_driver(*d, *u);
    delete u;
  }

  CUmemAllocationProp prop_;
};

}  // namespace

std::unique_ptr<Backend> backend(CtxState* st, const CUmemAllocationProp& prop, bool fenced) {
  return std::make_unique<VmmBackend>(st, prop, fenced);
}

std::optional<CUresult> create(const Driver& d, CUmemGenericAllocationHandle* handle, size_t bytes,
                               const CUmemAllocationProp* prop, unsigned long long flags) {
  if (!handle || bytes == 0 || !poolable(prop, flags) || !d.mem_release || !d.mem_address_reserve ||
      !d.mem_address_free || !d.mem_map || !d.mem_unmap || !d.mem_set_access)
    return std::nullopt;
  Runtime* rt = runtime();
  if (!rt || !rt->config.cuda) return std::nullopt;
  // A handle of exactly the size asked for (vmm.hpp).
  if (rt->pool.bins().rounded(bytes) != bytes) return std::nullopt;
  CtxState* st = current_state(d, *rt, true);
  if (!st || st->dev != prop->location.id) return std::nullopt;
  Arena* arena = vmm_arena(st, *rt, *prop);
  if (!arena) return std::nullopt;
  const AllocResult a = rt->pool.allocate(arena, bytes);
  if (!a.block) return static_cast<CUresult>(a.error ? a.error : CUDA_ERROR_OUT_OF_MEMORY);
  if (a.block->size != bytes) {  // a larger bin's block (GPUPOOL_BORROW)
    rt->pool.free(a.block);
    return std::nullopt;
  }
  auto* u = static_cast<Unit*>(a.block->data);
  CUmemGenericAllocationHandle h = 0;
  {
    LockGuard lock(registry().mu);
    u->block = a.block;
    u->active = u->handle_out = true;
    u->va_out = u->mapped = u->claimed = false;
    ++u->uses;
    h = u->handle;  // (once the lock is let go, a context's end may take the unit)
  }
  t_claim = h;
  *handle = h;
  return CUDA_SUCCESS;
}

CUresult address_reserve(const Driver& d, CUdeviceptr* ptr, size_t bytes, size_t alignment,
                         CUdeviceptr addr, unsigned long long flags) {
  const CUmemGenericAllocationHandle claim = t_claim;
  t_claim = 0;
  if (claim && ptr && flags == 0) {
    Registry& r = registry();
    LockGuard lock(r.mu);
    Unit* u = by_handle_locked(r, claim);
    if (u && u->active && u->handle_out && !u->va_out && !u->mapped && bytes == u->size &&
        (alignment == 0 || ((alignment & (alignment - 1)) == 0 && u->va % alignment == 0)) &&
        (addr == 0 || addr == u->va)) {
      u->va_out = u->claimed = true;
      *ptr = u->va;
      return CUDA_SUCCESS;
    }
  }
  return d.mem_address_reserve(ptr, bytes, alignment, addr, flags);
}

// Each call below that names a unit: without units, the driver's; else,
// under the registry's lock, the unit found and what the call does to it:
// an answer of gpupool's, or the unit taken back, or the units it names
// escaped and the call passed to the driver (after the lock, once the pool
// has forgotten them).

CUresult map(const Driver& d, CUdeviceptr ptr, size_t bytes, size_t offset,
             CUmemGenericAllocationHandle handle, unsigned long long flags) {
  if (none()) return d.mem_map(ptr, bytes, offset, handle, flags);
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    Unit* uh = by_handle_locked(r, handle);
    Unit* uv = containing_locked(r, ptr);
    if (uh && (!uh->active || !uh->handle_out)) return kGone;  // a released handle
    if (uv && (!uv->active || !uv->va_out)) return kGone;      // a freed reservation
    if (uh && uh == uv && ptr == uh->va && offset == 0 && bytes == uh->size && flags == 0 &&
        !uh->mapped) {
      uh->mapped = true;  // it is: since its creation
      return CUDA_SUCCESS;
    }
    after.escape(r, d, uh, uv);
  }
  after.settle();
  return d.mem_map(ptr, bytes, offset, handle, flags);
}

CUresult unmap(const Driver& d, CUdeviceptr ptr, size_t bytes) {
  if (none()) return d.mem_unmap(ptr, bytes);
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    if (Unit* u = containing_locked(r, ptr)) {
      if (!u->active || !u->va_out) return kGone;
      if (ptr == u->va && bytes == u->size) {
        u->mapped = false;  // unmapping an unmapped range of a reservation succeeds too
        return CUDA_SUCCESS;
      }
      after.escape(r, d, u, nullptr);
    }
  }
  after.settle();
  return d.mem_unmap(ptr, bytes);
}

CUresult address_free(const Driver& d, CUdeviceptr ptr, size_t bytes) {
  if (none()) return d.mem_address_free(ptr, bytes);
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    if (Unit* u = containing_locked(r, ptr)) {
      if (!u->active || !u->va_out) return kGone;
      if (ptr == u->va && bytes == u->size) {
        if (u->mapped) return CUDA_ERROR_INVALID_VALUE;  // the driver's answer while mapped
        u->va_out = false;
        after.back = take_back_locked(r, u);
        return CUDA_SUCCESS;
      }
      after.escape(r, d, u, nullptr);
    }
  }
  after.settle();
  return d.mem_address_free(ptr, bytes);
}

CUresult release(const Driver& d, CUmemGenericAllocationHandle handle) {
  if (none()) return d.mem_release(handle);
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    if (Unit* u = by_handle_locked(r, handle)) {
      if (!u->active || !u->handle_out) return kGone;
      // Never reserved through the pool since its hand-out: the program may
      // have used the handle where gpupool does not see (a multicast binding,
      // another reservation it maps later): the driver releases it.
      if (u->claimed) {
        // Released while mapped, the memory stays until it is unmapped, as
        // in the driver.
        u->handle_out = false;
        after.back = take_back_locked(r, u);
        return CUDA_SUCCESS;
      }
      after.escape(r, d, u, nullptr);
    }
  }
  after.settle();
  return d.mem_release(handle);
}

CUresult set_access(const Driver& d, CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc,
                    size_t count) {
  if (none()) return d.mem_set_access(ptr, bytes, desc, count);
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    if (Unit* u = containing_locked(r, ptr)) {
      if (!u->active || !u->va_out) return kGone;
      if (!u->mapped) return CUDA_ERROR_INVALID_VALUE;  // nothing mapped there
      // Mapped as the program believes: the driver answers (again, cheaply:
      // 0.3 µs on the H200 for access it already has).
      if (ptr != u->va || bytes != u->size) after.escape(r, d, u, nullptr);
    }
  }
  after.settle();
  return d.mem_set_access(ptr, bytes, desc, count);
}

namespace {
// A call that gives the program a handle another holder may use (another
// reference to release, another process to map it): the unit of `handle`,
// else the one containing `addr`, escapes the pool first, unless it is
// gone (inactive, or its `live` flag cleared: kGone); then the driver
// answers.
template <class Call>
CUresult escape_then(const Driver& d, CUmemGenericAllocationHandle handle, CUdeviceptr addr,
                     bool Unit::*live, Call&& call) {
  if (none()) return call();
  Registry& r = registry();
  AfterLock after;
  {
    LockGuard lock(r.mu);
    if (Unit* u = handle ? by_handle_locked(r, handle) : containing_locked(r, addr)) {
      if (!u->active || !(u->*live)) return kGone;
      after.escape(r, d, u, nullptr);
    }
  }
  after.settle();
  return call();
}
}  // namespace

// Another reference to release: the program's to count, with the driver.
CUresult retain_handle(const Driver& d, CUmemGenericAllocationHandle* handle, void* addr) {
  return escape_then(d, 0, reinterpret_cast<CUdeviceptr>(addr), &Unit::mapped,
                     [&] { return d.mem_retain_handle(handle, addr); });
}

// Another process may map it: never to be handed out again.
CUresult export_handle(const Driver& d, void* shareable, CUmemGenericAllocationHandle handle,
                       CUmemAllocationHandleType type, unsigned long long flags) {
  return escape_then(d, handle, 0, &Unit::handle_out,
                     [&] { return d.mem_export(shareable, handle, type, flags); });
}

PtrInfo find(CUdeviceptr p) {
  PtrInfo i;
  if (none()) return i;
  Registry& r = registry();
  LockGuard lock(r.mu);
  if (const Unit* u = containing_locked(r, p)) {
    i.found = true;
    i.active = u->active && u->mapped;
    i.base = u->va;
    i.size = i.requested = u->size;
    i.buffer_id = pooled_buffer_id(u->serial, u->uses);
  }
  return i;
}

bool escape_ghosts() {
  if (none()) return false;
  Registry& r = registry();
  AfterLock after;
  {
    const Driver* d = driver();
    LockGuard lock(r.mu);
    std::vector<Unit*> ghosts;
    for (auto& [va, u] : r.by_va)
      if (u->active && !u->handle_out && !u->mapped && u->va_out) ghosts.push_back(u);
    for (Unit* u : ghosts) after.escaped.push_back(escape_locked(r, exiting() ? nullptr : d, u));
  }
  const bool any = !after.escaped.empty();
  after.settle();
  return any;
}

void retire_context(CtxState* st, Pool& pool) {
  std::vector<Block*> gone;
  {
    const Driver* d = driver();
    Registry& r = registry();
    LockGuard lock(r.mu);
    std::vector<Unit*> mine;
    for (auto& [va, u] : r.by_va)
      if (u->st == st && u->active) mine.push_back(u);
    for (Unit* u : mine) gone.push_back(escape_locked(r, exiting() ? nullptr : d, u));
  }
  for (Block* b : gone) pool.forget(b);
}

// Taken in prepare, let go in parent or child: outside the thread-safety
// analysis (core/thread_safety.hpp).
bool fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { return fork_wait::take(registry().mu); }
void fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { registry().mu.unlock(); }
void fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (auto& [va, u] : registry().by_va) u->inherited = true;
  t_claim = 0;
  registry().mu.unlock();
}

}  // namespace gpupool::cuda::vmm
