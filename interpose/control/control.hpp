// Control and observation of a running program: signals, the control thread,
// stats dumps, the trace file and the per-process control socket.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "observe/stats_format.hpp"

namespace gpupool {
struct Runtime;
namespace control {

// The room's state (internal.hpp), made by the runtime's create(); never
// destroyed. The room's parts of the process's life, its start, exit and
// fork, are in runtime.hpp's table (control::kPart: control.cpp).
struct State;

// The control thread's work for the node room (node/node.hpp), which
// registers it when it starts, before control starts the thread: control
// includes no other room, so the two do not depend on each other.
struct NodeWork {
  // Every round, under the work lock, unless exit began: publishing and the
  // pressure watch. Returns when it wants to run next (CLOCK_MONOTONIC ns;
  // UINT64_MAX: only when woken).
  std::uint64_t (*tick)(Runtime& runtime, std::uint64_t now_ns) = nullptr;
  // The answer's body to another process's "release <args>", under the
  // work lock; other_user: it runs as another user.
  std::string (*answer_release)(Runtime& runtime, std::string_view args, bool other_user) = nullptr;
};
void set_node_work(Runtime& runtime, NodeWork work);

// A report of the pool now. `reason` ends up in the dump ("signal", ...).
stats::Report report(Runtime& runtime, const char* reason);
// The report rendered as the text table or one JSON object (with newline).
std::string render(Runtime& runtime, bool json, const char* reason);

// Write a dump to the configured destination (and the Prometheus file).
// Serialized with every other control action. False if nothing was written.
bool dump(Runtime& runtime, const char* reason);

// Wakes the control thread for its periodic work now (a new device to
// publish). Any thread; async-signal-safe.
void wake() noexcept;

// The pool actions, serialized with dumps; refused (false) once exit began,
// since they call into drivers that may be torn down.
bool free_held(Runtime& runtime);
bool stop_holding(Runtime& runtime);
// Every peak down to its current value (Pool::reset_peaks).
bool reset_peaks(Runtime& runtime);

// The trace, started and stopped by the program (docs/c-api.md). True with
// *msg the file written; false with *msg why (a trace already runs, none
// runs, the file cannot be had, exit began), nothing changed.
bool trace_start(Runtime& runtime, const std::string& path, std::string* msg);
bool trace_stop(Runtime& runtime, std::string* msg);

// The live blocks as one JSON object with newline (docs/c-api.md).
std::string snapshot_json(Runtime& runtime);

}  // namespace control
}  // namespace gpupool
