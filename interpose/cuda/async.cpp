#include "interpose/cuda/async.hpp"

#include <fmt/format.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "core/no_destructor.hpp"
#include "interpose/cuda/contexts.hpp"
#include "interpose/runtime.hpp"
#include "sys/log.hpp"

namespace gpupool::cuda {

// One driver pool the program allocated from. Never freed (a hook may hold
// one while the pool is destroyed); forgotten when it is.
struct AsyncPool {
  CUmemoryPool pool = nullptr;
  CUdevice dev = 0;
  std::atomic<Arena*> arena{nullptr};  // null once retired
  // gpupool set the release threshold (the program never did).
  std::atomic<bool> raised{false};
  // What the program last did with it, and the counters (hits, misses as
  // far as the pool's reserved bytes tell: an allocation that made it grow
  // is a miss).
  std::atomic<std::uint64_t> last_use_ns{0};
  std::atomic<std::uint64_t> uses{0};
  std::atomic<std::uint64_t> last_reserved{0};
  std::atomic<std::uint64_t> hits{0}, misses{0};
  std::atomic<std::uint64_t> last_read_ns{0};  // of last_reserved (async_allocated)
  // What the last trim could not give back (frees not yet executed), as of
  // `uses` then: not offered again until the program uses the pool.
  std::atomic<std::uint64_t> stuck{0}, stuck_at{UINT64_MAX};
  // The driver's last answers, for when it answers no more (exit, or the
  // pool destroyed).
  std::atomic<std::uint64_t> reserved{0}, used{0}, reserved_high{0}, used_high{0};
  // The program is destroying the pool (or did): gpupool names it to the
  // driver no more, and the destroy waits for the calls under way
  // (PoolCall), since the driver may give its handle to the next pool.
  std::atomic<bool> going{false};
  std::atomic<unsigned> calls{0};
};

namespace {

// The pools whose release threshold the program set: recorded whether a
// runtime exists or not (a program may set it before its first
// stream-ordered allocation makes the runtime). Never destroyed: hooks
// run during exit.
struct Thresholds {
  Ranked<LockRank::cuda_async_thresholds> mu;
  std::unordered_set<CUmemoryPool> set GPUPOOL_GUARDED_BY(mu);
};
Thresholds& thresholds() {
  static NoDestructor<Thresholds> t;
  return *t;
}
bool program_threshold(CUmemoryPool pool) {
  Thresholds& t = thresholds();
  LockGuard lock(t.mu);
  return t.set.count(pool) != 0;
}

constexpr int kCachedDevices = 64;

// ---- stream capture --------------------------------------------------------

struct Captures {
  CaptureLock mu;
  struct Capture {
    CUstream stream;
    long thread;  // a per-thread default stream's thread, else 0
  };
  std::vector<Capture> ongoing GPUPOOL_GUARDED_BY(capture_lock());
  std::atomic<std::size_t> count{0};
};
Captures& captures() {
  static NoDestructor<Captures> c;  // hooks run during exit
  return *c;
}

Captures::Capture capture_key(CUstream s, bool ptsz) {
  const bool per_thread = s == CU_STREAM_PER_THREAD || (ptsz && s == nullptr);
  return {per_thread ? CU_STREAM_PER_THREAD : s,
          per_thread ? static_cast<long>(syscall(SYS_gettid)) : 0};
}

constexpr std::uint64_t kReadEveryNs = 1'000'000;

bool capturing() { return captures().count.load(std::memory_order_acquire) > 0; }

// ---- the allocations the observer was told of ------------------------------

// Only while the pool has an observer (trace, sites, leak report): its
// free must name the allocation's arena and size, which the driver's free
// does not. Sharded by address, as the recorder is; each shard's lock is
// held around the observer's call, so that a pool's destruction
// (async_pool_destroyed), which ends its allocations here first, never
// meets a call naming its arena after.
struct Traced {
  struct Allocation {
    AsyncPool* pool;
    std::size_t size;
  };
  static constexpr unsigned kShards = 16;
  struct alignas(64) Shard {
    Ranked<LockRank::cuda_async_blocks> mu;
    std::unordered_map<CUdeviceptr, Allocation> live GPUPOOL_GUARDED_BY(mu);
  };
  Shard shards[kShards];
  Shard& of(CUdeviceptr p) { return shards[(p >> 8 ^ p >> 20) % kShards]; }
};
}  // namespace

// The managed pools (cuda::State::async): by driver pool, each device's
// current one once looked up (cuDeviceSetMemPool clears it), and the
// allocations the observer was told of.
struct AsyncRegistry {
  Ranked<LockRank::cuda_async_pools> mu;
  std::unordered_map<CUmemoryPool, AsyncPool*> pools GPUPOOL_GUARDED_BY(mu);
  std::atomic<AsyncPool*> current[kCachedDevices] = {};
  Traced traced;
};

AsyncRegistry* make_async_registry() { return new AsyncRegistry; }

namespace {

AsyncRegistry& registry(const Runtime& rt) { return *rt.cuda->async; }
// Where a call may come without a runtime: nullptr then.
AsyncRegistry* registry_if_made() {
  const Runtime* rt = runtime_if_started();
  return rt ? rt->cuda->async : nullptr;
}

// The observer told of `p`'s end, and it forgotten.
void end_traced(Runtime& rt, Traced::Shard& s,
                std::unordered_map<CUdeviceptr, Traced::Allocation>::iterator it)
    GPUPOOL_REQUIRES(s.mu) {
  if (Arena* a = it->second.pool->arena.load(std::memory_order_acquire))
    rt.pool.note_outside_free(*a, it->first, it->second.size);
  s.live.erase(it);
}

// `p` (of `size`, from `pool`) remembered and told.
void start_traced(Runtime& rt, Traced::Shard& s, CUdeviceptr p, AsyncPool& pool, std::size_t size)
    GPUPOOL_REQUIRES(s.mu) {
  // Read under the lock: a pool destroyed meanwhile has swept this shard.
  Arena* a = pool.arena.load(std::memory_order_acquire);
  if (!a) return;
  // Still remembered: its free never came this way (a graph's free node,
  // its context's end): it ended before the driver handed it out again.
  if (auto it = s.live.find(p); it != s.live.end()) end_traced(rt, s, it);
  try {
    s.live.emplace(p, Traced::Allocation{&pool, size});
  } catch (...) {
    return;  // out of host memory: neither its start nor its end is told
  }
  rt.pool.note_outside_allocate(*a, p, size);
}

// ---- the pool's attributes ---------------------------------------------------

// One of gpupool's driver calls naming p's pool: none once the program
// destroys it (async_pool_destroying waits for those under way).
class PoolCall {
 public:
  explicit PoolCall(AsyncPool& p) : p_(p) {
    p_.calls.fetch_add(1, std::memory_order_seq_cst);
    ok_ = !p_.going.load(std::memory_order_seq_cst);
  }
  ~PoolCall() { p_.calls.fetch_sub(1, std::memory_order_release); }
  PoolCall(const PoolCall&) = delete;
  PoolCall& operator=(const PoolCall&) = delete;
  explicit operator bool() const { return ok_; }

 private:
  AsyncPool& p_;
  bool ok_ = false;
};

// The driver's answer, else (exit, or a capture under way, where gpupool
// makes no call it does not have to) its last one.
std::uint64_t attribute(const Driver& d, AsyncPool& p, CUmemPool_attribute a,
                        std::atomic<std::uint64_t>& last) {
  cuuint64_t v = 0;
  const PoolCall call(p);
  if (call && !exiting() && !capturing() && d.mem_pool_get_attribute &&
      d.mem_pool_get_attribute(p.pool, a, &v) == CUDA_SUCCESS)
    last.store(v, std::memory_order_relaxed);
  return last.load(std::memory_order_relaxed);
}

// Reserved beyond what is in use: the memory the pool keeps.
std::uint64_t kept(const Driver& d, AsyncPool& p) {
  const std::uint64_t r = attribute(d, p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, p.reserved);
  const std::uint64_t u = attribute(d, p, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, p.used);
  return r > u ? r - u : 0;
}

bool set_threshold(const Driver& d, AsyncPool& p, std::uint64_t bytes) {
  cuuint64_t v = bytes;
  const PoolCall call(p);
  return call && d.mem_pool_set_attribute &&
         d.mem_pool_set_attribute(p.pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &v) == CUDA_SUCCESS;
}

// While holding is stopped gpupool keeps nothing: a threshold it raised
// goes back to the driver's default.
void follow_holding(const Driver& d, Runtime& rt, AsyncPool& p) {
  if (!rt.pool.holding() && p.raised.load(std::memory_order_acquire) && set_threshold(d, p, 0))
    p.raised.store(false, std::memory_order_release);
}

// The pool's memory as an arena's held memory (core/backend.hpp).
class AsyncBackend final : public Backend, public HeldOutside {
 public:
  explicit AsyncBackend(AsyncPool& p) : p_(p) {}

  // The program's calls go to the driver; the pool never allocates here.
  BackendResult allocate(std::size_t, std::uint64_t) override { return {}; }
  void release(Handle, std::size_t, void*) override {}
  HeldOutside* outside() override { return this; }

  std::size_t held() override {
    const Driver* d = driver_if_loaded();
    if (!d || exiting() || capturing()) return 0;
    std::uint64_t h = kept(*d, p_);
    if (p_.stuck_at.load(std::memory_order_acquire) == p_.uses.load(std::memory_order_acquire)) {
      const std::uint64_t stuck = p_.stuck.load(std::memory_order_relaxed);
      h = h > stuck ? h - stuck : 0;
    }
    return h;
  }

  std::uint64_t last_use_ns() override { return p_.last_use_ns.load(std::memory_order_relaxed); }

  // Not while a stream captures: the capture's start waits for the trim,
  // and a trim waits for no capture.
  std::size_t give_back() override {
    const Driver* d = driver_if_loaded();
    Runtime* rt = runtime_if_started();
    if (!d || !rt || exiting() || !d->mem_pool_trim_to) return 0;
    SharedLock lock(capture_lock());
    if (capturing()) return 0;
    const std::uint64_t uses = p_.uses.load(std::memory_order_acquire);
    const std::uint64_t before = kept(*d, p_);
    follow_holding(*d, *rt, p_);
    {
      const PoolCall call(p_);
      if (!call) return 0;
      d->mem_pool_trim_to(p_.pool, 0);  // never what is in use
    }
    const std::uint64_t after = kept(*d, p_);
    p_.last_reserved.store(p_.reserved.load(std::memory_order_relaxed), std::memory_order_relaxed);
    p_.stuck.store(after, std::memory_order_relaxed);
    p_.stuck_at.store(uses, std::memory_order_release);
    return before > after ? before - after : 0;
  }

  // Bytes only: the driver does not say how many allocations it keeps.
  // Once retired (the pool may be gone) only the counts kept here, so the
  // counters never go backwards.
  void add_counters(Stats& s) override {
    const std::uint64_t misses = p_.misses.load(std::memory_order_relaxed);
    s.hits += p_.hits.load(std::memory_order_relaxed);
    s.misses += misses;
    s.backend_allocs += misses;
    const Driver* d = driver_if_loaded();
    if (!d || !p_.arena.load(std::memory_order_acquire)) return;
    const std::uint64_t held = kept(*d, p_);
    const std::uint64_t used = p_.used.load(std::memory_order_relaxed);
    const std::uint64_t reserved = used + held;
    const std::uint64_t rh = attribute(*d, p_, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, p_.reserved_high);
    const std::uint64_t uh = attribute(*d, p_, CU_MEMPOOL_ATTR_USED_MEM_HIGH, p_.used_high);
    s.held_bytes += held;
    s.active_bytes += used;
    s.managed_bytes += reserved;
    s.peak_held_bytes += std::max<std::uint64_t>(held, rh > uh ? rh - uh : 0);
    s.peak_active_bytes += std::max(used, uh);
    s.peak_managed_bytes += std::max(reserved, rh);
  }

  // The driver's high-water marks (which it resets to the current value
  // when set to 0), as PyTorch's reset_peak_memory_stats does for its
  // cudaMallocAsync backend.
  void reset_peaks() override {
    const Driver* d = driver_if_loaded();
    if (!d || exiting() || capturing() || !d->mem_pool_set_attribute) return;
    const PoolCall call(p_);
    if (!call) return;
    for (CUmemPool_attribute a :
         {CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, CU_MEMPOOL_ATTR_USED_MEM_HIGH}) {
      cuuint64_t zero = 0;
      d->mem_pool_set_attribute(p_.pool, a, &zero);
    }
  }

 private:
  AsyncPool& p_;
};

// The record of `pool` on st's device, made (with its arena) the first
// time; the threshold raised unless the program set one.
AsyncPool* record(const Driver& d, Runtime& rt, CUmemoryPool pool, CtxState* st) {
  AsyncRegistry& r = registry(rt);
  LockGuard lock(r.mu);
  if (auto it = r.pools.find(pool); it != r.pools.end()) return it->second;
  // Not a pool (the allocation gets the driver's error): nothing to manage.
  cuuint64_t reserved = 0;
  if (d.mem_pool_get_attribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
      CUDA_SUCCESS)
    return nullptr;
  auto* p = new AsyncPool;
  p->last_reserved.store(reserved, std::memory_order_relaxed);
  p->pool = pool;
  p->dev = st->dev;
  CUmemoryPool def = nullptr;
  const bool is_default = d.device_get_default_mem_pool &&
                          d.device_get_default_mem_pool(&def, st->dev) == CUDA_SUCCESS &&
                          def == pool;
  ArenaOptions o;
  o.name = is_default ? fmt::format("cuda dev {} async default pool", int(st->dev))
                      : fmt::format("cuda dev {} async pool {}", int(st->dev), r.pools.size() + 1);
  o.group = device_group(st->dev);
  o.kind = "cuda-async";
  o.device = st->device;
  o.max_block = st->device_total;
  o.max_held = rt.config.max_held.resolve(st->device_total);
  p->arena.store(rt.pool.add_arena(std::make_unique<AsyncBackend>(*p), std::move(o)),
                 std::memory_order_release);
  if (!program_threshold(pool) && rt.pool.holding()) {
    const std::size_t limit = rt.config.max_held.resolve(st->device_total);
    if (set_threshold(d, *p, limit)) p->raised.store(true, std::memory_order_release);
  }
  r.pools.emplace(pool, p);
  log().debug("cuda: memory pool {} of device {} managed (release threshold {})",
              static_cast<void*>(pool), int(st->dev),
              p->raised.load() ? "raised" : "the program's");
  return p;
}

AsyncPool* find(CUmemoryPool pool) {
  AsyncRegistry* made = registry_if_made();
  if (!made) return nullptr;
  AsyncRegistry& r = *made;
  LockGuard lock(r.mu);
  auto it = r.pools.find(pool);
  return it == r.pools.end() ? nullptr : it->second;
}

}  // namespace

AsyncPool* async_pool(const Driver& d, Runtime& rt, CUmemoryPool pool) {
  if (!rt.config.cuda || !d.mem_pool_get_attribute || !d.mem_pool_set_attribute ||
      !d.mem_pool_trim_to || !d.device_get_mem_pool)
    return nullptr;
  CtxState* st = current_state(d, rt, true);
  if (!st) return nullptr;
  AsyncPool* p = nullptr;
  if (pool) {
    static thread_local AsyncPool* t_last = nullptr;  // a program allocates from one pool mostly
    p = t_last && t_last->pool == pool && t_last->arena.load(std::memory_order_relaxed) ? t_last
                                                                                        : nullptr;
    if (!p) p = t_last = record(d, rt, pool, st);
    if (!p) return nullptr;
  } else {
    const bool cached = st->dev >= 0 && st->dev < kCachedDevices;
    p = cached ? registry(rt).current[st->dev].load(std::memory_order_acquire) : nullptr;
    if (!p) {
      CUmemoryPool current = nullptr;
      if (d.device_get_mem_pool(&current, st->dev) != CUDA_SUCCESS || !current) return nullptr;
      p = record(d, rt, current, st);
      if (!p) return nullptr;
      if (cached) registry(rt).current[st->dev].store(p, std::memory_order_release);
    }
  }
  follow_holding(d, rt, *p);
  return p;
}

int async_device(const AsyncPool* p) { return p ? p->dev : -1; }

void async_allocated(const Driver& d, Runtime& rt, AsyncPool* p, CUresult r, CUdeviceptr ptr,
                     std::size_t bytes) {
  if (!p || r != CUDA_SUCCESS) return;
  p->last_use_ns.store(Pool::now_ns(), std::memory_order_relaxed);
  p->uses.fetch_add(1, std::memory_order_acq_rel);
  // A captured allocation is the graph's, not the pool's: not counted,
  // nor traced (its memory is made at each of the graph's launches).
  if (capturing()) return;
  if (rt.pool.observed()) {
    Traced::Shard& s = registry(rt).traced.of(ptr);
    LockGuard lock(s.mu);
    start_traced(rt, s, ptr, *p, bytes);
  }
  // The pool's reserved bytes are read at most once a millisecond: a driver
  // call on every allocation costs what pooling saves a host-bound loop.
  // A reading that finds the pool grown counts one miss; the other
  // allocations count as hits.
  const std::uint64_t t = Pool::now_ns();
  std::uint64_t last = p->last_read_ns.load(std::memory_order_relaxed);
  if (t - last < kReadEveryNs ||
      !p->last_read_ns.compare_exchange_strong(last, t, std::memory_order_relaxed)) {
    p->hits.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::uint64_t now = attribute(d, *p, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, p->reserved);
  const std::uint64_t before = p->last_reserved.exchange(now, std::memory_order_relaxed);
  (now > before ? p->misses : p->hits).fetch_add(1, std::memory_order_relaxed);
}

bool async_freeing(Runtime& rt, CUdeviceptr ptr, AsyncFreed* freed) {
  if (!rt.pool.observed()) return false;
  Traced::Shard& s = registry(rt).traced.of(ptr);
  LockGuard lock(s.mu);
  auto it = s.live.find(ptr);
  if (it == s.live.end()) return false;
  *freed = {it->second.pool, it->second.size};
  end_traced(rt, s, it);
  return true;
}

void async_free_refused(Runtime& rt, CUdeviceptr ptr, const AsyncFreed& freed) {
  Traced::Shard& s = registry(rt).traced.of(ptr);
  LockGuard lock(s.mu);
  start_traced(rt, s, ptr, *freed.pool, freed.size);
}

void async_attribute_set(const Driver& d, CUmemoryPool pool, CUmemPool_attribute attr) {
  (void)d;
  if (attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) return;
  {
    Thresholds& t = thresholds();
    LockGuard lock(t.mu);
    t.set.insert(pool);
  }
  // A record made before this (one made after reads the set, under the
  // registry's lock: one of the two sees the other).
  if (AsyncPool* p = find(pool)) p->raised.store(false, std::memory_order_release);
}

bool async_threshold_seen(CUmemoryPool pool, cuuint64_t* value) {
  AsyncPool* p = find(pool);
  if (!p || !p->raised.load(std::memory_order_acquire)) return false;
  *value = 0;
  return true;
}

void async_pool_destroying(CUmemoryPool pool, bool going) {
  AsyncPool* p = find(pool);
  if (!p) return;
  p->going.store(going, std::memory_order_seq_cst);
  // The calls that began before: a driver call of a microsecond or so each.
  while (going && p->calls.load(std::memory_order_acquire) != 0) sched_yield();
}

void async_pool_destroyed(Runtime& rt, CUmemoryPool pool) {
  AsyncPool* p = nullptr;
  {
    Thresholds& t = thresholds();
    LockGuard lock(t.mu);
    t.set.erase(pool);
  }
  AsyncRegistry& r = registry(rt);
  {
    LockGuard lock(r.mu);
    if (auto it = r.pools.find(pool); it != r.pools.end()) {
      p = it->second;
      r.pools.erase(it);
    }
  }
  for (auto& c : r.current) {
    AsyncPool* expected = p;
    if (p) c.compare_exchange_strong(expected, nullptr);
  }
  if (!p) return;
  Arena* a = p->arena.exchange(nullptr, std::memory_order_acq_rel);
  if (!a) return;
  // Its allocations still in the program's hands end in the trace here:
  // their arena goes (the driver frees them when the program does).
  for (Traced::Shard& s : r.traced.shards) {
    LockGuard lock(s.mu);
    for (auto it = s.live.begin(); it != s.live.end();) {
      if (it->second.pool != p) {
        ++it;
        continue;
      }
      rt.pool.note_outside_free(*a, it->first, it->second.size);
      it = s.live.erase(it);
    }
  }
  rt.pool.retire_arena(a);
}

void async_current_pool_changed(CUdevice dev) {
  AsyncRegistry* r = registry_if_made();
  if (r && dev >= 0 && dev < kCachedDevices)
    r->current[dev].store(nullptr, std::memory_order_release);
}

bool stream_capturing() { return capturing(); }

CaptureLock& capture_lock() { return captures().mu; }

// A guard held across calls (the analysis follows one function at a time).
CaptureChange::CaptureChange() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { capture_lock().lock(); }
CaptureChange::~CaptureChange() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { capture_lock().unlock(); }

void capture_started(CUstream s, bool ptsz) {
  captures().ongoing.push_back(capture_key(s, ptsz));
  captures().count.fetch_add(1, std::memory_order_acq_rel);
}

void capture_maybe_ended(const Driver& d, CUstream s, bool ptsz) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  auto is_capturing = ptsz ? d.stream_is_capturing_ptsz : d.stream_is_capturing;
  if (is_capturing && is_capturing(s, &status) == CUDA_SUCCESS &&
      status != CU_STREAM_CAPTURE_STATUS_NONE)
    return;
  const Captures::Capture key = capture_key(s, ptsz);
  auto& v = captures().ongoing;
  auto it = std::find_if(v.begin(), v.end(), [&](const Captures::Capture& c) {
    return c.stream == key.stream && c.thread == key.thread;
  });
  if (it == v.end()) return;
  v.erase(it);
  captures().count.fetch_sub(1, std::memory_order_acq_rel);
}

void capture_stream_destroyed(CUstream s) {
  auto& v = captures().ongoing;
  const auto gone = std::remove_if(v.begin(), v.end(), [&](const Captures::Capture& c) {
    return c.stream == s && c.thread == 0;
  });
  captures().count.fetch_sub(static_cast<std::size_t>(v.end() - gone), std::memory_order_acq_rel);
  v.erase(gone, v.end());
}

bool async_fork_prepare(AsyncRegistry* r) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if ((r && !fork_wait::take(r->mu)) || !fork_wait::take(thresholds().mu) ||
      !fork_wait::take(captures().mu))
    return false;
  if (r)
    for (Traced::Shard& s : r->traced.shards)
      if (!fork_wait::take(s.mu)) return false;
  return true;
}

void async_fork_parent(AsyncRegistry* r) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (r)
    for (Traced::Shard& s : r->traced.shards) s.mu.unlock();
  captures().mu.unlock();
  thresholds().mu.unlock();
  if (r) r->mu.unlock();
}

// The parent's allocations are not the child's to trace.
void async_fork_child(AsyncRegistry* r) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (r)
    for (Traced::Shard& s : r->traced.shards) {
      s.live.clear();
      s.mu.unlock();
    }
  captures().mu.remake_held_in_child();
  thresholds().mu.unlock();
  if (r) r->mu.unlock();
}

// A forked child's pools are its driver's business: the parent's records
// go without a driver call (CUDA does not carry them across fork()).
void async_fork_renew(Runtime& rt) {
  std::vector<AsyncPool*> all;
  AsyncRegistry& r = registry(rt);
  {
    LockGuard lock(r.mu);
    for (auto& [pool, p] : r.pools) all.push_back(p);
    r.pools.clear();
  }
  {
    Thresholds& t = thresholds();
    LockGuard lock(t.mu);
    t.set.clear();
  }
  for (auto& c : r.current) c.store(nullptr, std::memory_order_relaxed);
  {
    LockGuard lock(capture_lock());
    captures().ongoing.clear();
    captures().count.store(0, std::memory_order_relaxed);
  }
  for (AsyncPool* p : all)
    if (Arena* a = p->arena.exchange(nullptr, std::memory_order_acq_rel))
      rt.pool.retire_arena(a, /*keep_stats=*/false);
}

}  // namespace gpupool::cuda
