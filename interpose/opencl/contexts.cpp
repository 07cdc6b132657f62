#include "interpose/opencl/contexts.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>

#include <unistd.h>

#include <CL/cl_ext.h>
#include <fmt/format.h>

#include "core/fork_wait.hpp"
#include "interpose/opencl/buffers.hpp"
#include "interpose/opencl/unpooled.hpp"
#include "sys/log.hpp"

namespace gpupool::ocl {

bool is_oom(cl_int e) {
  return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES ||
         e == CL_OUT_OF_HOST_MEMORY;
}

bool cl_gone() { return exiting() || loader_gone(); }

namespace {

std::string device_string(const Api& api, cl_device_id d, cl_device_info what) {
  std::size_t n = 0;
  if (api.clGetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
  std::string s(n, '\0');
  if (api.clGetDeviceInfo(d, what, n, s.data(), nullptr) != CL_SUCCESS) return {};
  s.resize(std::strlen(s.c_str()));
  return s;
}

// The name of the device's platform; empty when unknown.
std::string platform_name(const Api& api, cl_device_id d) {
  cl_platform_id platform = nullptr;
  std::size_t n = 0;
  if (!api.clGetPlatformInfo ||
      api.clGetDeviceInfo(d, CL_DEVICE_PLATFORM, sizeof platform, &platform, nullptr) !=
          CL_SUCCESS ||
      api.clGetPlatformInfo(platform, CL_PLATFORM_NAME, 0, nullptr, &n) != CL_SUCCESS || n == 0)
    return {};
  std::string s(n, '\0');
  if (api.clGetPlatformInfo(platform, CL_PLATFORM_NAME, n, s.data(), nullptr) != CL_SUCCESS)
    return {};
  s.resize(std::strlen(s.c_str()));
  return s;
}

}  // namespace

Ctx::Ctx(State& st) : state(st) {
  ordinal = ++st.ordinals;
  LockGuard lock(st.records_mu);
  st.records.push_back(this);
}
Ctx::~Ctx() {
  LockGuard lock(state.records_mu);
  std::erase(state.records, this);
}

Runtime* active_runtime() {
  Runtime* rt = runtime();
  if (!rt || !rt->config.opencl || cl_gone()) return nullptr;
  return rt;
}

std::shared_ptr<Ctx> find_ctx(State& st, cl_context c) {
  LockGuard lock(st.contexts_mu);
  auto it = st.contexts.find(c);
  return it == st.contexts.end() ? nullptr : it->second;
}

namespace {

// A context in a process whose OpenCL implementation an ancestor initialised
// (api.hpp, implementation_inherited): nothing of it is pooled or asked of
// its device here (closed, no internal queue, gpupool's events and solo mode
// dropped). Returns its arenas, for the caller to retire.
std::vector<Arena*> close_inherited(Ctx& c) {
  std::vector<Arena*> arenas;
  LockGuard lock(c.mu);
  c.closed.store(true);
  c.internal = nullptr;
  c.internal_failed = true;
  (void)take_own_events(c);  // the parent's, which it releases
  c.solo.store(false);
  c.solo_q = nullptr;
  for (auto& a : c.arenas) arenas.push_back(a.arena);
  c.arenas.clear();
  c.unpooled = nullptr;  // a forked parent's (unpooled.cpp retires it)
  return arenas;
}

// A new record, closed where the implementation was inherited, whether the
// context is the parent's (gpupool did not see it created there) or the
// child's own: its device's threads are the parent's either way.
std::shared_ptr<Ctx> new_record(State& st, cl_context c, bool refs_known) {
  auto ctx = std::make_shared<Ctx>(st);
  ctx->handle = c;
  ctx->refs_known = refs_known;
  if (implementation_inherited()) (void)close_inherited(*ctx);
  return ctx;
}

}  // namespace

void register_ctx(State& st, cl_context c) {
  auto ctx = new_record(st, c, /*refs_known=*/true);
  LockGuard lock(st.contexts_mu);
  st.contexts[c] = std::move(ctx);
}

std::shared_ptr<Ctx> ctx_for_buffer(State& st, cl_context c) {
  if (!c) return nullptr;
  LockGuard lock(st.contexts_mu);
  auto& slot = st.contexts[c];
  if (!slot) slot = new_record(st, c, /*refs_known=*/false);
  return slot;
}

void forget_ctx(State& st, cl_context c, const std::shared_ptr<Ctx>& ctx) {
  contexts_changed(st);
  LockGuard lock(st.contexts_mu);
  auto it = st.contexts.find(c);
  if (it != st.contexts.end() && it->second == ctx) st.contexts.erase(it);
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
  bool ocl12 = true, svm = true;
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
    if (std::sscanf(ver.c_str(), "OpenCL %d.%d", &major, &minor) != 2 || major * 100 + minor < 102)
      ocl12 = false;
    cl_device_svm_capabilities caps = 0;
    if (major < 2 ||
        api.clGetDeviceInfo(d, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, nullptr) !=
            CL_SUCCESS ||
        !(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER))
      svm = false;
  }
  ctx.device = devs[0];
  ctx.device_name = device_string(api, devs[0], CL_DEVICE_NAME);
  if (devs.size() == 1) {
    const std::string ext = " " + device_string(api, devs[0], CL_DEVICE_EXTENSIONS) + " ";
    static_assert(CL_UUID_SIZE_KHR == sizeof(wire::DeviceKey));
    ctx.has_uuid = ext.find(" cl_khr_device_uuid ") != std::string::npos &&
                   api.clGetDeviceInfo(devs[0], CL_DEVICE_UUID_KHR, ctx.uuid.size(),
                                       ctx.uuid.data(), nullptr) == CL_SUCCESS &&
                   ctx.uuid != wire::DeviceKey{};
  }
  // Named alike in every process of the node (the registry, `gpupool ps`,
  // release requests, the stats): the UUID, else what names the devices
  // (their platform, vendor and name) and the node.
  if (ctx.has_uuid) {
    ctx.key = ctx.uuid;
  } else {
    std::string identity;
    for (cl_device_id d : devs)
      identity += platform_name(api, d) + '\n' + device_string(api, d, CL_DEVICE_VENDOR) + '\n' +
                  device_string(api, d, CL_DEVICE_NAME) + '\n';
    char node[256] = {};
    if (gethostname(node, sizeof node - 1) != 0) node[0] = 0;
    ctx.key = wire::derived_key(identity + "node " + node);
  }
  ctx.max_alloc = max_alloc;
  ctx.global_mem = global;
  ctx.ocl12 = ocl12 && api.clEnqueueMigrateMemObjects;
  ctx.svm = svm && api.clSVMAlloc && api.clSVMFree;
  ctx.info_ok = max_alloc > 0;
}

cl_command_queue internal_queue(Ctx& ctx) {
  LockGuard lock(ctx.mu);
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
      st = -1;                           // an event we cannot ask about will not tell us more later
    if (st > CL_COMPLETE) return false;  // CL_COMPLETE = 0; errors are negative: done too
  }
  for (cl_event e : evs) api.clReleaseEvent(e);
  evs.clear();
  return true;
}

OwnEvents take_own_events(Ctx& ctx) {
  OwnEvents r;
  r.departed.swap(ctx.departed);
  r.closing.swap(ctx.close.events);
  ctx.closing = false;
  r.hazard = ctx.hazard;
  ctx.hazard = nullptr;
  return r;
}

void OwnEvents::release(const Api& api) const {
  for (cl_event e : departed) api.clReleaseEvent(e);
  for (cl_event e : closing) api.clReleaseEvent(e);
  if (hazard) api.clReleaseEvent(hazard);
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
  LockGuard lock(ctx.mu);
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

void track_queue(State& st, cl_context c, cl_command_queue q, bool in_order) {
  std::shared_ptr<Ctx> ctx = find_ctx(st, c);
  if (!ctx) ctx = ctx_for_buffer(st, c);
  if (!ctx) return;
  auto* qi = new Queue;
  qi->q = q;
  // A new queue holds no command older than now: it does not hold back
  // blocks freed before it existed.
  qi->finished = ctx->epoch.fetch_add(1);
  qi->ctx = ctx.get();
  qi->owner = ctx;
  {
    LockGuard lock(ctx->mu);
    ctx->queues.push_back(qi);
    Runtime* rt = runtime_if_started();
    const bool solo_allowed = !rt || rt->config.reuse != config::Reuse::fenced;
    if (++ctx->queues_ever == 1 && in_order && solo_allowed && !cl_gone()) {
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
  st.queues.put(q, qi);
}

namespace {

// ---------------------------------------------------------------------------
// fork() (runtime.hpp): every lock, in rank order (core/lock_rank.hpp).

// A wait that gives up (core/fork_wait.hpp) ends it: what it took is in
// the fork's journal, with the list of contexts locked. A fork while the
// runtime is being made (its handlers are registered before it is
// published) finds no state: nothing to take, and then nothing to release
// either (State::fork_held).
void fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* st = state();
  if (!st) return;
  st->fork_held = true;
  if (!fork_wait::take(st->contexts_mu) || !fork_wait::take(st->records_mu)) return;
  fork_wait::journal([](void* p) { static_cast<State*>(p)->fork_locked.clear(); }, st);
  st->fork_locked = st->records;
  for (Ctx* c : st->fork_locked)
    if (!fork_wait::take(c->mu)) return;
  if (buffers_fork_lock(*st) && st->queues.lock_all()) (void)unpooled_fork_lock(*st);
}

void fork_release() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* state_now = state();
  if (!state_now || !std::exchange(state_now->fork_held, false)) return;
  State& st = *state_now;
  unpooled_fork_unlock(st);
  st.queues.unlock_all();
  buffers_fork_unlock(st);
  for (Ctx* c : st.fork_locked) c->mu.unlock();
  st.fork_locked.clear();
  st.records_mu.unlock();
  st.contexts_mu.unlock();
}

// The child's contexts are the parent's: their queues are served by the
// parent's threads (on PoCL the child's own waits on them hang), and their
// held buffers are the parent's. Nothing of them is pooled in the child, and
// no device work is added there: new buffers go to the implementation, held
// ones are dropped without a call, and one the program created in the parent
// is released for real at its last release in the child, as without
// gpupool. Contexts gpupool first sees in the child get closed records too
// (new_record): the child inherited the initialised implementation.
void fork_renew() {
  Runtime* runtime_now = runtime_if_started();
  if (!runtime_now) return;
  Runtime& rt = *runtime_now;
  State& st = *rt.opencl;
  std::vector<std::shared_ptr<Ctx>> ctxs;
  {
    LockGuard lock(st.records_mu);
    for (Ctx* c : st.records)
      if (auto sp = c->weak_from_this().lock()) ctxs.push_back(std::move(sp));
  }
  contexts_changed(st);
  unpooled_fork_renew(rt);
  for (auto& c : ctxs)
    for (Arena* a : close_inherited(*c)) rt.pool.retire_arena(a, /*keep_stats=*/false);
}

// The room's state, in the runtime before it is published.
void make(Runtime& rt) { rt.opencl = new State; }

}  // namespace

// The room's part (runtime.hpp: Part::opencl).
constinit const PartHandlers kPart{.make = make,
                                   .fork = {fork_prepare, fork_release, fork_release, fork_renew}};

}  // namespace gpupool::ocl
