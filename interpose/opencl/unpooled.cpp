#include "interpose/opencl/unpooled.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/fork_wait.hpp"
#include "interpose/opencl/buffers.hpp"
#include "observe/trace_reader.hpp"

namespace gpupool::ocl {

// What the implementation made for the program in one context, as an
// arena's counters: every allocation a miss that reached the
// implementation, nothing held.
class UnpooledBackend final : public Backend, public HeldOutside {
 public:
  // The program's calls go to the implementation; the pool never allocates here.
  BackendResult allocate(std::size_t, std::uint64_t) override { return {}; }
  void release(Handle, std::size_t, void*) override {}
  HeldOutside* outside() override { return this; }

  std::size_t held() override { return 0; }
  std::uint64_t last_use_ns() override { return 0; }
  std::size_t give_back() override { return 0; }

  void made(std::size_t size) {
    LockGuard lock(mu_);
    ++made_;
    ++blocks_;
    bytes_ += size;
    peak_blocks_ = std::max(peak_blocks_, blocks_);
    peak_bytes_ = std::max(peak_bytes_, bytes_);
  }
  void released(std::size_t size) {
    LockGuard lock(mu_);
    ++released_;
    --blocks_;
    bytes_ -= size;
  }

  void add_counters(Stats& s) override {
    LockGuard lock(mu_);
    s.active_blocks += blocks_;
    s.active_bytes += bytes_;
    s.managed_bytes += bytes_;
    s.peak_active_blocks += peak_blocks_;
    s.peak_active_bytes += peak_bytes_;
    s.peak_managed_bytes += peak_bytes_;
    s.misses += made_;
    s.backend_allocs += made_;
    s.backend_frees += released_;
  }
  void reset_peaks() override {
    LockGuard lock(mu_);
    peak_blocks_ = blocks_;
    peak_bytes_ = bytes_;
  }

 private:
  Ranked<LockRank::arena_counters> mu_;
  std::uint64_t made_ GPUPOOL_GUARDED_BY(mu_) = 0, released_ GPUPOOL_GUARDED_BY(mu_) = 0;
  std::uint64_t blocks_ GPUPOOL_GUARDED_BY(mu_) = 0, bytes_ GPUPOOL_GUARDED_BY(mu_) = 0;
  std::uint64_t peak_blocks_ GPUPOOL_GUARDED_BY(mu_) = 0, peak_bytes_ GPUPOOL_GUARDED_BY(mu_) = 0;
};

namespace {

// ctx's arena, made at its first buffer.
std::pair<Arena*, UnpooledBackend*> arena_of(Runtime& rt, Ctx& ctx) {
  LockGuard ctx_lock(ctx.mu);
  Unpooled& st = ctx.state.unpooled;
  if (ctx.unpooled) {
    LockGuard lock(st.mu);
    for (const UnpooledArena& a : st.arenas)
      if (a.arena == ctx.unpooled) return {a.arena, a.backend};
  }
  std::call_once(ctx.info_once, [&] { load_info(ctx); });
  ArenaOptions o;
  o.kind = trace::kUnpooledArenaKind;
  o.group = ctx.info_ok ? memory_group(ctx) : "opencl:unknown";
  o.name = fmt::format("opencl ctx {} dev {} (the implementation's: inherited through fork)",
                       ctx.ordinal, ctx.info_ok ? ctx.device_name : "?");
  o.device = wire::key_text(ctx.key);
  auto backend = std::make_unique<UnpooledBackend>();
  UnpooledBackend* b = backend.get();
  Arena* a = rt.pool.add_arena(std::move(backend), std::move(o));
  ctx.unpooled = a;
  LockGuard lock(st.mu);
  st.arenas.push_back({a, b});
  return {a, b};
}

// The record of `a` (under the state's lock).
UnpooledArena* record_of(Unpooled& st, Arena* a) GPUPOOL_REQUIRES(st.mu) {
  for (UnpooledArena& r : st.arenas)
    if (r.arena == a) return &r;
  return nullptr;
}

// Whether `a`'s record is done with (its context finished, none of its
// buffers noted): then it leaves the list, for the caller to retire.
bool done_with(Unpooled& st, Arena* a) GPUPOOL_REQUIRES(st.mu) {
  UnpooledArena* r = record_of(st, a);
  if (!r || !r->context_finished || r->noted != 0) return false;
  *r = st.arenas.back();
  st.arenas.pop_back();
  return true;
}

// The noted buffer `n` at `m` is freed: counted, and its arena retired
// when it is done with. Under the state's lock, so that a fork finds every
// arena either listed or retired (unpooled_fork_renew).
void freed_locked(Unpooled& st, Runtime* rt, cl_mem m, const Noted& n) GPUPOOL_REQUIRES(st.mu) {
  n.backend->released(n.size);
  if (UnpooledArena* r = record_of(st, n.arena)) --r->noted;
  const bool retire = done_with(st, n.arena);
  if (!rt) return;
  rt->pool.note_outside_free(*n.arena, reinterpret_cast<Handle>(m), n.size);
  if (retire) rt->pool.retire_arena(n.arena);
}

}  // namespace

void note_unpooled(Runtime& rt, Ctx& ctx, cl_mem m, std::size_t size) noexcept try {
  const auto [arena, backend] = arena_of(rt, ctx);
  Unpooled& st = ctx.state.unpooled;
  LockGuard lock(st.mu);
  // Retired meanwhile (the program released the context as it made this
  // buffer): not noted.
  UnpooledArena* r = record_of(st, arena);
  if (!r) return;
  if (auto it = st.buffers.find(m); it != st.buffers.end()) {
    // A handle noted before whose release went past gpupool: freed now.
    const Noted old = it->second;
    st.buffers.erase(it);
    freed_locked(st, &rt, m, old);
    r = record_of(st, arena);
    if (!r) return;
  }
  st.buffers.emplace(m, Noted{arena, backend, size, 1});
  ++r->noted;
  st.any.store(true, std::memory_order_release);
  backend->made(size);
  rt.pool.note_outside_allocate(*arena, reinterpret_cast<Handle>(m), size);
} catch (...) {
  // Not noted (no host memory): the buffer is the program's all the same.
}

void unpooled_retained(cl_mem m) noexcept {
  State* room = state();
  if (!room || !room->unpooled.any.load(std::memory_order_acquire)) return;
  Unpooled& st = room->unpooled;
  LockGuard lock(st.mu);
  if (auto it = st.buffers.find(m); it != st.buffers.end()) ++it->second.refs;
}

cl_int release_unpooled(cl_mem m) {
  State* room = state();
  if (!room || !room->unpooled.any.load(std::memory_order_acquire))
    return next().clReleaseMemObject(m);
  {
    Unpooled& st = room->unpooled;
    LockGuard lock(st.mu);
    auto it = st.buffers.find(m);
    if (it != st.buffers.end() && --it->second.refs == 0) {
      const Noted n = it->second;
      st.buffers.erase(it);
      freed_locked(st, runtime_if_started(), m, n);
    }
  }
  return next().clReleaseMemObject(m);
}

bool unpooled_fork_lock(State& st) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  return fork_wait::take(st.unpooled.mu);
}
void unpooled_fork_unlock(State& st) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { st.unpooled.mu.unlock(); }

void unpooled_context_finished(Runtime& rt, Ctx& ctx) {
  Arena* a = nullptr;
  {
    LockGuard ctx_lock(ctx.mu);
    a = std::exchange(ctx.unpooled, nullptr);
  }
  if (!a) return;
  Unpooled& st = ctx.state.unpooled;
  LockGuard lock(st.mu);
  if (UnpooledArena* r = record_of(st, a)) r->context_finished = true;
  if (done_with(st, a)) rt.pool.retire_arena(a);
}

void unpooled_fork_renew(Runtime& rt) {
  Unpooled& st = rt.opencl->unpooled;
  std::vector<UnpooledArena> arenas;
  {
    LockGuard lock(st.mu);
    st.buffers.clear();
    arenas.swap(st.arenas);
  }
  for (const UnpooledArena& a : arenas) rt.pool.retire_arena(a.arena, /*keep_stats=*/false);
}

}  // namespace gpupool::ocl
