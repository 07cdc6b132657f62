// OpenCL buffers from the pool, keeping OpenCL's semantics.
//
// - One arena per (context, flags as given, properties as given): those are
//   what CL_MEM_FLAGS / CL_MEM_PROPERTIES report, so only identical requests
//   share blocks. A COPY_HOST_PTR arena's blocks are created without the flag
//   (the host data is shorter than the rounded block) and written before the
//   buffer is returned.
// - The program's handle is the block's real cl_mem. gpupool keeps one real
//   reference and counts the program's own; at the program's last release
//   (and after its sub-buffers are gone) the block goes back to the pool.
//   Queries that would show the trick (size, flags, properties, reference
//   count) and bounds checks the padding would hide are answered here.
// - Deferred deletion: a freed block carries its context's epoch; it is
//   reusable once every queue of the context is known to have finished the
//   commands enqueued before the free: observed clFinish, or markers enqueued
//   (non-blocking, polled) when the pool needs a pending block. Never a
//   blocking wait: a command held by a user event must not hang allocation.
// - Availability probe: a fresh block is migrated (CONTENT_UNDEFINED) on an
//   internal queue and waited for, so out-of-memory shows at create time,
//   where the pool releases held blocks and retries.
// - Context lifetime: at the program's last clReleaseContext the context's
//   held blocks and internal queue are released, so the context really dies.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "config/log.hpp"
#include "core/pool.hpp"
#include "interpose/opencl/api.hpp"
#include "interpose/runtime.hpp"

namespace gpupool::ocl {

bool loader_gone();  // opencl_entry.cpp: clDeinitLayer ran

namespace {

using Props = std::vector<cl_mem_properties>;

constexpr cl_mem_flags kPoolableFlags =
    CL_MEM_READ_WRITE | CL_MEM_WRITE_ONLY | CL_MEM_READ_ONLY | CL_MEM_ALLOC_HOST_PTR |
    CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_WRITE_ONLY | CL_MEM_HOST_READ_ONLY | CL_MEM_HOST_NO_ACCESS;

bool is_oom(cl_int e) {
  return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES ||
         e == CL_OUT_OF_HOST_MEMORY;
}

// No OpenCL call of our own once exit began or the loader is going away.
bool cl_gone() { return exiting() || loader_gone(); }

struct Ctx;

// One tracked command queue of the program.
struct Queue {
  cl_command_queue q = nullptr;
  Ctx* ctx = nullptr;
  std::shared_ptr<Ctx> owner;
  std::atomic<int> refs{1};
  std::uint64_t finished = 0;  // epoch covered by the last observed clFinish (under ctx->mu)
};

struct Ctx : std::enable_shared_from_this<Ctx> {
  Ctx();
  ~Ctx();
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  cl_context handle = nullptr;
  std::atomic<int> refs{1};  // the program's references
  bool refs_known = true;    // false: seen first at a buffer, creation missed
  std::atomic<bool> closed{false};
  std::atomic<std::int64_t> active{0};  // pooled buffers the program holds

  std::once_flag info_once;
  bool info_ok = false;
  cl_device_id device = nullptr;  // the internal queue's (first) device
  std::string device_name;
  std::size_t max_alloc = 0;      // min CL_DEVICE_MAX_MEM_ALLOC_SIZE over the devices
  std::size_t global_mem = 0;     // min CL_DEVICE_GLOBAL_MEM_SIZE
  bool ocl12 = false;

  std::mutex mu;  // everything below
  cl_command_queue internal = nullptr;
  bool internal_failed = false;
  struct ArenaEntry {
    cl_mem_flags flags;
    bool has_props;
    Props props;
    Arena* arena;
  };
  std::vector<ArenaEntry> arenas;
  std::vector<Queue*> queues;

  // Fences: a block freed at epoch e is reusable once completed >= e.
  std::atomic<std::uint64_t> epoch{1};
  std::atomic<std::uint64_t> completed{0};
  std::vector<cl_event> departed;  // markers on queues the program released
  struct Close {
    std::uint64_t epoch = 0;
    std::vector<cl_event> events;
  };
  bool closing = false;
  Close close;

  // One in-order queue: while the program has had exactly one queue, and it
  // executes in order, any command it enqueues on a reused block runs after
  // every older command on that block, so freed blocks are reusable at once
  // (the common PyOpenCL case; waiting for markers there would only grow the
  // pool while the queue is busy). Sticky off once a second queue appears or
  // the solo queue is released.
  std::atomic<bool> solo{false};
  cl_command_queue solo_q = nullptr;  // under mu
  int queues_ever = 0;                // under mu
  // Highest fence of a block reused by the solo rule: if the queue's work on
  // it may still be pending when solo mode ends, later queues first wait for
  // that work (hazard marker), so they cannot touch the block too early.
  std::atomic<std::uint64_t> solo_lent{0};
  cl_event hazard = nullptr;  // under mu
};

// A pooled buffer (one per block, kept while the pool has the block) or a
// sub-buffer of one.
struct Rec {
  bool sub = false;
  cl_mem mem = nullptr;
  std::shared_ptr<Ctx> ctx;
  Arena* arena = nullptr;
  Block* block = nullptr;      // while the program holds it
  std::size_t requested = 0;
  cl_mem_flags flags = 0;      // as given
  bool has_props = false;
  Props props;                 // as given, with the terminating 0
  std::atomic<int> refs{0};    // the program's references
  std::atomic<int> holds{0};   // refs + live sub-buffers: 0 = back in the pool
  Rec* parent = nullptr;       // sub-buffers
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>> callbacks;  // under cb_mu(this)
};

// Destructor callbacks' locks, a few for all records (so fork() can take
// them all).
constexpr std::size_t kCallbackLocks = 16;
std::mutex g_callback_locks[kCallbackLocks];
std::mutex& cb_mu(const Rec* r) {
  return g_callback_locks[(reinterpret_cast<std::uintptr_t>(r) >> 6) % kCallbackLocks];
}

// Every context record alive, whether the program still has the context or
// not (fork() locks and renews them all). Lock order: ctx_mu(), then
// g_all_ctx_mu, then a context's mu.
std::mutex g_all_ctx_mu;
std::vector<Ctx*>& all_ctx() {
  static auto* v = new std::vector<Ctx*>;  // never destroyed: hooks may run during exit
  return *v;
}
Ctx::Ctx() {
  std::lock_guard lock(g_all_ctx_mu);
  all_ctx().push_back(this);
}
Ctx::~Ctx() {
  std::lock_guard lock(g_all_ctx_mu);
  std::erase(all_ctx(), this);
}

// Handle -> record maps, sharded so unrelated calls do not share a lock.
template <class K, class V>
class Registry {
 public:
  V* find(K k) {
    Shard& s = of(k);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(k);
    return it == s.map.end() ? nullptr : it->second;
  }
  void put(K k, V* v) {
    Shard& s = of(k);
    std::lock_guard lock(s.mu);
    s.map[k] = v;
  }
  V* take(K k) {
    Shard& s = of(k);
    std::lock_guard lock(s.mu);
    auto it = s.map.find(k);
    if (it == s.map.end()) return nullptr;
    V* v = it->second;
    s.map.erase(it);
    return v;
  }
  void lock_all() {
    for (Shard& s : shards_) s.mu.lock();
  }
  void unlock_all() {
    for (Shard& s : shards_) s.mu.unlock();
  }

 private:
  struct Shard {
    std::mutex mu;
    std::unordered_map<K, V*> map;
  };
  static constexpr std::size_t kShards = 16;
  Shard& of(K k) { return shards_[(reinterpret_cast<std::uintptr_t>(k) >> 6) % kShards]; }
  Shard shards_[kShards];
};

// Never destroyed: hooks may run during exit.
Registry<cl_mem, Rec>& mems() {
  static auto* r = new Registry<cl_mem, Rec>;
  return *r;
}
Registry<cl_command_queue, Queue>& queues() {
  static auto* r = new Registry<cl_command_queue, Queue>;
  return *r;
}
std::mutex& ctx_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::unordered_map<cl_context, std::shared_ptr<Ctx>>& ctx_map() {
  static auto* m = new std::unordered_map<cl_context, std::shared_ptr<Ctx>>;
  return *m;
}

Runtime* active_runtime() {
  Runtime* rt = runtime();
  if (!rt || !rt->config.opencl || cl_gone()) return nullptr;
  return rt;
}

std::shared_ptr<Ctx> find_ctx(cl_context c) {
  std::lock_guard lock(ctx_mu());
  auto it = ctx_map().find(c);
  return it == ctx_map().end() ? nullptr : it->second;
}

void register_ctx(cl_context c) {
  auto ctx = std::make_shared<Ctx>();
  ctx->handle = c;
  std::lock_guard lock(ctx_mu());
  ctx_map()[c] = std::move(ctx);
}

// The context of a buffer request; one created before gpupool saw it gets a
// record whose reference count is unknown (its release is then passed on).
std::shared_ptr<Ctx> ctx_for_buffer(cl_context c) {
  if (!c) return nullptr;
  std::lock_guard lock(ctx_mu());
  auto& slot = ctx_map()[c];
  if (!slot) {
    slot = std::make_shared<Ctx>();
    slot->handle = c;
    slot->refs_known = false;
  }
  return slot;
}

std::string device_string(const Api& api, cl_device_id d, cl_device_info what) {
  std::size_t n = 0;
  if (api.clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (api.clGetDeviceInfo(d, what, n, s.data(), nullptr) != CL_SUCCESS) return {};
  s.resize(std::strlen(s.c_str()));
  return s;
}

void load_info(Ctx& ctx) {
  const Api& api = next();
  if (!api.clGetContextInfo || !api.clGetDeviceInfo) return;
  std::size_t n = 0;
  if (api.clGetContextInfo(ctx.handle, CL_CONTEXT_DEVICES, 0, nullptr, &n) != CL_SUCCESS ||
      n < sizeof(cl_device_id))
    return;
  std::vector<cl_device_id> devs(n / sizeof(cl_device_id));
  if (api.clGetContextInfo(ctx.handle, CL_CONTEXT_DEVICES, n, devs.data(), nullptr) != CL_SUCCESS)
    return;
  std::size_t max_alloc = SIZE_MAX, global = SIZE_MAX;
  bool ocl12 = true;
  for (cl_device_id d : devs) {
    cl_ulong v = 0;
    if (api.clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof v, &v, nullptr) != CL_SUCCESS)
      return;
    max_alloc = std::min<std::size_t>(max_alloc, v);
    if (api.clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof v, &v, nullptr) != CL_SUCCESS)
      return;
    global = std::min<std::size_t>(global, v);
    // "OpenCL <major>.<minor> ..."
    std::string ver = device_string(api, d, CL_DEVICE_VERSION);
    int major = 0, minor = 0;
    if (std::sscanf(ver.c_str(), "OpenCL %d.%d", &major, &minor) != 2 ||
        major * 100 + minor < 102)
      ocl12 = false;
  }
  ctx.device = devs[0];
  ctx.device_name = device_string(api, devs[0], CL_DEVICE_NAME);
  ctx.max_alloc = max_alloc;
  ctx.global_mem = global;
  ctx.ocl12 = ocl12 && api.clEnqueueMigrateMemObjects;
  ctx.info_ok = max_alloc > 0;
}

// The context's own queue for probes and COPY_HOST_PTR writes (created on
// first need; it keeps the context alive until the program's last release).
cl_command_queue internal_queue(Ctx& ctx) {
  std::lock_guard lock(ctx.mu);
  if (!ctx.internal && !ctx.internal_failed) {
    cl_int err = CL_SUCCESS;
    const Api& api = next();
    if (api.clCreateCommandQueueWithProperties)
      ctx.internal = api.clCreateCommandQueueWithProperties(ctx.handle, ctx.device, nullptr, &err);
    else if (api.clCreateCommandQueue)
      ctx.internal = api.clCreateCommandQueue(ctx.handle, ctx.device, 0, &err);
    if (!ctx.internal) {
      ctx.internal_failed = true;
      log().warn("OpenCL: cannot create gpupool's queue on context {} (error {}); no probing",
                 fmt::ptr(ctx.handle), err);
    }
  }
  return ctx.internal;
}

// ---------------------------------------------------------------------------
// Fences

bool events_done(const Api& api, std::vector<cl_event>& evs) {
  for (cl_event e : evs) {
    cl_int st = CL_QUEUED;
    if (api.clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr) !=
        CL_SUCCESS)
      st = -1;  // an event we cannot ask about will not tell us more later
    if (st > CL_COMPLETE) return false;  // CL_COMPLETE = 0; errors are negative: done too
  }
  for (cl_event e : evs) api.clReleaseEvent(e);
  evs.clear();
  return true;
}

void raise_completed(Ctx& ctx, std::uint64_t e) {
  std::uint64_t cur = ctx.completed.load();
  while (cur < e && !ctx.completed.compare_exchange_weak(cur, e)) {
  }
}

// Called by the pool when a bin holds only pending blocks. Non-blocking: it
// collects the previous close if its markers completed, else starts one
// (a marker on every queue of the context). The pool allocates fresh
// meanwhile.
void advance(Ctx& ctx) {
  if (cl_gone()) return;
  const Api& api = next();
  if (!api.clEnqueueMarkerWithWaitList || !api.clGetEventInfo) return;
  std::lock_guard lock(ctx.mu);
  if (ctx.closing) {
    if (!events_done(api, ctx.close.events)) return;
    raise_completed(ctx, ctx.close.epoch);
    ctx.closing = false;
    // The pool asked because a block is still pending (freed after that
    // close began): start the next close right away.
  }
  Ctx::Close c;
  c.epoch = ctx.epoch.fetch_add(1);
  c.events = std::move(ctx.departed);
  ctx.departed.clear();
  for (Queue* q : ctx.queues) {
    cl_event ev = nullptr;
    if (api.clEnqueueMarkerWithWaitList(q->q, 0, nullptr, &ev) == CL_SUCCESS && ev) {
      c.events.push_back(ev);
      if (api.clFlush) api.clFlush(q->q);
    }
  }
  if (events_done(api, c.events)) {
    raise_completed(ctx, c.epoch);
    return;
  }
  ctx.close = std::move(c);
  ctx.closing = true;
}

// ---------------------------------------------------------------------------
// The backend of one arena.

class ClBackend final : public Backend {
 public:
  ClBackend(std::shared_ptr<Ctx> ctx, cl_mem_flags flags, bool has_props, Props props,
            const config::Config& cfg)
      : ctx_(std::move(ctx)),
        given_flags_(flags),
        real_flags_(flags & ~CL_MEM_COPY_HOST_PTR),
        has_props_(has_props),
        props_(std::move(props)),
        immediate_(cfg.reuse == config::Reuse::immediate),
        probe_(cfg.probe) {}

  BackendResult allocate(std::size_t bytes) override {
    const Api& api = next();
    cl_int err = CL_SUCCESS;
    cl_mem m = nullptr;
    if (has_props_) {
      if (!api.clCreateBufferWithProperties) return {BackendStatus::error, 0, CL_INVALID_OPERATION};
      m = api.clCreateBufferWithProperties(ctx_->handle, props_.data(), real_flags_, bytes, nullptr,
                                           &err);
    } else {
      m = api.clCreateBuffer(ctx_->handle, real_flags_, bytes, nullptr, &err);
    }
    if (!m) return {is_oom(err) ? BackendStatus::out_of_memory : BackendStatus::error, 0, err};
    if (probe_) {
      cl_int perr = probe(m, bytes);
      if (is_oom(perr)) {
        api.clReleaseMemObject(m);
        return {BackendStatus::out_of_memory, 0, perr};
      }
    }
    auto* rec = new Rec;
    rec->mem = m;
    rec->ctx = ctx_;
    rec->arena = arena;
    rec->flags = given_flags_;
    rec->has_props = has_props_;
    rec->props = props_;
    mems().put(m, rec);
    return {BackendStatus::ok, reinterpret_cast<Handle>(m), 0};
  }

  void release(Handle h, std::size_t) override {
    cl_mem m = reinterpret_cast<cl_mem>(h);
    delete mems().take(m);
    if (!cl_gone()) next().clReleaseMemObject(m);
  }
  void drop(Handle h, std::size_t) override { delete mems().take(reinterpret_cast<cl_mem>(h)); }

  std::uint64_t fence() override {
    return immediate_ ? 0 : ctx_->epoch.load(std::memory_order_seq_cst);
  }
  bool passed(std::uint64_t f) override {
    if (f == 0 || ctx_->completed.load(std::memory_order_acquire) >= f) return true;
    if (!ctx_->solo.load(std::memory_order_relaxed)) return false;
    // Record the loan before confirming solo mode (seq_cst both sides): the
    // thread that ends solo mode then sees it (end_solo()).
    std::uint64_t lent = ctx_->solo_lent.load(std::memory_order_relaxed);
    while (lent < f && !ctx_->solo_lent.compare_exchange_weak(lent, f)) {
    }
    return ctx_->solo.load(std::memory_order_seq_cst);
  }
  void wait_all() override { advance(*ctx_); }

  Arena* arena = nullptr;

 private:
  // Make the allocation real now, so out-of-memory is reported here.
  cl_int probe(cl_mem m, std::size_t bytes) {
    cl_command_queue q = internal_queue(*ctx_);
    if (!q) return CL_SUCCESS;
    const Api& api = next();
    cl_event ev = nullptr;
    cl_int err;
    if (ctx_->ocl12) {
      err = api.clEnqueueMigrateMemObjects(q, 1, &m, CL_MIGRATE_MEM_OBJECT_CONTENT_UNDEFINED, 0,
                                           nullptr, &ev);
    } else {
      // OpenCL 1.1 has no migrate (nor HOST_NO_ACCESS): a blocking write of
      // one byte from static storage.
      static const char zero = 0;
      err = api.clEnqueueWriteBuffer(q, m, CL_TRUE, 0, std::min<std::size_t>(1, bytes), &zero, 0,
                                     nullptr, &ev);
    }
    if (err != CL_SUCCESS) return err;
    if (!ev) return CL_SUCCESS;
    err = api.clWaitForEvents(1, &ev);
    cl_int st = CL_COMPLETE;
    api.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, nullptr);
    api.clReleaseEvent(ev);
    return st < 0 ? st : CL_SUCCESS;
  }

  std::shared_ptr<Ctx> ctx_;
  cl_mem_flags given_flags_, real_flags_;
  bool has_props_;
  Props props_;
  bool immediate_, probe_;
};

Arena* arena_for(Runtime& rt, const std::shared_ptr<Ctx>& ctx, cl_mem_flags flags, bool has_props,
                 const Props& props) {
  std::lock_guard lock(ctx->mu);
  for (auto& a : ctx->arenas)
    if (a.flags == flags && a.has_props == has_props && a.props == props) return a.arena;
  const config::Config& cfg = rt.config;
  auto backend = std::make_unique<ClBackend>(ctx, flags, has_props, props, cfg);
  ClBackend* be = backend.get();
  ArenaOptions o;
  o.kind = "opencl";
  o.group = fmt::format("opencl:{}", fmt::ptr(ctx->handle));
  o.name = fmt::format("opencl ctx {} dev {} flags {:#x}", fmt::ptr(ctx->handle), ctx->device_name,
                       flags);
  if (has_props) {
    o.name += " props";
    for (cl_mem_properties p : props) o.name += fmt::format(" {:#x}", p);
  }
  o.max_block = ctx->max_alloc;
  o.max_pooled = cfg.max_pooled.resolve(ctx->global_mem);
  o.max_held = cfg.max_held.resolve(ctx->global_mem);
  Arena* arena = rt.pool.add_arena(std::move(backend), std::move(o));
  be->arena = arena;
  ctx->arenas.push_back({flags, has_props, props, arena});
  return arena;
}

// Release what the pool holds for a context the program released. Under the
// context's lock: finish_ctx() may retire (and so destroy) its arenas.
void release_closed(Runtime& rt, Ctx& ctx) {
  std::lock_guard lock(ctx.mu);
  for (auto& a : ctx.arenas) rt.pool.release_held(a.arena);
}

// Retire a closed context's arenas once the program holds none of its
// buffers: nothing of it is left to release. The first caller takes them.
void finish_ctx(Runtime& rt, Ctx& ctx) {
  std::vector<Arena*> arenas;
  {
    std::lock_guard lock(ctx.mu);
    for (auto& a : ctx.arenas) arenas.push_back(a.arena);
    ctx.arenas.clear();
  }
  for (Arena* a : arenas) rt.pool.release_held(a);
  for (Arena* a : arenas) rt.pool.retire_arena(a);
  std::vector<cl_event> evs;
  {
    std::lock_guard lock(ctx.mu);
    evs.swap(ctx.departed);
    evs.insert(evs.end(), ctx.close.events.begin(), ctx.close.events.end());
    ctx.close.events.clear();
    ctx.closing = false;
    if (ctx.hazard) evs.push_back(ctx.hazard);
    ctx.hazard = nullptr;
  }
  for (cl_event e : evs) next().clReleaseEvent(e);
}

// The program let go of a pooled buffer for good (no reference, no
// sub-buffer): run its destructor callbacks, then hand the block back.
void buffer_died(Rec* r) {
  std::vector<std::pair<void(CL_CALLBACK*)(cl_mem, void*), void*>> cbs;
  {
    std::lock_guard lock(cb_mu(r));
    cbs.swap(r->callbacks);
  }
  // Reverse order of registration, no gpupool lock held: they may call OpenCL.
  for (auto it = cbs.rbegin(); it != cbs.rend(); ++it) it->first(r->mem, it->second);

  Block* b = r->block;
  r->block = nullptr;
  // The pool may release the block (and its record) inside free(): take
  // what is needed from the record first.
  std::shared_ptr<Ctx> ctx = r->ctx;
  Arena* arena = r->arena;
  Runtime* rt = runtime();
  if (!rt || !b) return;
  (void)arena;
  if (cl_gone() || b->arena->retired()) {
    // During exit: no driver call, the process is going away. A forked
    // parent's buffer (its arena retired in the child): not pooled here;
    // its real object is released as the program's release would have.
    const cl_mem m = r->mem;
    const bool gone = cl_gone();
    ctx->active.fetch_sub(1);
    rt->pool.forget(b);  // drops the record too
    if (!gone) next().clReleaseMemObject(m);
    return;
  }
  rt->pool.free(b);
  const bool last = ctx->active.fetch_sub(1) == 1;
  if (ctx->closed.load()) {
    // The program released the context already: nothing more is held for it.
    release_closed(*rt, *ctx);
    if (last) finish_ctx(*rt, *ctx);
  }
}

void drop_hold(Rec* r) {
  if (r->holds.fetch_sub(1) == 1) buffer_died(r);
}

// ---------------------------------------------------------------------------

void CL_CALLBACK free_host_copy(cl_event, cl_int, void* p) { std::free(p); }

// COPY_HOST_PTR: the host data must be in the buffer's contents when create
// returns (host_ptr may be reused at once). A block whose fence passed is
// idle: a blocking write on gpupool's queue. A block reused by the solo rule
// (or GPUPOOL_REUSE=immediate) may still be read by older commands of the
// program's queue: the write goes on that queue, behind them, from a copy
// of the data, so it neither races them nor blocks on them.
cl_int write_initial(Ctx& ctx, const AllocResult& res, cl_mem m, size_t size, const void* host) {
  const Api& api = next();
  const Block& b = *res.block;
  const bool maybe_busy = res.hit && (b.fence == 0 || ctx.completed.load() < b.fence);
  if (maybe_busy) {
    cl_command_queue q = nullptr;
    {
      std::lock_guard lock(ctx.mu);
      q = ctx.solo_q ? ctx.solo_q : ctx.queues.size() == 1 ? ctx.queues[0]->q : nullptr;
      if (q) api.clRetainCommandQueue(q);
    }
    if (q) {
      cl_int err = CL_OUT_OF_HOST_MEMORY;
      if (void* copy = std::malloc(size)) {
        std::memcpy(copy, host, size);
        cl_event ev = nullptr;
        err = api.clEnqueueWriteBuffer(q, m, CL_FALSE, 0, size, copy, 0, nullptr, &ev);
        if (err == CL_SUCCESS && ev &&
            api.clSetEventCallback && api.clSetEventCallback(ev, CL_COMPLETE, free_host_copy, copy) ==
                CL_SUCCESS) {
          copy = nullptr;
        } else if (err == CL_SUCCESS && ev) {
          api.clWaitForEvents(1, &ev);
        }
        if (ev) api.clReleaseEvent(ev);
        std::free(copy);
        if (api.clFlush) api.clFlush(q);
      }
      api.clReleaseCommandQueue(q);
      return err;
    }
  }
  cl_command_queue q = internal_queue(ctx);
  if (!q) return CL_OUT_OF_RESOURCES;
  return api.clEnqueueWriteBuffer(q, m, CL_TRUE, 0, size, host, 0, nullptr, nullptr);
}

bool parse_props(const cl_mem_properties* p, Props* out) {
  out->clear();
  if (!p) return true;
  for (int i = 0; i < 64; i += 2) {
    out->push_back(p[i]);
    if (p[i] == 0) return true;
    out->push_back(p[i + 1]);
  }
  return false;  // unterminated: let the implementation judge it
}

cl_mem create_buffer(cl_context context, const cl_mem_properties* properties, bool with_props,
                     cl_mem_flags flags, size_t size, void* host_ptr, cl_int* errcode_ret) {
  const Api& api = next();
  auto passthrough = [&]() -> cl_mem {
    if (with_props) {
      if (!api.clCreateBufferWithProperties) {
        if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
        return nullptr;
      }
      return api.clCreateBufferWithProperties(context, properties, flags, size, host_ptr,
                                              errcode_ret);
    }
    return api.clCreateBuffer(context, flags, size, host_ptr, errcode_ret);
  };
  Runtime* rt = active_runtime();
  if (!rt) return passthrough();
  // What the pool cannot serve invisibly, and every error case, goes to the
  // implementation so the program sees its own answer.
  const bool copy = flags & CL_MEM_COPY_HOST_PTR;
  if (size == 0 || (flags & ~kPoolableFlags) || (copy != (host_ptr != nullptr)) ||
      (copy && (flags & (CL_MEM_HOST_NO_ACCESS | CL_MEM_HOST_READ_ONLY))))
    return passthrough();
  Props props;
  if (!parse_props(properties, &props)) return passthrough();
  const bool has_props = with_props && properties;
  std::shared_ptr<Ctx> ctx = ctx_for_buffer(context);
  if (!ctx || ctx->closed.load()) return passthrough();
  std::call_once(ctx->info_once, [&] { load_info(*ctx); });
  if (!ctx->info_ok || size > ctx->max_alloc) return passthrough();

  Arena* arena = arena_for(*rt, ctx, flags, has_props, props);
  AllocResult res = rt->pool.allocate(arena, size);
  if (!res.block) {
    if (errcode_ret) *errcode_ret = res.error ? res.error : CL_MEM_OBJECT_ALLOCATION_FAILURE;
    return nullptr;
  }
  cl_mem m = reinterpret_cast<cl_mem>(res.block->handle);
  Rec* r = mems().find(m);
  if (!r) {  // cannot happen: every block's record lives as long as the block
    rt->pool.forget(res.block);
    return passthrough();
  }
  r->block = res.block;
  r->requested = size;
  ctx->active.fetch_add(1);
  if (copy) {
    cl_int err = write_initial(*ctx, res, m, size, host_ptr);
    if (err != CL_SUCCESS) {
      r->holds.store(1);
      drop_hold(r);
      if (errcode_ret) *errcode_ret = err;
      return nullptr;
    }
  }
  r->refs.store(1);
  r->holds.store(1, std::memory_order_release);
  if (errcode_ret) *errcode_ret = CL_SUCCESS;
  return m;
}

// A pooled, live buffer (nullptr for anything else).

Rec* live_pooled(cl_mem m) {
  Rec* r = mems().find(m);
  return r && !r->sub && r->holds.load(std::memory_order_acquire) > 0 ? r : nullptr;
}

bool out_of_range(const Rec* r, size_t offset, size_t size) {
  return offset > r->requested || size > r->requested - offset;
}

cl_int put_info(void* value, size_t value_size, size_t* size_ret, const void* src, size_t n) {
  if (value) {
    if (value_size < n) return CL_INVALID_VALUE;
    if (n) std::memcpy(value, src, n);
  }
  if (size_ret) *size_ret = n;
  return CL_SUCCESS;
}

// Solo mode ends (under ctx.mu). If a block was reused while the solo
// queue's older work on it may still be running, every queue created from
// now on first waits for that work.
void end_solo(Ctx& ctx) {
  if (!ctx.solo.load()) return;
  ctx.solo.store(false, std::memory_order_seq_cst);
  const Api& api = next();
  if (ctx.solo_lent.load(std::memory_order_seq_cst) > ctx.completed.load() && ctx.solo_q &&
      !ctx.hazard && api.clEnqueueMarkerWithWaitList) {
    cl_event ev = nullptr;
    if (api.clEnqueueMarkerWithWaitList(ctx.solo_q, 0, nullptr, &ev) == CL_SUCCESS) {
      ctx.hazard = ev;
      if (api.clFlush) api.clFlush(ctx.solo_q);
    }
  }
  ctx.solo_q = nullptr;
}

void track_queue(cl_context c, cl_command_queue q, bool in_order) {
  std::shared_ptr<Ctx> ctx = find_ctx(c);
  if (!ctx) ctx = ctx_for_buffer(c);
  if (!ctx) return;
  auto* qi = new Queue;
  qi->q = q;
  // A new queue holds no command older than now: it does not hold back
  // blocks freed before it existed.
  qi->finished = ctx->epoch.fetch_add(1);
  qi->ctx = ctx.get();
  qi->owner = ctx;
  {
    std::lock_guard lock(ctx->mu);
    ctx->queues.push_back(qi);
    if (++ctx->queues_ever == 1 && in_order && !cl_gone()) {
      ctx->solo_q = q;
      ctx->solo.store(true, std::memory_order_seq_cst);
    } else {
      end_solo(*ctx);
    }
    if (ctx->hazard) {
      const Api& api = next();
      std::vector<cl_event> one{ctx->hazard};
      if (events_done(api, one)) {
        ctx->hazard = nullptr;
      } else if (api.clEnqueueBarrierWithWaitList) {
        api.clEnqueueBarrierWithWaitList(q, 1, &ctx->hazard, nullptr);
      }
    }
  }
  queues().put(q, qi);
}

// ---------------------------------------------------------------------------
// Hooks

cl_context CL_API_CALL h_create_context(const cl_context_properties* properties,
                                        cl_uint num_devices, const cl_device_id* devices,
                                        void(CL_CALLBACK* notify)(const char*, const void*, size_t,
                                                                  void*),
                                        void* user_data, cl_int* errcode_ret) {
  const Api& api = next();
  if (!api.clCreateContext) {
    if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_context c = api.clCreateContext(properties, num_devices, devices, notify, user_data,
                                     errcode_ret);
  // In export mode the loader may have initialised the layer during this
  // very call: then the layer's hook registered the context already.
  if (c && &api == &next() && active_runtime()) register_ctx(c);
  return c;
}

cl_context CL_API_CALL h_create_context_from_type(
    const cl_context_properties* properties, cl_device_type type,
    void(CL_CALLBACK* notify)(const char*, const void*, size_t, void*), void* user_data,
    cl_int* errcode_ret) {
  const Api& api = next();
  if (!api.clCreateContextFromType) {
    if (errcode_ret) *errcode_ret = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_context c = api.clCreateContextFromType(properties, type, notify, user_data, errcode_ret);
  if (c && &api == &next() && active_runtime()) register_ctx(c);
  return c;
}

cl_int CL_API_CALL h_retain_context(cl_context c) {
  cl_int err = next().clRetainContext(c);
  if (err == CL_SUCCESS)
    if (auto ctx = find_ctx(c)) ctx->refs.fetch_add(1);
  return err;
}

cl_int CL_API_CALL h_release_context(cl_context c) {
  std::shared_ptr<Ctx> ctx = find_ctx(c);
  Runtime* rt = runtime();
  if (ctx && ctx->refs_known && ctx->refs.fetch_sub(1) == 1) {
    // The program's last reference: stop pooling for this context and give
    // back what gpupool holds, so the context can really die.
    ctx->closed.store(true);
    {
      std::lock_guard lock(ctx_mu());
      auto it = ctx_map().find(c);
      if (it != ctx_map().end() && it->second == ctx) ctx_map().erase(it);
    }
    if (rt && !cl_gone()) {
      cl_command_queue internal = nullptr;
      std::vector<cl_event> evs;
      {
        std::lock_guard lock(ctx->mu);
        internal = ctx->internal;
        ctx->internal = nullptr;
        ctx->internal_failed = true;
        evs.swap(ctx->departed);
        evs.insert(evs.end(), ctx->close.events.begin(), ctx->close.events.end());
        ctx->close.events.clear();
        ctx->closing = false;
        if (ctx->hazard) evs.push_back(ctx->hazard);
        ctx->hazard = nullptr;
        ctx->solo.store(false);
        ctx->solo_q = nullptr;
      }
      release_closed(*rt, *ctx);
      if (ctx->active.load() == 0) finish_ctx(*rt, *ctx);
      const Api& api = next();
      for (cl_event e : evs) api.clReleaseEvent(e);
      if (internal) api.clReleaseCommandQueue(internal);
    }
  }
  return next().clReleaseContext(c);
}

cl_command_queue CL_API_CALL h_create_queue(cl_context c, cl_device_id d,
                                            cl_command_queue_properties props, cl_int* err) {
  const Api& api = next();
  if (!api.clCreateCommandQueue) {
    if (err) *err = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_command_queue q = api.clCreateCommandQueue(c, d, props, err);
  if (q && active_runtime()) track_queue(c, q, !(props & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE));
  return q;
}

cl_command_queue CL_API_CALL h_create_queue_props(cl_context c, cl_device_id d,
                                                  const cl_queue_properties* props, cl_int* err) {
  const Api& api = next();
  if (!api.clCreateCommandQueueWithProperties) {
    if (err) *err = CL_INVALID_OPERATION;
    return nullptr;
  }
  cl_command_queue q = api.clCreateCommandQueueWithProperties(c, d, props, err);
  cl_command_queue_properties qp = 0;
  for (int i = 0; props && props[i] && i < 64; i += 2)
    if (props[i] == CL_QUEUE_PROPERTIES) qp = props[i + 1];
  // Device-side queues take no host commands: their work completes with the
  // host-enqueued parent kernel, which the host queues cover.
  if (q && active_runtime() && !(qp & CL_QUEUE_ON_DEVICE))
    track_queue(c, q, !(qp & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE));
  return q;
}

cl_int CL_API_CALL h_retain_queue(cl_command_queue q) {
  cl_int err = next().clRetainCommandQueue(q);
  if (err == CL_SUCCESS)
    if (Queue* qi = queues().find(q)) qi->refs.fetch_add(1);
  return err;
}

cl_int CL_API_CALL h_release_queue(cl_command_queue q) {
  Queue* qi = queues().find(q);
  if (qi && qi->refs.fetch_sub(1) == 1) {
    queues().take(q);
    Ctx& ctx = *qi->ctx;
    const Api& api = next();
    {
      std::lock_guard lock(ctx.mu);
      std::erase(ctx.queues, qi);
      if (ctx.solo_q == q) end_solo(ctx);
      // Its commands may still use freed blocks: a marker stands in for it
      // at the next close.
      // (Not once the program released the context: nothing is pooled for
      // it any more, and the marker would keep it alive.)
      cl_event ev = nullptr;
      if (!cl_gone() && !ctx.closed.load() && api.clEnqueueMarkerWithWaitList &&
          api.clEnqueueMarkerWithWaitList(q, 0, nullptr, &ev) == CL_SUCCESS && ev)
        ctx.departed.push_back(ev);
    }
    delete qi;
  }
  return next().clReleaseCommandQueue(q);
}

cl_int CL_API_CALL h_finish(cl_command_queue q) {
  Queue* qi = queues().find(q);
  if (!qi) return next().clFinish(q);
  Ctx& ctx = *qi->ctx;
  const std::uint64_t e = ctx.epoch.fetch_add(1, std::memory_order_seq_cst);
  cl_int err = next().clFinish(q);
  if (err != CL_SUCCESS || cl_gone()) return err;
  // Every command enqueued on q before this call is done; once all queues of
  // the context are known done past an epoch, so is every block freed in it.
  std::lock_guard lock(ctx.mu);
  qi->finished = std::max(qi->finished, e);
  if (!ctx.departed.empty() && !events_done(next(), ctx.departed)) return err;
  std::uint64_t all = e;
  for (Queue* x : ctx.queues) all = std::min(all, x->finished);
  raise_completed(ctx, all);
  return err;
}

cl_mem CL_API_CALL h_create_buffer(cl_context c, cl_mem_flags flags, size_t size, void* host,
                                   cl_int* err) {
  return create_buffer(c, nullptr, false, flags, size, host, err);
}

cl_mem CL_API_CALL h_create_buffer_props(cl_context c, const cl_mem_properties* props,
                                         cl_mem_flags flags, size_t size, void* host, cl_int* err) {
  return create_buffer(c, props, true, flags, size, host, err);
}

cl_int CL_API_CALL h_retain_mem(cl_mem m) {
  Rec* r = mems().find(m);
  if (!r) return next().clRetainMemObject(m);
  if (r->holds.load() <= 0 || r->refs.load() <= 0) return CL_INVALID_MEM_OBJECT;
  r->holds.fetch_add(1);
  r->refs.fetch_add(1);
  return CL_SUCCESS;
}

cl_int CL_API_CALL h_release_mem(cl_mem m) {
  Rec* r = mems().find(m);
  if (!r) return next().clReleaseMemObject(m);
  int refs = r->refs.load();
  do {
    if (refs <= 0) return CL_INVALID_MEM_OBJECT;
  } while (!r->refs.compare_exchange_weak(refs, refs - 1));
  if (!r->sub) {
    drop_hold(r);
    return CL_SUCCESS;
  }
  if (refs == 1) {
    // A sub-buffer is a real object of its own: release it for real, then
    // let go of the parent it kept active.
    Rec* parent = r->parent;
    mems().take(m);
    cl_int err = next().clReleaseMemObject(m);
    delete r;
    drop_hold(parent);
    return err;
  }
  return CL_SUCCESS;
}

cl_int CL_API_CALL h_get_mem_info(cl_mem m, cl_mem_info what, size_t size, void* value,
                                  size_t* size_ret) {
  Rec* r = mems().find(m);
  if (!r) return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  if (r->refs.load() <= 0) return CL_INVALID_MEM_OBJECT;
  if (what == CL_MEM_REFERENCE_COUNT) {
    const cl_uint n = static_cast<cl_uint>(r->refs.load());
    return put_info(value, size, size_ret, &n, sizeof n);
  }
  if (r->sub) {
    if (what == CL_MEM_FLAGS) {
      // The real parent lacks COPY_HOST_PTR; the program's has it.
      cl_mem_flags f = 0;
      cl_int err = next().clGetMemObjectInfo(m, what, sizeof f, &f, nullptr);
      if (err != CL_SUCCESS) return err;
      f |= r->parent->flags & CL_MEM_COPY_HOST_PTR;
      return put_info(value, size, size_ret, &f, sizeof f);
    }
    return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  }
  switch (what) {
    case CL_MEM_SIZE: {
      const size_t n = r->requested;
      return put_info(value, size, size_ret, &n, sizeof n);
    }
    case CL_MEM_FLAGS:
      return put_info(value, size, size_ret, &r->flags, sizeof r->flags);
    case CL_MEM_PROPERTIES:
      return put_info(value, size, size_ret, r->props.data(),
                      r->has_props ? r->props.size() * sizeof(cl_mem_properties) : 0);
    default:
      return next().clGetMemObjectInfo(m, what, size, value, size_ret);
  }
}

cl_mem CL_API_CALL h_create_sub(cl_mem b, cl_mem_flags flags, cl_buffer_create_type type,
                                const void* info, cl_int* errcode_ret) {
  Rec* parent = mems().find(b);
  if (!parent) return next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
  if (parent->sub) {
    // A sub-buffer of a sub-buffer: the implementation decides (PoCL refuses,
    // NVIDIA 580 accepts); one it makes keeps the pooled block active too.
    Rec* root = parent->parent;
    root->holds.fetch_add(1);
    cl_mem s = next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
    if (!s) {
      drop_hold(root);
      return nullptr;
    }
    auto* r = new Rec;
    r->sub = true;
    r->mem = s;
    r->ctx = root->ctx;
    r->parent = root;
    r->refs.store(1);
    r->holds.store(1);
    mems().put(s, r);
    return s;
  }
  if (parent->refs.load() <= 0) {
    if (errcode_ret) *errcode_ret = CL_INVALID_MEM_OBJECT;
    return nullptr;
  }
  // The real buffer is larger: check the region against the program's size.
  if (type == CL_BUFFER_CREATE_TYPE_REGION && info) {
    const auto* reg = static_cast<const cl_buffer_region*>(info);
    if (reg->size != 0 && out_of_range(parent, reg->origin, reg->size)) {
      if (errcode_ret) *errcode_ret = CL_INVALID_VALUE;
      return nullptr;
    }
  }
  parent->holds.fetch_add(1);
  cl_mem s = next().clCreateSubBuffer(b, flags, type, info, errcode_ret);
  if (!s) {
    drop_hold(parent);
    return nullptr;
  }
  auto* r = new Rec;
  r->sub = true;
  r->mem = s;
  r->ctx = parent->ctx;
  r->parent = parent;
  r->refs.store(1);
  r->holds.store(1);
  mems().put(s, r);
  return s;
}

cl_int CL_API_CALL h_set_destructor(cl_mem m, void(CL_CALLBACK* fn)(cl_mem, void*), void* ud) {
  Rec* r = mems().find(m);
  if (!r || r->sub) return next().clSetMemObjectDestructorCallback(m, fn, ud);
  if (r->refs.load() <= 0) return CL_INVALID_MEM_OBJECT;
  if (!fn) return CL_INVALID_VALUE;
  std::lock_guard lock(cb_mu(r));
  r->callbacks.emplace_back(fn, ud);
  return CL_SUCCESS;
}

// Bounds the padding would hide: the implementation checks against the real
// (rounded) size, gpupool against the size the program asked for.
cl_int CL_API_CALL h_read(cl_command_queue q, cl_mem b, cl_bool blocking, size_t offset,
                          size_t size, void* ptr, cl_uint n, const cl_event* wait, cl_event* ev) {
  if (Rec* r = live_pooled(b); r && ptr && out_of_range(r, offset, size)) return CL_INVALID_VALUE;
  return next().clEnqueueReadBuffer(q, b, blocking, offset, size, ptr, n, wait, ev);
}

cl_int CL_API_CALL h_write(cl_command_queue q, cl_mem b, cl_bool blocking, size_t offset,
                           size_t size, const void* ptr, cl_uint n, const cl_event* wait,
                           cl_event* ev) {
  if (Rec* r = live_pooled(b); r && ptr && out_of_range(r, offset, size)) return CL_INVALID_VALUE;
  return next().clEnqueueWriteBuffer(q, b, blocking, offset, size, ptr, n, wait, ev);
}

cl_int CL_API_CALL h_copy(cl_command_queue q, cl_mem src, cl_mem dst, size_t so, size_t dof,
                          size_t size, cl_uint n, const cl_event* wait, cl_event* ev) {
  Rec* rs = live_pooled(src);
  Rec* rd = live_pooled(dst);
  if ((rs && out_of_range(rs, so, size)) || (rd && out_of_range(rd, dof, size)))
    return CL_INVALID_VALUE;
  return next().clEnqueueCopyBuffer(q, src, dst, so, dof, size, n, wait, ev);
}

cl_int CL_API_CALL h_fill(cl_command_queue q, cl_mem b, const void* pattern, size_t psize,
                          size_t offset, size_t size, cl_uint n, const cl_event* wait,
                          cl_event* ev) {
  if (Rec* r = live_pooled(b); r && pattern && psize && out_of_range(r, offset, size))
    return CL_INVALID_VALUE;
  return next().clEnqueueFillBuffer(q, b, pattern, psize, offset, size, n, wait, ev);
}

void* CL_API_CALL h_map(cl_command_queue q, cl_mem b, cl_bool blocking, cl_map_flags mf,
                        size_t offset, size_t size, cl_uint n, const cl_event* wait, cl_event* ev,
                        cl_int* errcode_ret) {
  if (Rec* r = live_pooled(b); r && out_of_range(r, offset, size)) {
    if (errcode_ret) *errcode_ret = CL_INVALID_VALUE;
    return nullptr;
  }
  return next().clEnqueueMapBuffer(q, b, blocking, mf, offset, size, n, wait, ev, errcode_ret);
}

// ---------------------------------------------------------------------------
// fork() (runtime.hpp): every lock, in the order the code nests them.

std::vector<Ctx*> g_fork_locked;

void fork_prepare() {
  ctx_mu().lock();
  g_all_ctx_mu.lock();
  g_fork_locked = all_ctx();
  for (Ctx* c : g_fork_locked) c->mu.lock();
  mems().lock_all();
  queues().lock_all();
  for (std::mutex& m : g_callback_locks) m.lock();
}

void fork_release() {
  for (std::mutex& m : g_callback_locks) m.unlock();
  queues().unlock_all();
  mems().unlock_all();
  for (Ctx* c : g_fork_locked) c->mu.unlock();
  g_fork_locked.clear();
  g_all_ctx_mu.unlock();
  ctx_mu().unlock();
}

// The child's contexts are the parent's: their queues are served by the
// parent's threads (on PoCL the child's own waits on them hang), and their
// held buffers are the parent's. Nothing of them is pooled in the child:
// new buffers go to the implementation, held ones are dropped without a
// call, and one the program created in the parent is released for real at
// its last release in the child, as without gpupool.
void fork_renew() {
  Runtime* rt = runtime_if_started();
  std::vector<std::shared_ptr<Ctx>> ctxs;
  {
    std::lock_guard lock(g_all_ctx_mu);
    for (Ctx* c : all_ctx())
      if (auto sp = c->weak_from_this().lock()) ctxs.push_back(std::move(sp));
  }
  for (auto& c : ctxs) {
    std::vector<Arena*> arenas;
    {
      std::lock_guard lock(c->mu);
      c->closed.store(true);
      c->internal = nullptr;
      c->internal_failed = true;
      c->departed.clear();
      c->close.events.clear();
      c->closing = false;
      c->hazard = nullptr;
      c->solo.store(false);
      c->solo_q = nullptr;
      for (auto& a : c->arenas) arenas.push_back(a.arena);
      c->arenas.clear();
    }
    if (rt)
      for (Arena* a : arenas) rt->pool.retire_arena(a, /*keep_stats=*/false);
  }
}

const bool g_fork_registered = (set_fork_handlers(ForkPart::opencl, {fork_prepare, fork_release,
                                                                    fork_release, fork_renew}),
                                true);

}  // namespace

namespace hook {
decltype(&::clCreateContext) const clCreateContext = h_create_context;
decltype(&::clCreateContextFromType) const clCreateContextFromType = h_create_context_from_type;
decltype(&::clRetainContext) const clRetainContext = h_retain_context;
decltype(&::clReleaseContext) const clReleaseContext = h_release_context;
decltype(&::clCreateCommandQueue) const clCreateCommandQueue = h_create_queue;
decltype(&::clCreateCommandQueueWithProperties) const clCreateCommandQueueWithProperties =
    h_create_queue_props;
decltype(&::clRetainCommandQueue) const clRetainCommandQueue = h_retain_queue;
decltype(&::clReleaseCommandQueue) const clReleaseCommandQueue = h_release_queue;
decltype(&::clFinish) const clFinish = h_finish;
decltype(&::clCreateBuffer) const clCreateBuffer = h_create_buffer;
decltype(&::clCreateBufferWithProperties) const clCreateBufferWithProperties =
    h_create_buffer_props;
decltype(&::clRetainMemObject) const clRetainMemObject = h_retain_mem;
decltype(&::clReleaseMemObject) const clReleaseMemObject = h_release_mem;
decltype(&::clGetMemObjectInfo) const clGetMemObjectInfo = h_get_mem_info;
decltype(&::clCreateSubBuffer) const clCreateSubBuffer = h_create_sub;
decltype(&::clSetMemObjectDestructorCallback) const clSetMemObjectDestructorCallback =
    h_set_destructor;
decltype(&::clEnqueueReadBuffer) const clEnqueueReadBuffer = h_read;
decltype(&::clEnqueueWriteBuffer) const clEnqueueWriteBuffer = h_write;
decltype(&::clEnqueueCopyBuffer) const clEnqueueCopyBuffer = h_copy;
decltype(&::clEnqueueFillBuffer) const clEnqueueFillBuffer = h_fill;
decltype(&::clEnqueueMapBuffer) const clEnqueueMapBuffer = h_map;
}  // namespace hook

}  // namespace gpupool::ocl
