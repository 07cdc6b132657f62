#include "interpose/cuda/memory.hpp"

#include <unistd.h>

#include <map>
#include <shared_mutex>
#include <vector>

#include "core/lock_rank.hpp"

#include "interpose/cuda/contexts.hpp"
#include "interpose/cuda/driver.hpp"
#include "interpose/cuda/pointers.hpp"
#include "interpose/cuda/state.hpp"
#include "interpose/cuda/vmm.hpp"
#include "interpose/node/node.hpp"
#include "interpose/runtime.hpp"

namespace gpupool::cuda {

// Contexts whose memory another device's context was given access to
// (cuCtxEnablePeerAccess), by context id (its handle without ids): the
// devices, as a mask. Read by every map of a range's granules.
struct PeerAccess {
  Ranked<LockRank::cuda_peer_access> mu;
  std::map<unsigned long long, std::uint32_t> devices GPUPOOL_GUARDED_BY(mu);
  std::atomic<bool> any{false};  // single-GPU programs skip the lock
};

PeerAccess* make_peer_access() { return new PeerAccess; }

namespace {

unsigned long long peer_key(const CtxState* st) {
  return st->id ? st->id : reinterpret_cast<std::uintptr_t>(st->ctx);
}

std::uint32_t peer_devices(const CtxState* st) {
  const Runtime* rt = runtime_if_started();
  if (!rt || !rt->cuda->peers->any.load(std::memory_order_acquire)) return 0;
  PeerAccess& pa = *rt->cuda->peers;
  LockGuard lock(pa.mu);
  auto it = pa.devices.find(peer_key(st));
  return it == pa.devices.end() ? 0 : it->second;
}

// Memory of one context. Device and pinned blocks alike are fenced by the
// context's work (cuMemFree and cuMemFreeHost both wait for all of it,
// measured), and are given back to the driver only while the context lives
// (once it is destroyed the driver has freed them) and before exit. Each
// allocation's record is its entry in `map` (device or pinned pointers).
class CuContextBackend : public ContextFenced {
 public:
  CuContextBackend(PtrMap& map, CtxState* st, bool fenced, bool marks = false)
      : ContextFenced(st, fenced, marks), map_(map) {}

  // The driver freed it with its context, or it is a forked parent's.
  void drop(Handle, std::size_t, void* data) override { erase_record(data); }

 protected:
  static BackendResult result(CUresult r, Handle h) {
    if (r == CUDA_SUCCESS) return {BackendStatus::ok, h, 0};
    return {r == CUDA_ERROR_OUT_OF_MEMORY ? BackendStatus::out_of_memory : BackendStatus::error, 0,
            static_cast<int>(r)};
  }
  // A fresh block into the pointer map: its entry is the block's record
  // (BackendResult::data), handed back at its release or drop. If that
  // fails (out of host memory) the block goes back (`undo`) and the failure
  // on to the hook, which asks the driver alone.
  template <class Undo>
  BackendResult record(Handle h, std::size_t bytes, unsigned host_flags, Undo&& undo) {
    try {
      return {BackendStatus::ok, h, 0, map_.insert(h, bytes, st_, host_flags)};
    } catch (...) {
      undo();
      throw;
    }
  }
  void erase_record(void* data) { map_.erase(static_cast<PtrMap::Entry*>(data)); }
  // free() unless the driver is being torn down or the context is gone,
  // also where gpupool did not see it go (the driver freed the memory with
  // it, and its address may be another allocation's now). A release costs
  // tens of microseconds; asking the driver, tens of nanoseconds.
  template <class Free>
  void release_while_alive(Free&& free) {
    if (exiting()) return;
    SharedLock lock(st_->teardown_mu);
    if (st_->retired.load(std::memory_order_acquire)) return;
    if (!context_alive(*driver(), st_)) return;
    free();
  }

 private:
  PtrMap& map_;
};

class DeviceBackend final : public CuContextBackend {
 public:
  DeviceBackend(CtxState* st, bool fenced, bool solo, bool marks)
      : CuContextBackend(st->state->device_map, st, fenced, marks), solo_(fenced && solo) {}

  // The solo rule (contexts.hpp): device blocks only.
  std::uint64_t fence() override { return solo_ && solo_free() ? 0 : CuContextBackend::fence(); }

  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    CUdeviceptr p = 0;
    const CUresult r = driver()->mem_alloc(&p, bytes);
    if (r != CUDA_SUCCESS) return result(r, p);
    return record(p, bytes, 0, [&] { driver()->mem_free(p); });
  }

  void release(Handle h, std::size_t, void* data) override {
    erase_record(data);
    release_while_alive([&] { driver()->mem_free(h); });  // any (or no) current context
  }

  // Other gpupool processes on this GPU may hold what we miss.
  bool relieve(std::size_t bytes) override {
    return vmm::escape_ghosts() || node::ask_neighbours(device_group(st_->dev), bytes);
  }

  // Expandable ranges (GPUPOOL_SEGMENTS=expandable), with the driver's
  // virtual memory calls. These run under the range's lock, which ranks
  // after every interpose lock (core/lock_rank.hpp): they call the driver
  // and take no lock. Virtual memory is the device's, not the context's:
  // it outlives the context, so a retired context's range is still given
  // back (not in a forked child, whose driver is not the parent's).
  std::size_t granule() override {
    const Driver* d = driver();
    if (!d->mem_get_granularity || !d->mem_create || !d->mem_map || !d->mem_unmap ||
        !d->mem_set_access || !d->mem_release || !d->mem_address_reserve || !d->mem_address_free)
      return 0;
    // Granules exportable as POSIX descriptors where the device can: a
    // piece the program shares through cuIpcGetMemHandle is sent to the
    // importing process so (ipc.hpp).
    int posix_fd = 0;
    exportable_ = d->device_get_attribute &&
                  d->device_get_attribute(
                      &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                      st_->dev) == CUDA_SUCCESS &&
                  posix_fd != 0;
    const CUmemAllocationProp prop = properties();
    std::size_t g = 0;
    if (d->mem_get_granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS)
      return 0;
    granule_ = g;
    return g;
  }

  // One range per arena (core/ranges.hpp): its granules' state is kept here.
  BackendResult reserve(std::size_t bytes) override {
    std::vector<bool> mapped(bytes / granule_);  // before the driver: may throw
    CUdeviceptr p = 0;
    const CUresult r = driver()->mem_address_reserve(&p, bytes, granule_, 0, 0);
    if (r != CUDA_SUCCESS) return result(r, 0);
    {
      LockGuard lock(access_mu_);  // grant_peers reads them from a hook
      base_ = p;
      mapped_ = std::move(mapped);
    }
    pid_ = getpid();
    return {BackendStatus::ok, p, 0, st_->state->device_map.range_record(p, bytes, st_)};
  }

  // One physical allocation per granule, as PyTorch's expandable segments:
  // a granule can then be unmapped and given back alone (the driver unmaps
  // whole mappings only). Access for this context's device and the devices
  // given peer access to it (access_for; docs/memory.md).
  BackendResult map(Handle at, std::size_t bytes, void*) override {
    const Driver* d = driver();
    const CUmemAllocationProp prop = properties();
    LockGuard lock(access_mu_);
    std::size_t done = 0;
    CUresult r = CUDA_SUCCESS;
    for (; done < bytes; done += granule_) {
      CUmemGenericAllocationHandle h = 0;
      r = d->mem_create(&h, granule_, &prop, 0);
      if (r != CUDA_SUCCESS) break;
      r = d->mem_map(at + done, granule_, 0, h, 0);
      // Mapped, the physical memory lives until unmapped.
      d->mem_release(h);
      if (r != CUDA_SUCCESS) break;
      mapped_[(at + done - base_) / granule_] = true;
    }
    if (r == CUDA_SUCCESS) {
      CUmemAccessDesc access[kMaxDevices];
      r = d->mem_set_access(at, bytes, access, access_for(access));
    }
    if (r != CUDA_SUCCESS) {
      unmap_granules(at, done);  // all or nothing
      return result(r, 0);
    }
    return {BackendStatus::ok, at, 0, nullptr};
  }

  void unmap(Handle at, std::size_t bytes, void*, std::uint64_t fence) override {
    if (exiting()) return;
    const Driver* d = driver();
    // The device may still use it: wait for the context's work (the
    // driver's own synchronization, not synchronize_context, whose lock
    // ranks before the range's). A context gone has no work left.
    if (!passed(fence) && !st_->retired.load(std::memory_order_acquire) && context_alive(*d, st_) &&
        d->ctx_push(st_->ctx) == CUDA_SUCCESS) {
      d->ctx_synchronize();
      CUcontext popped = nullptr;
      d->ctx_pop(&popped);
    }
    LockGuard lock(access_mu_);
    unmap_granules(at, bytes);
  }

  // Every granule mapped now made accessible to the devices given peer
  // access since (those mapped later get it at their map).
  void grant_peers() {
    const Driver* d = driver();
    LockGuard lock(access_mu_);
    CUmemAccessDesc access[kMaxDevices];
    const std::size_t n = access_for(access);
    for (std::size_t i = 0; i < mapped_.size();) {
      std::size_t j = i;
      while (j < mapped_.size() && mapped_[j]) ++j;
      if (j > i) d->mem_set_access(base_ + i * granule_, (j - i) * granule_, access, n);
      i = j + 1;
    }
  }

  void unreserve(Handle base, std::size_t bytes, void* range, bool) override {
    PtrMap::forget_range(static_cast<PtrMap::Entry*>(range));
    if (exiting() || getpid() != pid_) return;
    LockGuard lock(access_mu_);
    unmap_granules(base, bytes);  // what a retired context's pieces still map
    driver()->mem_address_free(base, bytes);
  }

 private:
  CUmemAllocationProp properties() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = st_->dev;
    if (exportable_) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
  }

  // Read-write for this context's device and the devices given peer
  // access to it; how many.
  std::size_t access_for(CUmemAccessDesc* out) const {
    const std::uint32_t peers = peer_devices(st_) & ~(1u << st_->dev);
    std::size_t n = 0;
    for (int dev = -1; dev < kMaxDevices; ++dev) {
      if (dev >= 0 && !(peers & (1u << dev))) continue;
      CUmemAccessDesc& a = out[n++];
      a = {};
      a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      a.location.id = dev < 0 ? st_->dev : dev;
      a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      if (n == kMaxDevices) break;
    }
    return n;
  }

  // Each mapped granule of [at, at + bytes) unmapped: its physical memory
  // goes with its mapping.
  void unmap_granules(Handle at, std::size_t bytes) GPUPOOL_REQUIRES(access_mu_) {
    const Driver* d = driver();
    for (Handle g = at; g < at + bytes; g += granule_) {
      const std::size_t i = (g - base_) / granule_;
      if (!mapped_[i]) continue;
      d->mem_unmap(g, granule_);
      mapped_[i] = false;
    }
  }

  static constexpr int kMaxDevices = 32;  // a mask's bits
  bool solo_;
  bool exportable_ = false;  // granules made with POSIX descriptors requested
  // Taken inside the range's lock: the granules mapped, and their access
  // granted, by map, unmap and grant_peers (which comes from a hook).
  Ranked<LockRank::cuda_range_access> access_mu_;
  std::size_t granule_ = 0;
  // The range (set by reserve, used under the range's lock).
  Handle base_ GPUPOOL_GUARDED_BY(access_mu_) = 0;
  std::vector<bool> mapped_ GPUPOOL_GUARDED_BY(access_mu_);  // per granule
  pid_t pid_ = 0;                                            // the process that reserved it
};

class HostBackend final : public CuContextBackend {
 public:
  HostBackend(CtxState* st, bool fenced, unsigned flags)
      : CuContextBackend(st->state->host_map, st, fenced), flags_(flags) {}

  // hint: the flags of the call being served (the first block of a
  // normalised family is allocated with exactly what the program asked for).
  BackendResult allocate(std::size_t bytes, std::uint64_t hint) override {
    void* p = nullptr;
    const CUresult r = driver()->mem_host_alloc(&p, bytes, static_cast<unsigned>(hint));
    const Handle h = reinterpret_cast<Handle>(p);
    if (r != CUDA_SUCCESS) return result(r, h);
    return record(h, bytes, flags_, [&] { driver()->mem_free_host(p); });
  }

  void release(Handle h, std::size_t, void* data) override {
    erase_record(data);
    release_while_alive([&] { driver()->mem_free_host(reinterpret_cast<void*>(h)); });
  }

  // Other gpupool processes on the node may hold pinned memory.
  bool relieve(std::size_t bytes) override { return node::ask_neighbours("cuda-host", bytes); }

 private:
  unsigned flags_;  // the arena's normalised flags (DEVICEMAP set)
};

}  // namespace

std::unique_ptr<Backend> device_backend(CtxState* st, bool fenced, bool solo, bool marks) {
  return std::make_unique<DeviceBackend>(st, fenced, solo, marks);
}

std::unique_ptr<Backend> host_backend(CtxState* st, bool fenced, unsigned flags) {
  return std::make_unique<HostBackend>(st, fenced, flags);
}

void grant_peer_access(const Driver& d, Runtime& rt, CUcontext peer, CUdevice dev) {
  if (dev < 0 || dev >= 32) return;
  // Recorded whether gpupool has a record of peer yet: its first range is
  // mapped with the access.
  unsigned long long id = 0;
  const unsigned long long key = d.ctx_get_id && d.ctx_get_id(peer, &id) == CUDA_SUCCESS && id
                                     ? id
                                     : reinterpret_cast<std::uintptr_t>(peer);
  {
    PeerAccess& pa = *rt.cuda->peers;
    LockGuard lock(pa.mu);
    pa.devices[key] |= 1u << dev;
    pa.any.store(true, std::memory_order_release);
  }
  CtxState* st = find_state(d, rt, peer);
  if (!st || st->dev == dev) return;
  // Its range, if it has one: alive while the teardown lock is shared and
  // the context not retired.
  SharedLock lock(st->teardown_mu);
  if (st->retired.load(std::memory_order_acquire)) return;
  if (Arena* a = st->device_arena.load(std::memory_order_acquire))
    if (auto* b = dynamic_cast<DeviceBackend*>(&a->backend())) b->grant_peers();
}

}  // namespace gpupool::cuda
