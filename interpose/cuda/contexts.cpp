#include "interpose/cuda/contexts.hpp"

#include "core/fork_wait.hpp"
#include "interpose/cuda/async.hpp"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "core/hot_tls.hpp"
#include "core/no_destructor.hpp"
#include "core/spin_lock.hpp"
#include "interpose/cuda/ipc.hpp"
#include "interpose/cuda/memory.hpp"
#include "interpose/cuda/pointers.hpp"
#include "interpose/cuda/vmm.hpp"
#include "interpose/node/node.hpp"
#include "interpose/runtime.hpp"
#include "sys/log.hpp"

namespace gpupool::cuda {
namespace {

// ---- contexts -------------------------------------------------------------

// The registry is the runtime's (state.hpp). The primary contexts are
// recorded as cuDevicePrimaryCtxRetain makes them, before any runtime
// (CUDA's runtime library retains the device's primary context at its
// start, before the program's first allocation; the record of a context
// made later reads them), by device ordinal: atomics made at compile time,
// no lock (hooks may run before this library's static constructors, from
// another library's constructor, and during exit).
constexpr CUdevice kPrimaries = 1024;  // device ordinals recorded
std::atomic<CUcontext> g_primary[kPrimaries] = {};

// The room's state; the runtime exists wherever this is called.
State& state(Runtime& rt) { return *rt.cuda; }

// The current context's record as this thread last found it: valid while
// the current context has the same id (the same handle, with a driver
// without ids) and no record was retired since.
struct ThreadCache {
  CUcontext ctx = nullptr;
  unsigned long long id = 0;
  std::uint64_t generation = 0;
  CtxState* st = nullptr;
};
GPUPOOL_HOT_TLS ThreadCache t_cache;

// end_solo()'s and end_device_order()'s lock: a second caller waits for the
// first one's wait.
using SoloLock = Ranked<LockRank::cuda_solo>;
SoloLock& solo_mu() {
  static NoDestructor<SoloLock> m;
  return *m;
}

std::size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? std::size_t(pages) * std::size_t(page) : SIZE_MAX;
}

CtxState* find_live_locked(State& s, CUcontext ctx) GPUPOOL_REQUIRES(s.contexts_mu) {
  for (CtxState* st : s.live)
    if (st->ctx == ctx) return st;
  return nullptr;
}

// Context ids in use: the driver has cuCtxGetId and answers it (a driver
// that says CUDA_ERROR_NOT_SUPPORTED, as compatibility layers may, turns
// them off for the process: records then go by handle, and end through the
// hooks).
bool ids(const Driver& d, const State& s) {
  return d.ctx_get_id && !s.no_ids.load(std::memory_order_relaxed);
}

void turn_off_ids(State& s) {
  if (s.no_ids.exchange(true)) return;
  log().warn(
      "cuda: the driver gives no context ids (cuCtxGetId: CUDA_ERROR_NOT_SUPPORTED); "
      "gpupool tells contexts by handle, and sees a context end only through the calls it "
      "intercepts");
  s.generation.fetch_add(1, std::memory_order_acq_rel);  // thread caches keyed by id go
}

// cuCtxGetId's answer, the ids turned off on CUDA_ERROR_NOT_SUPPORTED.
CUresult get_id(const Driver& d, State& s, CUcontext ctx, unsigned long long* id) {
  const CUresult r = d.ctx_get_id(ctx, id);
  if (r == CUDA_ERROR_NOT_SUPPORTED) turn_off_ids(s);
  return r;
}

// A record is of the context (handle, id) names: by handle alone without
// ids (id 0; the driver's ids start at 1).
bool same_context(const CtxState* st, unsigned long long id) { return id == 0 || st->id == id; }

// The context `ctx` names now: its id (0 without ids), false when it names
// none (destroyed, or never a context). Without ids the driver is asked for
// the context's API version, which it answers only for a live context.
bool id_of(const Driver& d, State& s, CUcontext ctx, unsigned long long* id) {
  *id = 0;
  if (ids(d, s)) return get_id(d, s, ctx, id) == CUDA_SUCCESS || !ids(d, s);
  unsigned version = 0;
  return !d.ctx_get_api_version || d.ctx_get_api_version(ctx, &version) == CUDA_SUCCESS;
}

// st's context died without gpupool seeing it: its record goes, with no
// driver call on its memory (the driver freed it with the context).
void retire_dead(CtxState* st, Runtime& rt) {
  UniqueLock lock(st->teardown_mu);
  if (st->retired.load(std::memory_order_acquire)) return;
  log().debug("cuda: context {} (id {}) ended where gpupool did not see it",
              static_cast<void*>(st->ctx), st->id);
  retire_locked(st, rt);
}

CtxState* create_state(const Driver& d, Runtime& rt, State& s, CUcontext ctx, unsigned long long id)
    GPUPOOL_REQUIRES(s.contexts_mu) {
  CUdevice dev = 0;
  // Fails for a destroyed context: the caller passes the call through and
  // the driver reports it.
  if (!d.ctx_get_device || d.ctx_get_device(&dev) != CUDA_SUCCESS) return nullptr;
  std::size_t total = 0;
  if (!d.device_total_mem || d.device_total_mem(&total, dev) != CUDA_SUCCESS || total == 0)
    return nullptr;
  // The GPU's name across processes: for the node's neighbours, and in the
  // stats (nvidia-smi's form).
  CUuuid u{};
  const bool has_uuid = (d.device_get_uuid_v2 && d.device_get_uuid_v2(&u, dev) == CUDA_SUCCESS) ||
                        (d.device_get_uuid && d.device_get_uuid(&u, dev) == CUDA_SUCCESS);
  wire::DeviceKey uuid{};
  if (has_uuid) std::memcpy(uuid.data(), u.bytes, uuid.size());
  auto* st = new CtxState;
  st->state = &s;
  st->ctx = ctx;
  st->id = id;
  st->ordinal = ++s.ordinals;
  st->dev = dev;
  st->device_total = total;
  st->device = has_uuid ? wire::key_text(uuid) : device_group(dev);
  st->primary = dev >= 0 && dev < kPrimaries && g_primary[dev].load() == ctx;
  ArenaOptions o;
  o.name = fmt::format("cuda dev {} ctx {}", int(dev), st->ordinal);
  o.group = device_group(dev);
  o.kind = "cuda";
  o.device = st->device;
  o.max_block = total;
  o.max_pooled = rt.config.max_pooled.resolve(total);
  o.max_held = rt.config.max_held.resolve(total);
  o.pending_growth = rt.config.pending_growth.resolve(total);
  o.split_min = config::split_min(rt.config);
  // Device memory maps granules (memory.cpp); pinned memory splits driver
  // allocations (its backend maps none).
  o.expandable = rt.config.segments == config::Segments::expandable;
  // Ordering needs context events and stream waits (CUDA 12.5 on).
  st->ordered = rt.config.reuse == config::Reuse::ordered && d.ctx_record_event && d.event_create &&
                d.event_query && d.event_synchronize && d.stream_wait_event && d.ctx_get_current;
  if (rt.config.reuse == config::Reuse::ordered && !st->ordered)
    log().info(
        "cuda: GPUPOOL_REUSE=ordered needs cuCtxRecordEvent and cuStreamWaitEvent (CUDA 12.5 "
        "on), which this driver lacks: freed blocks wait on the host (as GPUPOOL_REUSE=safe)");
  const bool fenced = config::reuse_waits(rt.config.reuse);
  const bool solo = rt.config.reuse == config::Reuse::safe || st->ordered;
  const std::string group = o.group;
  // Marks where a wait is for one fence (a range's piece) or is replaced
  // by the device's order (order_fence).
  st->device_arena = rt.pool.add_arena(
      device_backend(st, fenced, solo, o.expandable || st->ordered), std::move(o));
  if (has_uuid) node::add_device(rt, uuid, group, total);
  s.all.push_back(st);
  s.live.push_back(st);
  log().debug("cuda: context {} on device {} ({} bytes): pooling", static_cast<void*>(ctx),
              int(dev), total);
  return st;
}

}  // namespace

std::string device_group(CUdevice dev) { return "cuda:" + std::to_string(int(dev)); }

// ---- fences ---------------------------------------------------------------

void epoch_completed(CtxState* st, std::uint64_t s) {
  std::uint64_t cur = st->epoch_done.load(std::memory_order_relaxed);
  while (cur < s && !st->epoch_done.compare_exchange_weak(cur, s, std::memory_order_release,
                                                          std::memory_order_relaxed)) {
  }
}

namespace {
void drop_marks_through(CtxState* st, std::uint64_t s);  // the marks, below
std::uint64_t steady_ns();

// A waiter spins this long before it sleeps: a fence synchronization of an
// idle context takes about a microsecond, waking from a sleep several.
constexpr std::uint64_t kSpinNs = 10'000;

// While a fence synchronization runs that may cover epoch `need`, up to
// kSpinNs: the caller then takes st->sync_mu, and sleeps only if it still
// runs (await_turn).
void spin_for_turn(const CtxState* st, std::uint64_t need) {
  if (st->epoch_done.load(std::memory_order_acquire) >= need) return;
  for (const std::uint64_t until = steady_ns() + kSpinNs;
       st->syncing.load(std::memory_order_acquire) &&
       st->epoch_done.load(std::memory_order_acquire) < need;) {
    for (int i = 0; i < 16; ++i) cpu_relax();
    if (steady_ns() > until) return;
  }
}

// Under st->sync_mu: until epoch `need` is done (true) or no fence
// synchronization runs (false: the caller's turn, the lock held).
bool await_turn(CtxState* st, UniqueLock<Ranked<LockRank::cuda_sync>>& lock, std::uint64_t need) {
  for (;;) {
    if (st->epoch_done.load(std::memory_order_acquire) >= need) return true;
    if (!st->syncing.load(std::memory_order_acquire)) return false;
    st->sync_cv.wait(lock);
  }
}

// Marks the end of a fence synchronization, however it ends (a log line
// that cannot allocate throws): the next thread may run one, and the
// waiting ones look again.
struct SyncTurn {
  CtxState* st;
  ~SyncTurn() {
    {
      LockGuard lock(st->sync_mu);
      st->syncing.store(false, std::memory_order_release);
    }
    st->sync_cv.notify_all();
  }
};
}  // namespace

void synchronize_context(CtxState* st) {
  synchronize_context(st, st->epoch_next.load(std::memory_order_seq_cst));
}

void synchronize_context(CtxState* st, std::uint64_t need) {
  const Driver* d = driver();
  if (!d || !d->ctx_get_current || st->retired.load(std::memory_order_acquire)) return;
  // A synchronization that completes an epoch >= need covers every fence
  // up to it, whoever ran it.
  spin_for_turn(st, need);
  {
    UniqueLock lock(st->sync_mu);
    if (await_turn(st, lock, need)) return;
    st->syncing.store(true, std::memory_order_relaxed);
  }
  const SyncTurn turn{st};
  const std::uint64_t s = st->epoch_next.fetch_add(1, std::memory_order_seq_cst);
  CUcontext cur = nullptr;
  d->ctx_get_current(&cur);
  CUresult r = CUDA_ERROR_INVALID_CONTEXT;
  if (cur == st->ctx && d->ctx_synchronize) {
    r = d->ctx_synchronize();
  } else if (d->ctx_synchronize_v2) {
    r = d->ctx_synchronize_v2(st->ctx);
  } else if (d->ctx_push && d->ctx_pop && d->ctx_synchronize &&
             d->ctx_push(st->ctx) == CUDA_SUCCESS) {
    r = d->ctx_synchronize();
    CUcontext popped = nullptr;
    d->ctx_pop(&popped);
  }
  // On failure (a sticky error, a context being torn down) the blocks stay
  // pending and the pool allocates fresh memory instead.
  if (r == CUDA_SUCCESS) {
    epoch_completed(st, s);
    drop_marks_through(st, s);  // done too: their slots are free again
  } else {
    log().debug("cuda: fence synchronize of context {} failed: {}", static_cast<void*>(st->ctx),
                int(r));
  }
}

// ---- marks -------------------------------------------------------------------

namespace {

std::uint64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The oldest mark of an epoch at or after `epoch` (it covers the work queued
// before that epoch), its epoch in *at; nullptr when none yet.
CUevent mark_covering(const CtxState::Marks& m, std::uint64_t epoch, std::uint64_t* at) {
  for (unsigned i = 0; i < m.count; ++i) {
    const unsigned k = (m.first + i) % CtxState::Marks::kMax;
    if (m.epochs[k] >= epoch) {
      *at = m.epochs[k];
      return m.events[k];
    }
  }
  return nullptr;
}

void drop_oldest_mark(CtxState::Marks& m) {
  m.first = (m.first + 1) % CtxState::Marks::kMax;
  --m.count;
}

// The marks of epochs up to `s` out of the ring: a synchronization that
// completed epoch `s` finished their work too.
void drop_marks_through(CtxState* st, std::uint64_t s) {
  LockGuard lock(st->sync_mu);
  if (CtxState::Marks* m = st->marks.get())
    while (m->count && m->epochs[m->first] <= s) drop_oldest_mark(*m);
}

// The oldest marks the driver says are done (at most `most` asked), their
// epochs completed.
void reap_marks(const Driver& d, CtxState* st, CtxState::Marks& m, unsigned most) {
  for (unsigned i = 0; i < most && m.count; ++i) {
    if (d.event_query(m.events[m.first]) != CUDA_SUCCESS) return;
    epoch_completed(st, m.epochs[m.first]);
    drop_oldest_mark(m);
  }
}

void marks_end(CtxState* st, const char* why, int error) GPUPOOL_REQUIRES(st->sync_mu) {
  st->marks_off = true;
  st->marks_failed.store(true, std::memory_order_release);
  log().debug("cuda: context {}: {} ({}); fences synchronize the context",
              static_cast<void*>(st->ctx), why, error);
}

// A mark recorded now, if nothing stands in the way: not while a stream
// captures (the driver would refuse it and end the capture), nor while
// another thread holds the context's sync state, nor, for a slot whose
// event is still to be made, while the context is not current here.
void record_mark(CtxState* st) {
  const Driver* d = driver();
  if (!d || !d->ctx_record_event || !d->event_create || !d->event_query || !d->event_synchronize ||
      exiting())
    return;
  if (!capture_lock().try_lock_shared()) return;
  SharedLock capture(capture_lock(), std::adopt_lock);
  if (stream_capturing() || !st->sync_mu.try_lock()) return;
  LockGuard lock(st->sync_mu, std::adopt_lock);
  // (retire_locked drops the marks under this lock, after setting the flag)
  if (st->marks_off || st->retired.load(std::memory_order_acquire)) return;
  // A context that ended unseen took its events with it, and their handles
  // may be the program's events now (cuCtxGetId: tens of nanoseconds).
  if (!context_alive(*d, st)) return;
  if (!st->marks) {
    try {
      st->marks = std::make_unique<CtxState::Marks>();
    } catch (...) {
      return;  // no memory: a later free tries again
    }
  }
  CtxState::Marks& m = *st->marks;
  reap_marks(*d, st, m, 2);
  // A full ring (the device far behind) records its newest mark again:
  // it then covers the frees since as well (a waiter for its old epoch
  // waits for more work, not less), and older fences keep their marks.
  const bool again = m.count == CtxState::Marks::kMax;
  const unsigned k = (m.first + m.count - again) % CtxState::Marks::kMax;
  if (!m.events[k]) {
    CUcontext cur = nullptr;
    if (!d->ctx_get_current || d->ctx_get_current(&cur) != CUDA_SUCCESS || cur != st->ctx) return;
    if (const CUresult r = d->event_create(&m.events[k], CU_EVENT_DISABLE_TIMING);
        r != CUDA_SUCCESS)
      return marks_end(st, "no event for a mark", int(r));
  }
  const std::uint64_t s = st->epoch_next.fetch_add(1, std::memory_order_seq_cst);
  if (const CUresult r = d->ctx_record_event(st->ctx, m.events[k]); r != CUDA_SUCCESS)
    return marks_end(st, "cuCtxRecordEvent failed", int(r));
  m.epochs[k] = s;
  if (!again) ++m.count;
}

}  // namespace

namespace {
// Ordering on the device (order_fence, GPUPOOL_REUSE=ordered) has not been
// ended (end_device_order).
std::atomic<bool> g_device_order{true};

bool ordering(const Runtime* rt) { return rt && rt->config.reuse == config::Reuse::ordered; }
}  // namespace

std::uint64_t fence_at_free(CtxState* st) {
  const std::uint64_t fence = st->epoch_next.load(std::memory_order_seq_cst);
  const std::uint64_t now = steady_ns();
  std::uint64_t last = st->last_mark_ns.load(std::memory_order_relaxed);
  // While ordering on the device, every free: a piece's own mark lets it be
  // ordered after (a mark recorded later could cover work that waits for
  // work the program queues after the ordering, order_fence).
  if (st->ordered && g_device_order.load(std::memory_order_relaxed)) {
    st->last_mark_ns.store(now, std::memory_order_relaxed);
    record_mark(st);
  } else if (now - last >= kMarkGapNs &&
             st->last_mark_ns.compare_exchange_strong(last, now, std::memory_order_relaxed))
    record_mark(st);
  return fence;
}

void wait_fence(CtxState* st, std::uint64_t fence) {
  if (fence == 0 || st->epoch_done.load(std::memory_order_acquire) >= fence) return;
  const Driver* d = driver();
  if (!d || st->retired.load(std::memory_order_acquire)) return;
  CUevent ev = nullptr;
  std::uint64_t s = 0;
  spin_for_turn(st, fence);
  {
    UniqueLock lock(st->sync_mu);
    if (await_turn(st, lock, fence)) return;
    if (const CtxState::Marks* m = st->marks.get()) ev = mark_covering(*m, fence, &s);
    if (ev) st->syncing.store(true, std::memory_order_relaxed);
  }
  // No mark after the fence yet: the context's synchronization covers it.
  if (!ev) return synchronize_context(st, fence);
  CUresult r = CUDA_ERROR_UNKNOWN;
  {
    // The marks up to this one are done with it.
    const SyncTurn turn{st};
    r = d->event_synchronize(ev);
    if (r == CUDA_SUCCESS) {
      epoch_completed(st, s);
      drop_marks_through(st, s);
    }
  }
  if (r != CUDA_SUCCESS) synchronize_context(st, fence);
}

// ---- ordering on the device --------------------------------------------------

namespace {
// The host waits for st's context to pass what its streams were made to
// wait for: the oldest mark covering it, not the whole context's work.
void wait_ordered(CtxState* st) {
  const std::uint64_t ordered = st->epoch_ordered.load(std::memory_order_acquire);
  if (ordered > st->epoch_done.load(std::memory_order_acquire)) wait_fence(st, ordered);
}
}  // namespace

void wait_device_ordered() {
  Runtime* rt = runtime();
  if (!ordering(rt) || !rt->cuda) return;
  // Records are never freed: the list may be walked without the registry's
  // lock, which no device wait should hold.
  std::vector<CtxState*> all;
  {
    LockGuard l(state(*rt).contexts_mu);
    try {
      all = state(*rt).all;
    } catch (...) {
      // No memory for the copy: wait under the lock instead.
      for (CtxState* st : state(*rt).all) wait_ordered(st);
      return;
    }
  }
  for (CtxState* st : all)
    if (!st->retired.load(std::memory_order_acquire)) wait_ordered(st);
}

void end_device_order(const char* why) {
  Runtime* rt = runtime();
  if (!ordering(rt)) return;
  // The solo rule's lock, for the same reasons: a second caller returns
  // only once the first one's waits are done, and fork's handlers take it.
  LockGuard serial(solo_mu());
  if (!g_device_order.load(std::memory_order_acquire)) return;
  // Off under every context's sync_mu, where order_fence looks at the flag
  // again: no ordering completes after the waits below have read its epoch.
  if (rt->cuda) {
    LockGuard l(state(*rt).contexts_mu);
    for (CtxState* st : state(*rt).all) {
      LockGuard lock(st->sync_mu);
      g_device_order.store(false, std::memory_order_release);
    }
  }
  g_device_order.store(false, std::memory_order_release);
  log().debug("cuda: pending pieces are waited for on the host from now on ({})", why);
  // Pieces handed out on the device's order may be touched by the streams
  // to come: their old work is waited for here, before those exist.
  wait_device_ordered();
}

bool device_ordering(const CtxState* st) {
  return st->ordered && !st->marks_failed.load(std::memory_order_acquire) &&
         g_device_order.load(std::memory_order_acquire);
}

bool order_fence(CtxState* st, std::uint64_t fence) {
  if (fence == 0 || st->epoch_ordered.load(std::memory_order_acquire) >= fence) return true;
  if (!st->ordered || !g_device_order.load(std::memory_order_acquire)) return false;
  const Driver* d = driver();
  if (!d || !d->stream_wait_event || !d->ctx_get_current || exiting() ||
      st->retired.load(std::memory_order_acquire))
    return false;
  // The legacy stream is the current context's.
  CUcontext cur = nullptr;
  if (d->ctx_get_current(&cur) != CUDA_SUCCESS || cur != st->ctx) return false;
  // No capture under way: a wait on the legacy stream would end one.
  if (!capture_lock().try_lock_shared()) return false;
  SharedLock capture(capture_lock(), std::adopt_lock);
  if (stream_capturing()) return false;
  // sync_mu: the stream set (a destroy takes the stream out under it first)
  // and the marks (not recorded again meanwhile).
  LockGuard lock(st->sync_mu);
  if (!g_device_order.load(std::memory_order_acquire)) return false;
  if (st->epoch_ordered.load(std::memory_order_relaxed) >= fence) return true;
  const CtxState::Marks* m = st->marks.get();
  if (st->marks_off || !m) return false;
  std::uint64_t s = 0;
  const CUevent ev = mark_covering(*m, fence, &s);
  if (!ev) return false;  // no mark from a free after it yet
  if (d->stream_wait_event(CU_STREAM_LEGACY, ev, 0) != CUDA_SUCCESS) return false;
  for (std::size_t i = 0; i < st->nonblocking.size();) {
    const CUresult r = d->stream_wait_event(st->nonblocking[i], ev, 0);
    if (r == CUDA_SUCCESS) {
      ++i;
    } else if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
      // Gone unseen (its context destroyed with it): nothing runs there.
      st->nonblocking.erase(st->nonblocking.begin() + std::ptrdiff_t(i));
    } else {
      return false;
    }
  }
  st->epoch_ordered.store(s, std::memory_order_release);
  return true;
}

void stream_made(CtxState* st, CUstream s, unsigned flags) {
  if (!(flags & CU_STREAM_NON_BLOCKING) || !st || !st->ordered) return;
  const Driver* d = driver();
  const char* failed = nullptr;
  {
    LockGuard lock(st->sync_mu);
    try {
      st->nonblocking.push_back(s);
    } catch (...) {
      failed = "no memory to remember a stream";
    }
    // Work the new stream runs must not overtake what the others were made
    // to wait for: the oldest mark at or after it covers that.
    const std::uint64_t ordered = st->epoch_ordered.load(std::memory_order_relaxed);
    if (!failed && ordered > st->epoch_done.load(std::memory_order_acquire) && st->marks) {
      std::uint64_t at = 0;
      const CUevent ev = mark_covering(*st->marks, ordered, &at);
      if (!ev || !d || !d->stream_wait_event || d->stream_wait_event(s, ev, 0) != CUDA_SUCCESS)
        failed = "a new stream could not be ordered";
    }
  }
  // Outside sync_mu: it waits, and takes the registry's lock.
  if (failed) end_device_order(failed);
}

void stream_noted(const Driver& d, CUstream s, unsigned flags) noexcept {
  if (!(flags & CU_STREAM_NON_BLOCKING)) return;
  Runtime* rt = runtime();
  if (!ordering(rt) || !rt->cuda || !rt->config.cuda) return;
  const char* failed = nullptr;
  try {
    if (CtxState* st = current_state(d, *rt, true)) stream_made(st, s, flags);
    else failed = "a stream in a context without a record";
  } catch (...) {
    failed = "no memory to remember a stream";
  }
  if (failed) end_device_order(failed);
}

bool stream_going(CUstream s) {
  Runtime* rt = runtime_if_started();
  if (!ordering(rt) || !rt->cuda) return false;
  State& reg = state(*rt);
  LockGuard l(reg.contexts_mu);
  bool known = false;
  for (CtxState* st : reg.all) {
    LockGuard lock(st->sync_mu);
    known |= std::erase(st->nonblocking, s) != 0;
  }
  return known;
}

void stream_kept(CUresult r) {
  // The driver refused to destroy a stream taken out of the sets: the
  // program may use it still, unordered from now on; not where the answer
  // says it is gone, nor at exit.
  if (r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_CONTEXT_IS_DESTROYED ||
      r == CUDA_ERROR_DEINITIALIZED || exiting())
    return;
  end_device_order("a stream's destroy failed");
}

// ---- the solo rule -----------------------------------------------------------

namespace detail {
std::atomic<bool> g_solo{true};
std::atomic<const void*> g_solo_thread{nullptr};
GPUPOOL_HOT_TLS char t_solo_self;
}  // namespace detail

void end_solo(const char* why) {
  LockGuard lock(solo_mu());
  if (!detail::g_solo.load(std::memory_order_relaxed)) return;
  detail::g_solo.store(false, std::memory_order_seq_cst);
  // Only safe and ordered reuse free blocks without a fence under the rule.
  Runtime* rt = runtime_if_started();
  if (!rt || (rt->config.reuse != config::Reuse::safe && !ordering(rt))) return;
  log().debug("cuda: freed blocks wait for the device from now on ({})", why);
  State& s = state(*rt);
  std::vector<CtxState*> live;
  {
    LockGuard l(s.contexts_mu);
    live = s.live;
  }
  for (CtxState* st : live) synchronize_context(st);
}

void solo_note_symbol(const char* name, unsigned long long flags) {
  if (!detail::g_solo.load(std::memory_order_relaxed)) return;
  const std::string_view n = name ? name : "";
  if ((flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) || n.ends_with("_ptsz") ||
      n.ends_with("_ptds"))
    end_solo("a per-thread default stream entry point");
}

namespace {

// A thread's first look for its context: the first such thread is the one
// the rule allows; any other ends it.
void solo_note_thread() {
  if (!detail::g_solo.load(std::memory_order_relaxed)) return;
  const void* expected = nullptr;
  const void* self = &detail::t_solo_self;
  if (!detail::g_solo_thread.compare_exchange_strong(expected, self) && expected != self)
    end_solo("a second thread allocates device memory");
}

}  // namespace

// ---- contexts -------------------------------------------------------------

namespace {

// current_state's miss: the record of (ctx, id), made if `create`. A live
// record with the handle and another id is of a context that died unseen:
// it is retired first. So, before the first record of a context is made,
// is any other that died unseen (its memory may be the new one's now).
CtxState* lookup(const Driver& d, Runtime& rt, CUcontext ctx, unsigned long long id, bool create) {
  solo_note_thread();
  State& s = state(rt);
  for (bool swept = false;;) {
    CtxState* stale = nullptr;
    CtxState* made = nullptr;
    {
      LockGuard lock(s.contexts_mu);
      const std::uint64_t gen = s.generation.load(std::memory_order_acquire);
      CtxState* st = find_live_locked(s, ctx);
      if (st && same_context(st, id)) {
        t_cache = {ctx, id, gen, st};
        return st;
      }
      if (!st && !create) return nullptr;
      if (!st && swept) {
        made = create_state(d, rt, s, ctx, id);
        if (!made) return nullptr;
        t_cache = {ctx, id, gen, made};
        if (s.live.size() == 1) return made;
      }
      stale = st;
    }
    if (made) {
      // Outside the lock: the wait may push the other context.
      end_solo("a second context");
      return made;
    }
    if (stale) {
      retire_dead(stale, rt);
    } else {
      retire_dead_contexts(d, rt);
      swept = true;
    }
  }
}

}  // namespace

CtxState* current_state(const Driver& d, Runtime& rt, bool create) {
  State& s = state(rt);
  const std::uint64_t gen = s.generation.load(std::memory_order_acquire);
  unsigned long long id = 0;
  const bool by_id = ids(d, s);
  if (by_id) {
    // The current context by its identity: 201 without one, 709 for a
    // destroyed one (the caller passes the call on for the driver's answer).
    // Costs the same one driver call as cuCtxGetCurrent, about 8 ns more.
    if (const CUresult r = d.ctx_get_id(nullptr, &id); r != CUDA_SUCCESS) {
      if (r != CUDA_ERROR_NOT_SUPPORTED) return nullptr;
      turn_off_ids(s);
      return current_state(d, rt, create);  // by handle from now on
    }
    if (t_cache.id == id && t_cache.generation == gen) return t_cache.st;
  }
  CUcontext ctx = nullptr;
  if (!d.ctx_get_current || d.ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx) return nullptr;
  if (by_id) {
    // The handle must be of the context the id is: another thread may have
    // ended that one and made a new one at the handle in between. Then the
    // call goes to the driver as it is.
    unsigned long long again = 0;
    if (d.ctx_get_id(ctx, &again) != CUDA_SUCCESS || again != id) return nullptr;
  } else if (t_cache.ctx == ctx && t_cache.generation == gen) {
    return t_cache.st;
  }
  return lookup(d, rt, ctx, id, create);
}

bool context_alive(const Driver& d, const CtxState* st) {
  unsigned long long id = 0;
  return id_of(d, *st->state, st->ctx, &id) && same_context(st, id);
}

void retire_dead_contexts(const Driver& d, Runtime& rt) {
  State& s = state(rt);
  std::vector<CtxState*> live;
  {
    LockGuard lock(s.contexts_mu);
    live = s.live;
  }
  // The driver is asked outside our locks.
  for (CtxState* st : live)
    if (!context_alive(d, st)) retire_dead(st, rt);
}

CUresult pitch_for(const Driver& d, CtxState* st, std::size_t width, unsigned element,
                   std::size_t* pitch) {
  LockGuard lock(st->pitch_mu);
  for (const CtxState::Pitch& p : st->pitches)
    if (p.width == width && p.element == element) return *pitch = p.pitch, CUDA_SUCCESS;
  if (!d.mem_free) return CUDA_ERROR_NOT_SUPPORTED;
  CUdeviceptr row = 0;
  std::size_t learnt = 0;
  const CUresult r = d.mem_alloc_pitch(&row, &learnt, width, 1, element);
  if (r != CUDA_SUCCESS) return r;
  d.mem_free(row);
  st->pitches.push_back({width, element, learnt});  // may throw: nothing to undo
  *pitch = learnt;
  return CUDA_SUCCESS;
}

Arena* host_arena(CtxState* st, Runtime& rt, unsigned flags) {
  const unsigned key = (flags | CU_MEMHOSTALLOC_DEVICEMAP) & 7u;
  if (Arena* a = st->host_arenas[key].load(std::memory_order_acquire)) return a;
  LockGuard lock(state(rt).contexts_mu);
  if (Arena* a = st->host_arenas[key].load(std::memory_order_acquire)) return a;
  if (st->retired.load(std::memory_order_acquire)) return nullptr;
  static const std::size_t host_total = host_memory_bytes();
  ArenaOptions o;
  o.name = fmt::format("cuda-host flags {:#x} ctx {}", key, st->ordinal);
  o.group = "cuda-host";
  o.kind = "cuda-host";
  o.device = wire::key_text(wire::kHostMemory);
  o.max_block = host_total;
  o.max_pooled = rt.config.max_pooled.resolve(host_total);
  o.max_held = rt.config.max_held.resolve(host_total);
  // A fresh pinned block costs 0.65 ms to 190 ms (H100 host, 256 B to
  // 256 MiB), so after its first growth a bin grows again only after
  // hundreds of idle-device waits (pool.cpp); the budget is host memory's.
  o.pending_growth = rt.config.pending_growth.resolve(host_total);
  const bool fenced = config::reuse_waits(rt.config.reuse);
  Arena* a = rt.pool.add_arena(host_backend(st, fenced, key), std::move(o));
  st->host_arenas[key].store(a, std::memory_order_release);
  // Pinned memory is the node's host memory: other gpupool processes may
  // ask for it as for a GPU's.
  node::add_device(rt, wire::kHostMemory, "cuda-host", host_total);
  return a;
}

namespace {
bool same_prop(const CUmemAllocationProp& a, const CUmemAllocationProp& b) {
  return a.type == b.type && a.requestedHandleTypes == b.requestedHandleTypes &&
         a.location.type == b.location.type && a.location.id == b.location.id &&
         a.win32HandleMetaData == b.win32HandleMetaData &&
         a.allocFlags.compressionType == b.allocFlags.compressionType &&
         a.allocFlags.gpuDirectRDMACapable == b.allocFlags.gpuDirectRDMACapable &&
         a.allocFlags.usage == b.allocFlags.usage;
}
}  // namespace

Arena* vmm_arena(CtxState* st, Runtime& rt, const CUmemAllocationProp& prop) {
  auto find = [&]() -> Arena* {
    for (std::size_t i = 0; i < CtxState::kVmmProps; ++i) {
      Arena* a = st->vmm_arenas[i].load(std::memory_order_acquire);
      if (a && same_prop(st->vmm_props[i], prop)) return a;
    }
    return nullptr;
  };
  if (Arena* a = find()) return a;
  LockGuard lock(state(rt).contexts_mu);
  if (Arena* a = find()) return a;
  if (st->retired.load(std::memory_order_acquire)) return nullptr;
  std::size_t slot = 0;
  while (slot < CtxState::kVmmProps && st->vmm_arenas[slot].load(std::memory_order_acquire)) ++slot;
  if (slot == CtxState::kVmmProps) return nullptr;
  ArenaOptions o;
  o.name = fmt::format("cuda-vmm dev {} ctx {}{}", int(st->dev), st->ordinal,
                       slot ? fmt::format(" props {}", slot + 1) : std::string());
  o.group = device_group(st->dev);
  o.kind = "cuda-vmm";
  o.device = st->device;
  o.max_block = st->device_total;
  o.max_pooled = rt.config.max_pooled.resolve(st->device_total);
  o.max_held = rt.config.max_held.resolve(st->device_total);
  o.pending_growth = rt.config.pending_growth.resolve(st->device_total);
  // No splitting: a unit is one handle, mapped whole.
  const bool fenced = config::reuse_waits(rt.config.reuse);
  st->vmm_props[slot] = prop;
  Arena* a = rt.pool.add_arena(vmm::backend(st, prop, fenced), std::move(o));
  st->vmm_arenas[slot].store(a, std::memory_order_release);
  return a;
}

void note_primary(CUcontext ctx, CUdevice dev) noexcept {
  // A device past the table: its release is passed on untouched.
  if (dev >= 0 && dev < kPrimaries) g_primary[dev].store(ctx);
  // A record made before this (a record made after reads the table, under
  // the registry's lock: one of the two sees the other).
  Runtime* rt = runtime_if_started();
  if (!rt) return;
  State& s = state(*rt);
  LockGuard lock(s.contexts_mu);
  if (CtxState* st = find_live_locked(s, ctx)) st->primary = true;
}

CtxState* primary_state(const Driver& d, Runtime& rt, CUdevice dev) {
  State& s = state(rt);
  for (;;) {
    CtxState* st = nullptr;
    {
      LockGuard lock(s.contexts_mu);
      for (CtxState* c : s.live)
        if (c->primary && c->dev == dev) st = c;
    }
    if (!st || context_alive(d, st)) return st;
    retire_dead(st, rt);  // reset or released where gpupool did not see it
  }
}

CtxState* find_state(const Driver& d, Runtime& rt, CUcontext ctx) {
  State& s = state(rt);
  unsigned long long id = 0;
  const bool named = id_of(d, s, ctx, &id);
  for (;;) {
    CtxState* stale = nullptr;
    {
      LockGuard lock(s.contexts_mu);
      CtxState* st = find_live_locked(s, ctx);
      if (!st || (named && same_context(st, id))) return st;
      stale = st;
    }
    retire_dead(stale, rt);
    if (!named) return nullptr;
  }
}

void retire_locked(CtxState* st, Runtime& rt, bool keep_stats) {
  if (st->retired.exchange(true, std::memory_order_acq_rel)) return;
  {
    State& s = state(rt);
    LockGuard lock(s.contexts_mu);
    std::erase(s.live, st);
    s.generation.fetch_add(1, std::memory_order_acq_rel);
  }
  // The pool destroys the arenas once their active blocks are forgotten
  // (below): nothing may use them after this.
  Arena* device = st->device_arena.exchange(nullptr, std::memory_order_acq_rel);
  constexpr std::size_t kHostArenas = std::extent_v<decltype(st->host_arenas)>;
  Arena* host[kHostArenas] = {};
  for (std::size_t i = 0; i < kHostArenas; ++i)
    host[i] = st->host_arenas[i].exchange(nullptr, std::memory_order_acq_rel);
  rt.pool.retire_arena(device, keep_stats);
  for (Arena* a : host)
    if (a) rt.pool.retire_arena(a, keep_stats);
  // Virtual memory outlives its context: the program's units become its
  // own driver allocations, held ones go back to the driver (vmm.hpp).
  vmm::retire_context(st, rt.pool);
  for (auto& slot : st->vmm_arenas)
    if (Arena* a = slot.exchange(nullptr, std::memory_order_acq_rel))
      rt.pool.retire_arena(a, keep_stats);
  // Blocks the program still owns: the driver freed them; a later free of
  // one is not ours any more and goes to the driver, which reports it.
  device_map(rt).erase_context(st, rt.pool);
  host_map(rt).erase_context(st, rt.pool);
  {
    // Its events went with it.
    LockGuard lock(st->sync_mu);
    st->marks.reset();
  }
  log().debug("cuda: context {} torn down: its blocks were dropped from the pool",
              static_cast<void*>(st->ctx));
}

// Every arena of the device's group: its contexts' and its memory pools'.
std::size_t held_device_bytes(CUdevice dev) {
  Runtime* rt = runtime_if_started();
  return rt ? rt->pool.group_releasable(device_group(dev)) : 0;
}

// ---- fork -----------------------------------------------------------------

namespace {

// A wait that gives up (core/fork_wait.hpp) ends it: what it took is in
// the fork's journal, with the list of teardown locks taken. A fork while
// the runtime is being made (its handlers are registered before it is
// published) finds no state: the locks of what is kept outside it alone
// (the solo rule's, the stream-ordered registry's and the captures', which
// hooks take whether a runtime exists or not), and State::fork_held says
// so to parent() and child().
void prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  // Rank order (core/lock_rank.hpp). A state created between the snapshot
  // and the registry lock is locked in the next round.
  if (!fork_wait::take(solo_mu())) return;
  State* room = runtime_if_started() ? runtime_if_started()->cuda : nullptr;
  if (!room) {
    (void)async_fork_prepare(nullptr);
    return;
  }
  State& s = *room;
  s.fork_held = true;
  fork_wait::journal([](void* p) { static_cast<State*>(p)->fork_locked.clear(); }, &s);
  for (;;) {
    std::vector<CtxState*> all;
    if (!s.contexts_mu.lock_or_give_up()) return;
    {
      LockGuard lock(s.contexts_mu, std::adopt_lock);
      all = s.all;
    }
    for (std::size_t i = s.fork_locked.size(); i < all.size(); ++i) {
      if (!fork_wait::take(all[i]->teardown_mu)) return;
      s.fork_locked.push_back(all[i]);
    }
    if (!s.contexts_mu.lock_or_give_up()) return;
    if (s.all.size() == s.fork_locked.size()) break;
    s.contexts_mu.unlock();
  }
  fork_wait::journal_lock(s.contexts_mu);
  if (fork_wait::gave_up() || !async_fork_prepare(s.async)) return;
  for (CtxState* st : s.fork_locked)
    if (!fork_wait::take(st->sync_mu)) return;
  if (vmm::fork_prepare()) PtrMap::fork_prepare(s.device_map, s.host_map);
}

// The room's state whose locks prepare took, if it did.
State* fork_held() {
  Runtime* rt = runtime_if_started();
  State* s = rt ? rt->cuda : nullptr;
  return s && std::exchange(s->fork_held, false) ? s : nullptr;
}

void parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* s = fork_held();
  if (s) {
    PtrMap::fork_release(s->device_map, s->host_map);
    vmm::fork_parent();
    for (CtxState* st : s->fork_locked) st->sync_mu.unlock();
  }
  async_fork_parent(s ? s->async : nullptr);
  if (s) {
    s->contexts_mu.unlock();
    for (CtxState* st : s->fork_locked) st->teardown_mu.unlock();
    s->fork_locked.clear();
  }
  solo_mu().unlock();
}

// The child's only thread is the one that forked, which holds every lock.
void child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* s = fork_held();
  if (s) {
    PtrMap::fork_release(s->device_map, s->host_map);
    vmm::fork_child();
    for (CtxState* st : s->fork_locked) {
      // A parent's thread may have been inside synchronize_context: its
      // syncing flag and its wait on sync_cv are not the child's (a
      // condition variable would wait for that waiter to wake).
      st->syncing.store(false, std::memory_order_relaxed);
      new (&st->sync_cv) std::condition_variable_any;
      st->sync_mu.unlock();
    }
  }
  async_fork_child(s ? s->async : nullptr);
  if (s) {
    s->contexts_mu.unlock();
    for (CtxState* st : s->fork_locked) st->teardown_mu.remake_held_in_child();
    s->fork_locked.clear();
  }
  t_cache = {};
  solo_mu().unlock();
}

// The parent's contexts are not the child's: CUDA does not carry a context
// across fork(), and where a driver lets a child use one (the stand-in), the
// memory is the child's copy. Their blocks are dropped without a driver
// call, with their counters; a pointer the child frees that the parent
// allocated goes to the driver, as without gpupool. A context the child
// uses gets a new record, and a pool of its own.
void renew() {
  Runtime* rt = runtime_if_started();
  if (!rt) return;
  State& s = state(*rt);
  std::vector<CtxState*> live;
  {
    LockGuard lock(s.contexts_mu);
    live = s.live;
  }
  for (CtxState* st : live) {
    UniqueLock lock(st->teardown_mu);
    retire_locked(st, *rt, /*keep_stats=*/false);
  }
  async_fork_renew(*rt);
}

// Contexts that ended unseen while the program allocates only in others (or
// not at all): their records go within a second, and with them the held
// bytes that stats, cuMemGetInfo and the neighbours' requests would count.
void check_contexts(Runtime& rt) {
  if (const Driver* d = driver_if_loaded()) retire_dead_contexts(*d, rt);
}

// The room's state, in the runtime before it is published.
void make(Runtime& rt) {
  auto* s = new State;
  s->vmm = vmm::make_registry();
  s->async = make_async_registry();
  s->ipc = ipc::make_registry();
  s->peers = make_peer_access();
  rt.cuda = s;
}

}  // namespace

// The room's part (runtime.hpp: Part::cuda).
constinit const PartHandlers kPart{
    .make = make, .housekeeping = check_contexts, .fork = {prepare, parent, child, renew}};

}  // namespace gpupool::cuda
