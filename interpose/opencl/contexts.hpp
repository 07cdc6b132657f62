// OpenCL contexts as gpupool sees them: each context's record (its queues,
// arenas, internal queue and fences), the handle maps, and the rules that
// tell when a freed buffer's commands are done.
//
// - Deferred deletion: a freed block carries its context's epoch; it is
//   reusable once every queue of the context is known to have finished the
//   commands enqueued before the free: observed clFinish, or markers enqueued
//   (non-blocking, polled) when the pool needs a pending block. Never a
//   blocking wait: a command held by a user event must not hang allocation.
// - One in-order queue ("solo"): blocks are reusable at once (Ctx::solo).
// - Context lifetime: at the program's last clReleaseContext the context's
//   held blocks and internal queue are released, so the context really dies.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/pool.hpp"
#include "interpose/opencl/state.hpp"
#include "wire/device_key.hpp"

namespace gpupool::ocl {

using Props = std::vector<cl_mem_properties>;

// The implementation's out-of-memory answers.
bool is_oom(cl_int e);

// No OpenCL call of our own once exit began or the loader is going away.
bool cl_gone();
// The loader is shutting down (clDeinitLayer ran; layer.cpp).
bool loader_gone();

// The runtime when OpenCL pooling is on and OpenCL still usable.
Runtime* active_runtime();

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
  explicit Ctx(State& state);  // listed in state.records while it lives
  ~Ctx();
  Ctx(const Ctx&) = delete;
  Ctx& operator=(const Ctx&) = delete;

  State& state;
  cl_context handle = nullptr;
  std::atomic<int> refs{1};  // the program's references
  bool refs_known = true;    // false: seen first at a buffer, creation missed
  std::atomic<bool> closed{false};
  std::atomic<std::int64_t> active{0};  // pooled buffers and SVM blocks the program holds

  std::once_flag info_once;
  bool info_ok = false;
  cl_device_id device = nullptr;  // the internal queue's (first) device
  std::string device_name;
  // 1, 2, ...: the context's name in gpupool's stats (no address: the same
  // program's stats read alike from run to run).
  std::uint64_t ordinal = 0;
  std::size_t max_alloc = 0;   // min CL_DEVICE_MAX_MEM_ALLOC_SIZE over the devices
  std::size_t global_mem = 0;  // min CL_DEVICE_GLOBAL_MEM_SIZE
  bool ocl12 = false;
  bool svm = false;  // every device has coarse-grained SVM buffers (svm.cpp)
  // The device's UUID (cl_khr_device_uuid), for a context of one device
  // that has one: its buffers then draw on a GPU every context on it shares
  // (one pool group), which NVML watches (NVIDIA's is the CUDA UUID).
  bool has_uuid = false;
  wire::DeviceKey uuid{};
  // What the node's other processes know its memory by (the registry,
  // `gpupool ps`, release requests: interpose/node): the UUID, else a key
  // derived from its devices' platform, vendor and name and the node
  // (wire/device_key.hpp), so that PoCL's CPU device takes part too. Its
  // text is the device in the stats.
  wire::DeviceKey key{};

  Ranked<LockRank::opencl_context> mu;  // everything below
  cl_command_queue internal = nullptr;
  bool internal_failed = false;
  struct ArenaEntry {
    cl_mem_flags flags;
    bool has_props;
    Props props;
    Arena* arena;
    bool svm;  // shared virtual memory (svm.cpp), else buffers
  };
  std::vector<ArenaEntry> arenas;
  // A closed context's buffers, noted not pooled (unpooled.hpp): made at
  // the first, owned by unpooled.cpp.
  Arena* unpooled GPUPOOL_GUARDED_BY(mu) = nullptr;
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
  cl_command_queue solo_q GPUPOOL_GUARDED_BY(mu) = nullptr;
  int queues_ever GPUPOOL_GUARDED_BY(mu) = 0;
  // Highest fence of a block reused by the solo rule: if the queue's work on
  // it may still be pending when solo mode ends, later queues first wait for
  // that work (hazard marker), so they cannot touch the block too early.
  std::atomic<std::uint64_t> solo_lent{0};
  cl_event hazard GPUPOOL_GUARDED_BY(mu) = nullptr;
};

// The record of queue q, if gpupool tracks it.
inline Queue* find_queue(cl_command_queue q) {
  State* st = state();
  return st ? st->queues.find(q) : nullptr;
}

// The record of context c, if gpupool saw it created.
std::shared_ptr<Ctx> find_ctx(State& st, cl_context c);
// A context the program just created. Its record, like ctx_for_buffer's, is
// closed in a process that inherited the implementation
// (implementation_inherited).
void register_ctx(State& st, cl_context c);
// The context of a buffer request; one created before gpupool saw it gets a
// record whose reference count is unknown (its release is then passed on).
std::shared_ptr<Ctx> ctx_for_buffer(State& st, cl_context c);
// The program released its last reference: no more pooling for it.
void forget_ctx(State& st, cl_context c, const std::shared_ptr<Ctx>& ctx);

// Changes whenever a context record stops serving buffer requests (the
// program released it, its arenas were retired, a fork made it the
// parent's): a thread's cached context and arena are valid only while it
// has not changed (buffers.cpp).
inline std::uint64_t contexts_generation(const State& st) {
  return st.generation.load(std::memory_order_acquire);
}
inline void contexts_changed(State& st) { st.generation.fetch_add(1, std::memory_order_acq_rel); }

// Device limits and name, once per context (Ctx::info_once).
void load_info(Ctx& ctx);
// The context's own queue for probes and COPY_HOST_PTR writes (created on
// first need; it keeps the context alive until the program's last release).
cl_command_queue internal_queue(Ctx& ctx);

// Fences.
bool events_done(const Api& api, std::vector<cl_event>& evs);

// The events gpupool enqueued on a context's queues (Ctx::departed, a
// close's markers, the hazard marker), taken out of it.
struct OwnEvents {
  std::vector<cl_event> departed;
  std::vector<cl_event> closing;
  cl_event hazard = nullptr;
  // Drops gpupool's reference to each.
  void release(const Api& api) const;
};
// Takes ctx's own events, ending a close under way.
OwnEvents take_own_events(Ctx& ctx) GPUPOOL_REQUIRES(ctx.mu);
void raise_completed(Ctx& ctx, std::uint64_t e);
// Called by the pool when a bin holds only pending blocks. Non-blocking.
void advance(Ctx& ctx);

// A new command queue of the program's (in_order: no out-of-order flag).
void track_queue(State& st, cl_context c, cl_command_queue q, bool in_order);
// Solo mode ends.
void end_solo(Ctx& ctx) GPUPOOL_REQUIRES(ctx.mu);

}  // namespace gpupool::ocl
