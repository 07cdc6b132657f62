// A program's thread inside gpupool: every entry point the program (or an
// implementation's callback) calls opens a HookScope first, the CUDA and
// OpenCL hooks, the gpupool_* C functions and the callbacks gpupool hands an
// implementation. gpupool's own threads block every signal and are never
// the program's to cancel, so they need none.
//
// What it is for:
// - A signal handler may interrupt the thread anywhere inside, holding any
//   of gpupool's locks. A fork() or _exit() from that handler must then take
//   none of them (runtime.cpp, control.cpp), and its fork() says so first:
//   another thread's fork waiting for one of them gives up (runtime.cpp).
// - No hook acts on a thread cancellation: a cancellation point inside
//   (a condition wait, poll, write, the driver's own waits) would unwind
//   through gpupool's frames, which do not expect it. pthread_setcancelstate
//   costs two atomic updates of the thread's state (45 ns a pair here), too
//   much for the hit path, so gpupool sees cancellations instead: its
//   pthread_cancel (hook_scope.cpp) marks the process, from then on every
//   hook holds cancellation off for its whole length, and a cancellation
//   of a thread already inside an unguarded hook is delivered as it leaves.
//   A hook pays two thread-local updates and, at the outermost, a
//   thread-local load on entry and two on exit: the thread's `slow` bits
//   say when more is
//   needed (not registered yet, the process cancels, a cancellation to
//   deliver), set by whoever changes that.
#pragma once

#include <pthread.h>

#include <atomic>

#include "core/hot_tls.hpp"

namespace gpupool {

namespace detail {
struct HookThread {
  // Why the outermost entry or exit takes the slow path (any bit set).
  static constexpr unsigned char kUnregistered = 1;  // not in pthread_cancel's list
  static constexpr unsigned char kCancels = 2;       // the program cancels: hold it off
  static constexpr unsigned char kDeferred = 4;      // a cancellation to deliver on leaving
  std::atomic<unsigned> depth{0};                    // nested entry points; read by pthread_cancel
  std::atomic<unsigned char> slow{kUnregistered};
  bool registered = false;  // in the list pthread_cancel reads (under its lock)
  bool guarded = false;     // cancellation held off by this scope
  int old_state = 0;        // the program's cancel state, given back at the exit
  pthread_t self{};
  HookThread* next = nullptr;  // the list, under its lock
};
// constinit: no initialization check on every access (a call, otherwise).
extern constinit GPUPOOL_HOT_TLS HookThread t_hook;
extern std::atomic<bool> g_cancels_seen;  // the program cancelled a thread once

void enter_outermost(HookThread& t) noexcept;   // registration, cancellation held off
void leave_outermost(HookThread& t) noexcept;   // the program's state back, out, then as below
void deliver_deferred(HookThread& t) noexcept;  // a cancellation that came while inside
}  // namespace detail

// True while this thread is inside one of gpupool's entry points.
inline bool inside_hook() { return detail::t_hook.depth.load(std::memory_order_relaxed) != 0; }

class HookScope {
 public:
  // The count goes up before anything inside and down after everything
  // (the fences: a compiler barrier only, a handler on this thread sees the
  // thread's own order; pthread_cancel's side is a membarrier).
  [[gnu::always_inline]] HookScope() noexcept {
    detail::HookThread& t = detail::t_hook;
    const unsigned d = t.depth.load(std::memory_order_relaxed);
    t.depth.store(d + 1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (d == 0 && t.slow.load(std::memory_order_relaxed)) detail::enter_outermost(t);
  }
  // A thread that must give back its cancel state does so while still in
  // (a signal handler's hook meanwhile is nested, and leaves the state
  // alone); then out, then the check for a cancellation that came while
  // inside (pthread_cancel: mark, membarrier, look).
  [[gnu::always_inline]] ~HookScope() {
    detail::HookThread& t = detail::t_hook;
    const unsigned d = t.depth.load(std::memory_order_relaxed);
    if (d == 1 && t.slow.load(std::memory_order_relaxed)) {
      detail::leave_outermost(t);
      return;
    }
    std::atomic_signal_fence(std::memory_order_seq_cst);
    t.depth.store(d - 1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (d == 1 && t.slow.load(std::memory_order_relaxed)) detail::deliver_deferred(t);
  }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
};

}  // namespace gpupool
