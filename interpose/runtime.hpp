// The preloaded library's process-wide state, in one place. Created at the
// first intercepted call, never at load time, and never destroyed (hooks
// may run during exit).
//
// State. Runtime (below) owns the configuration, the one pool and the
// rooms' state objects: control::State (control/internal.hpp: the control
// thread and socket, dumps, warnings, the Tracer and the Recorder, which
// is the pool's observer), node::State (node/internal.hpp: this process's
// GPUs, the node registry and the NVML session), ocl::State
// (opencl/state.hpp: the OpenCL contexts, queues, buffers and SVM blocks)
// and cuda::State (cuda/state.hpp: the CUDA context registry, pointer
// maps, managed memory pools and virtual memory units). What stays outside
// it is listed, each with its reason, in docs/globals.md (ctest
// docs.globals checks the list against the sources): what hooks read
// before the runtime exists or once exit began (this file's g_runtime, the
// driver and dispatch tables, CUDA's primary contexts, solo rule, stream
// captures and the program's pool thresholds), the signal handlers' slots,
// CUDA's IPC registry, not yet moved here, the process's I/O (sys/: the
// configuration, the logger, the files thread) and per-thread state. Each
// is made at compile time or at first use (core/no_destructor.hpp), never
// destroyed. The parts' table (kParts, below) is constant data.
//
// gpupool's parts (Part, below: the rooms and the runtime's own pieces)
// take part in the process's life through one ordered table, kParts: the
// runtime calls them and includes none of their headers, so the rooms
// include runtime.hpp and it includes none of them.
//
// Start (runtime_slow, once): create() reads the configuration, moves
// gpupool's files to their own descriptor table, starts the logger, makes
// the pool, then each part's state (make: OpenCL's, node's, control's),
// registers the exit handler and the fork handlers; the runtime is
// published; each part starts: node gives the control thread its work,
// then control opens the sites, the trace and the recorder (the pool's
// observer), installs the signal handlers, binds the control socket and
// starts the control thread.
// The CUDA and OpenCL rooms make their records at the program's calls.
//
// Fork: every part's handlers, in Part order (below); the child then
// renews each part, and its first intercepted call restarts what it did not
// inherit (restart: control's thread and socket). A fork from a signal
// handler inside gpupool, or one whose prepare gave up waiting for a lock
// (core/fork_wait.hpp), goes without gpupool: its child is inert.
//
// Stop: the exit handler sets exiting() (no more driver calls; the control
// thread stops), then each part's exit in reverse order: control's (the
// last trace records, the exit dump, the leak report, the Prometheus file
// removed), then node's (this process leaves the registry). Nothing is
// destroyed. _exit() and _Exit() run each part's quick_exit instead
// (control's: the trace's last records).
#pragma once

#include <atomic>
#include <cstdint>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"
#include "core/pool.hpp"

#define GPUPOOL_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpupool {

namespace control {
struct State;
}
namespace node {
struct State;
}
namespace ocl {
struct State;
}
namespace cuda {
struct State;
}

struct Runtime {
  const config::Config& config;
  Pool pool;
  // The rooms' state, made by their parts' make (kParts, below), before
  // the runtime is published, so read without locks.
  control::State* control = nullptr;
  ocl::State* opencl = nullptr;  // opencl/state.hpp
  cuda::State* cuda = nullptr;   // cuda/state.hpp
  // A forked child's is new (node.cpp's fork handler).
  std::atomic<node::State*> node{nullptr};
  // The CUDA room's answer to another process's "ipc <args>" (cuda/ipc.hpp),
  // set at the program's first export, given by control's socket: the
  // answer, and descriptors of the program's table to send with it.
  using IpcAnswer = std::string (*)(std::string_view args, std::vector<int>* fds);
  std::atomic<IpcAnswer> ipc_answer{nullptr};
};

namespace detail {
extern std::atomic<Runtime*> g_runtime;
// Set in a forked child: its next call restarts the control thread.
extern std::atomic<bool> g_renew_control;
Runtime* runtime_slow();
}  // namespace detail

// The runtime, created on first call. nullptr when GPUPOOL_DISABLE=1 (or when
// the first call comes after exit began): hooks then pass calls straight
// through. In a forked child, the first call also restarts what the child
// did not inherit (the control thread). Inline: every hook asks, once or
// twice a call.
inline Runtime* runtime() {
  Runtime* rt = detail::g_runtime.load(std::memory_order_acquire);
  if (rt && !detail::g_renew_control.load(std::memory_order_relaxed)) return rt;
  return detail::runtime_slow();
}

// The runtime if it exists; never creates it. nullptr in an inert forked
// child too.
inline Runtime* runtime_if_started() { return detail::g_runtime.load(std::memory_order_acquire); }

// Something inside gpupool failed (an exception caught at an entry point,
// std::bad_alloc most likely): logged once with `where`, counted. Never
// throws.
void internal_failure(const char* where) noexcept;
std::uint64_t internal_failures() noexcept;
// The forks that went without gpupool (a thread inside gpupool forked, from
// a signal handler, or a lock stayed busy past fork_wait's bound), whose
// children pool nothing: counted in the parent, said in the stats warnings.
std::uint64_t forks_without_gpupool() noexcept;

// True once exit has begun (atexit ran): no more calls into drivers that may
// already be torn down.
bool exiting();

// gpupool's parts, in the one order of everything the runtime calls in them
// (PartHandlers, kParts below). fork(): the runtime's single pthread_atfork
// handler calls each part's ForkHandlers:
//   prepare  in this order, taking the part's locks (so no lock is held by
//            a thread the child will not have), each wait one that gives
//            up (core/fork_wait.hpp: fork_wait::take): a prepare whose
//            wait gave up returns, what it took is in the fork's journal;
//   parent   in reverse order, releasing them;
//   child    in reverse order, releasing them (or making them new);
//   renew    in this order, in the child once every lock is free: the
//            child's own start (the parent's contexts and files are not
//            its own).
// The parts are in the order of their locks' ranks (core/lock_rank.hpp),
// and each takes its own in rank order: prepare takes every lock in the
// table's order.
enum class Part : unsigned {
  round,    // the control thread's round (it allocates, and takes every lock below)
  cuda,     // the solo rule, contexts' teardown locks, the registry, fence syncs, pointer maps
  opencl,   // the context map, the records, each context, buffer/SVM/callback/queue maps
  node,     // no lock: waits for NVML calls in flight; the child starts anew (node.cpp)
  pool,     // arena list, arenas' slow locks and shards
  trace,    // the observer: per-thread trace buffers, the trace file, the sites, the recorder
  control,  // warnings, requests (its work lock protects no data: made new in the child)
  log,      // the logger's sink
  files,    // the files thread's queue: last, since every part above may
            // hand it work while holding its own locks (sys/io.hpp)
  count
};
// The ranks each part's prepare handler takes, lowest and highest (node
// takes none: it waits for NVML calls in flight instead). Checked below
// against the rank table: the parts' order is the ranks' order.
struct PartRanks {
  Part part;
  LockRank first, last;
};
inline constexpr PartRanks kPartRanks[] = {
    {Part::round, LockRank::control_round, LockRank::control_round},
    {Part::cuda, LockRank::cuda_solo, LockRank::cuda_pointers},
    {Part::opencl, LockRank::opencl_contexts, LockRank::opencl_queues},
    {Part::pool, LockRank::pool_arenas, LockRank::arena_segments},
    {Part::trace, LockRank::trace_buffer, LockRank::recorder_shard},
    {Part::control, LockRank::control_warnings, LockRank::control_requests},
    {Part::log, LockRank::log_sink, LockRank::log_sink},
    {Part::files, LockRank::files_queue, LockRank::files_queue},
};
// By index, not pointer: gcc with -fsanitize=undefined (the ASan stage)
// does not take a pointer's comparison with null as a constant expression.
constexpr bool parts_in_rank_order() {
  for (std::size_t i = 0; i < std::size(kPartRanks); ++i) {
    const PartRanks& p = kPartRanks[i];
    if (p.last < p.first) return false;
    if (i > 0) {
      const PartRanks& prev = kPartRanks[i - 1];
      if (p.part <= prev.part || p.first <= prev.last) return false;
    }
  }
  return true;
}
static_assert(parts_in_rank_order(),
              "Part order and the lock ranks' (core/lock_rank.hpp) differ: fork()'s prepare "
              "handlers would take locks out of rank order");
static_assert(std::size(kPartRanks) == static_cast<unsigned>(Part::count) - 1,
              "every fork part but node takes locks: list its ranks in kPartRanks");

struct ForkHandlers {
  void (*prepare)() = nullptr;
  void (*parent)() = nullptr;
  void (*child)() = nullptr;
  void (*renew)() = nullptr;
};

// What a part does at each step of the process's life (the top of this
// file); any may be null. Each runs in Part order, the exits in reverse.
struct PartHandlers {
  // The part's state in the runtime, before the runtime is published.
  void (*make)(Runtime&) = nullptr;
  // Once the runtime is published.
  void (*start)(Runtime&) = nullptr;
  // In a forked child, at its first intercepted call.
  void (*restart)(Runtime&) = nullptr;
  // The exit handler, once exiting() is true; and _exit(), _Exit().
  void (*exit)() noexcept = nullptr;
  void (*quick_exit)() noexcept = nullptr;
  // A check made once a second on gpupool's control thread, never once
  // exit began, for what no call of the program's brings up (CUDA:
  // contexts that ended where gpupool did not see them).
  void (*housekeeping)(Runtime&) = nullptr;
  ForkHandlers fork;
};

// Each part's handlers, defined by its room (the runtime's own in
// runtime.cpp) as constant data: the table is whole before any code runs,
// since a hook may be called before gpupool's static initializers (from
// another library's constructor).
namespace control {
extern const PartHandlers kRoundPart, kTracePart, kPart;
}
namespace cuda {
extern const PartHandlers kPart;
}
namespace ocl {
extern const PartHandlers kPart;
}
namespace node {
extern const PartHandlers kPart;
}
extern const PartHandlers kPoolPart, kLogPart, kFilesPart;

struct PartEntry {
  Part part;
  const PartHandlers* handlers;
};
inline constexpr PartEntry kParts[] = {
    {Part::round, &control::kRoundPart},
    {Part::cuda, &cuda::kPart},
    {Part::opencl, &ocl::kPart},
    {Part::node, &node::kPart},
    {Part::pool, &kPoolPart},
    {Part::trace, &control::kTracePart},
    {Part::control, &control::kPart},
    {Part::log, &kLogPart},
    {Part::files, &kFilesPart},
};
constexpr bool parts_listed_in_order() {
  for (std::size_t i = 0; i < std::size(kParts); ++i)
    if (kParts[i].part != static_cast<Part>(i)) return false;
  return std::size(kParts) == static_cast<unsigned>(Part::count);
}
static_assert(parts_listed_in_order(), "kParts lists every Part once, in Part's order");

// Every part's housekeeping check (the control thread's, once a second).
void housekeeping(Runtime& rt);

}  // namespace gpupool
