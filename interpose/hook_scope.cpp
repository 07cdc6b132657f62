// Entry points and thread cancellation (hook_scope.hpp).
#include "interpose/hook_scope.hpp"

#include <dlfcn.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <new>

#include "core/no_destructor.hpp"
#include "interpose/runtime.hpp"

extern "C"
    __attribute__((visibility("hidden"))) int gpupool_hook_pthread_cancel(pthread_t) noexcept;

namespace gpupool {

constinit GPUPOOL_HOT_TLS detail::HookThread detail::t_hook;
std::atomic<bool> detail::g_cancels_seen{false};

namespace {

using CancelFn = int (*)(pthread_t);

// The threads that ever entered gpupool, for pthread_cancel to look at.
// Never destroyed: threads leave while the process exits.
struct Threads {
  std::mutex mu;
  detail::HookThread* head = nullptr;
  pthread_key_t key{};
};
Threads& threads() {
  static NoDestructor<Threads> t;
  return *t;
}

CancelFn next_cancel() {
  static std::atomic<CancelFn> next{nullptr};
  CancelFn f = next.load(std::memory_order_acquire);
  if (!f) {
    f = reinterpret_cast<CancelFn>(dlsym(RTLD_NEXT, "pthread_cancel"));
    next.store(f, std::memory_order_release);
  }
  return f;
}

void unregister(void* p) {
  auto* t = static_cast<detail::HookThread*>(p);
  Threads& all = threads();
  std::lock_guard lock(all.mu);
  for (detail::HookThread** x = &all.head; *x; x = &(*x)->next)
    if (*x == t) {
      *x = t->next;
      break;
    }
  t->registered = false;
  t->slow.fetch_or(detail::HookThread::kUnregistered, std::memory_order_relaxed);
}

// The child has this thread only; its list and lock start anew (no lock is
// taken around fork: a signal handler may fork from inside a registration).
void threads_fork_child() {
  Threads& all = threads();
  new (&all.mu) std::mutex;
  detail::HookThread& t = detail::t_hook;
  t.next = nullptr;
  t.self = pthread_self();
  all.head = t.registered ? &t : nullptr;
}

void register_thread(detail::HookThread& t) {
  Threads& all = threads();
  static const bool once = [] {
    pthread_key_create(&threads().key, unregister);
    pthread_atfork(nullptr, nullptr, threads_fork_child);
    // gpupool's pthread_cancel is the program's only when the library came
    // first in the symbol order (preloaded): otherwise cancellations are
    // unseen, and every hook holds them off.
    if (dlsym(RTLD_DEFAULT, "pthread_cancel") !=
        reinterpret_cast<void*>(&gpupool_hook_pthread_cancel))
      detail::g_cancels_seen.store(true, std::memory_order_relaxed);
    return true;
  }();
  (void)once;
  std::lock_guard lock(all.mu);
  t.self = pthread_self();
  t.next = all.head;
  all.head = &t;
  t.registered = true;
  t.slow.fetch_and(static_cast<unsigned char>(~detail::HookThread::kUnregistered),
                   std::memory_order_relaxed);
  // Under the lock pthread_cancel marks the listed threads under.
  if (detail::g_cancels_seen.load(std::memory_order_relaxed))
    t.slow.fetch_or(detail::HookThread::kCancels, std::memory_order_relaxed);
  pthread_setspecific(all.key, &t);
}

// The heavy side of the pairing with HookScope's compiler barriers: every
// thread of the process passes a full barrier before it returns.
void barrier_all_threads() {
  static const bool registered =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
  if (registered && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) return;
  syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0);  // older kernels: slower, as good
}

}  // namespace

void detail::enter_outermost(HookThread& t) noexcept {
  if (t.slow.load(std::memory_order_relaxed) & HookThread::kUnregistered) register_thread(t);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  if (t.slow.load(std::memory_order_relaxed) & HookThread::kCancels) {
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &t.old_state);
    t.guarded = true;
  }
}

// The state given back while still in: a signal handler's hook meanwhile
// is nested (depth 2), so it neither saves nor restores the state.
void detail::leave_outermost(HookThread& t) noexcept {
  if (t.guarded) {
    t.guarded = false;
    pthread_setcancelstate(t.old_state, nullptr);
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t.depth.store(0, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  deliver_deferred(t);
}

void detail::deliver_deferred(HookThread& t) noexcept {
  // Set, not acted on: the next cancellation point is the program's.
  if (t.slow.fetch_and(static_cast<unsigned char>(~HookThread::kDeferred),
                       std::memory_order_relaxed) &
      HookThread::kDeferred)
    if (CancelFn next = next_cancel()) next(pthread_self());
}

}  // namespace gpupool

// A cancellation of a thread inside a hook that does not hold it off yet
// (entered before the first cancellation) waits until the thread leaves;
// every hook entered after it holds cancellation off.
extern "C" int gpupool_hook_pthread_cancel(pthread_t thread) noexcept {
  using namespace gpupool;
  CancelFn next = next_cancel();
  if (!next) return ESRCH;
  const bool first = !detail::g_cancels_seen.exchange(true, std::memory_order_relaxed);
  Threads& all = threads();
  std::lock_guard lock(all.mu);
  // From now on every hook holds cancellation off: each listed thread is
  // marked here, one that registers later at its registration.
  if (first)
    for (detail::HookThread* x = all.head; x; x = x->next)
      x->slow.fetch_or(detail::HookThread::kCancels, std::memory_order_relaxed);
  detail::HookThread* t = all.head;
  while (t && !pthread_equal(t->self, thread)) t = t->next;
  // Never registered: it registers after this lock, and then sees the mark.
  if (!t) return next(thread);
  constexpr auto kDeferred = detail::HookThread::kDeferred;
  t->slow.fetch_or(kDeferred, std::memory_order_relaxed);
  barrier_all_threads();
  // Inside: it delivers the cancellation itself as it leaves.
  if (t->depth.load(std::memory_order_relaxed) != 0) return 0;
  return t->slow.fetch_and(static_cast<unsigned char>(~kDeferred), std::memory_order_relaxed) &
                 kDeferred
             ? next(thread)
             : 0;
}

// Exported as an alias, so that the address compared above is gpupool's own.
extern "C" decltype(gpupool_hook_pthread_cancel) gpupool_export_pthread_cancel __asm__(
    "pthread_cancel") __attribute__((visibility("default"), alias("gpupool_hook_pthread_cancel")));
