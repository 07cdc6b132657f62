// A program's thread inside gpupool: every entry point the program (or an
// implementation's callback) calls opens a HookScope first, the CUDA and
// OpenCL hooks, the gpupool_* C functions and the callbacks gpupool hands an
// implementation. gpupool's own threads block every signal and are never
// the program's to cancel, so they need none.
//
// What it is for: a signal handler may interrupt the thread anywhere inside,
// holding any of gpupool's locks. A fork() or _exit() from that handler
// must then take none of them (runtime.cpp, control.cpp).
#pragma once

#include <atomic>

#include "core/hot_tls.hpp"

namespace gpupool {

namespace detail {
extern GPUPOOL_HOT_TLS unsigned t_hook_depth;
}  // namespace detail

// True while this thread is inside one of gpupool's entry points.
inline bool inside_hook() { return detail::t_hook_depth != 0; }

class HookScope {
 public:
  // The fences keep the count around every lock inside (a compiler barrier
  // only: a handler on this thread sees the thread's own order).
  HookScope() noexcept {
    ++detail::t_hook_depth;
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  ~HookScope() {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --detail::t_hook_depth;
  }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

}  // namespace gpupool
