// Control and observation of a running program: signals, the control thread,
// stats dumps, the trace file and the per-process control socket.
#pragma once

namespace gpupool {
struct Runtime;
namespace control {

// Called once, right after the runtime is created (first intercepted call).
// Installs signal handlers and starts the control thread as configured.
void start(Runtime& runtime);

}  // namespace control
}  // namespace gpupool
