// Signal handlers only bump an atomic counter per action and then the wake
// word, and wake the control thread waiting on it with a futex (both
// async-signal-safe, no lock, no descriptor), so a signal landing inside an
// allocation cannot deadlock, and the program, which may close any
// descriptor, cannot cut the channel. The control thread, which blocks every
// signal, wakes, takes each counter and does the work. Counters are taken
// after the wake word is read, and set before it is bumped, so a request is
// never lost, only coalesced with one pending.
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "interpose/control/internal.hpp"
#include "sys/log.hpp"

namespace gpupool::control {
namespace {

// One installed signal (several actions may share one).
struct Slot {
  int signo = 0;
  unsigned actions = 0;  // bit per Action
  struct sigaction old {};
  std::atomic<bool> old_ready{false};  // `old` written: safe to chain
  std::atomic<bool> installed{false};  // our handler is the current one
};

// Read by the signal handler: plain globals with constant initialization.
Slot g_slots[kActions];
std::atomic<int> g_nslots{0};
// Bumped by every poke; the control thread sleeps while it is unchanged.
std::atomic<std::uint32_t> g_wake{0};
static_assert(sizeof g_wake == sizeof(std::uint32_t) &&
              std::atomic<std::uint32_t>::is_always_lock_free);
std::atomic<unsigned> g_pending[kActions];

void on_signal(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  const int n = g_nslots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    if (s.signo != sig) continue;
    for (unsigned a = 0; a < kActions; ++a)
      if (s.actions & (1u << a)) g_pending[a].fetch_add(1, std::memory_order_release);
    poke();
    // Chain the program's earlier handler (not SIG_DFL: for USR1/USR2 that
    // would kill the program, which is what installing ours prevents).
    if (s.old_ready.load(std::memory_order_acquire)) {
      if (s.old.sa_flags & SA_SIGINFO) {
        if (s.old.sa_sigaction) s.old.sa_sigaction(sig, info, uctx);
      } else if (s.old.sa_handler != SIG_DFL && s.old.sa_handler != SIG_IGN) {
        s.old.sa_handler(sig);
      }
    }
    break;
  }
  errno = saved_errno;
}

}  // namespace

// Wakes the control thread. Async-signal-safe.
void poke() {
  g_wake.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&g_wake), FUTEX_WAKE_PRIVATE, INT_MAX,
          nullptr, nullptr, 0);
}

std::uint32_t pokes_seen() { return g_wake.load(std::memory_order_acquire); }

void wait_for_poke(std::uint32_t seen, std::uint64_t timeout_ns) {
  const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000),
                    static_cast<long>(timeout_ns % 1'000'000'000)};
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&g_wake), FUTEX_WAIT_PRIVATE, seen, &ts,
          nullptr, 0);
}

unsigned take_requests(Action action) {
  return g_pending[action].exchange(0, std::memory_order_acquire);
}

bool handler_installed(int signo) {
  const int n = g_nslots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (g_slots[i].signo == signo) return g_slots[i].installed.load();
  return false;
}

void install_handlers(const config::Config& cfg) {
  int n = 0;
  for (unsigned a = 0; a < kActions; ++a) {
    const int sig = cfg.*kActionInfo[a].signal;
    if (sig <= 0) continue;
    if (sig == SIGKILL || sig == SIGSTOP || sig >= NSIG) {
      add_warning("cannot use " + stats::signal_name(sig) + " for " + kActionInfo[a].name);
      continue;
    }
    int i = 0;
    while (i < n && g_slots[i].signo != sig) ++i;
    if (i == n) {
      g_slots[n].signo = sig;
      ++n;
    }
    g_slots[i].actions |= 1u << a;
  }
  g_nslots.store(n, std::memory_order_release);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    struct sigaction old {};
    if (sigaction(s.signo, &sa, &old) != 0) {
      add_warning("cannot install a handler for " + stats::signal_name(s.signo) + ": " +
                  strerror(errno));
      continue;
    }
    const bool has_handler = (old.sa_flags & SA_SIGINFO)
                                 ? old.sa_sigaction != nullptr
                                 : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    // A one-shot (SA_RESETHAND) handler is a "fatal signal" cleanup that
    // re-raises to terminate (LLVM, loaded by PoCL, puts one on SIGUSR2):
    // chaining it would turn every free_held request into a kill.
    if (has_handler && (old.sa_flags & SA_RESETHAND)) {
      log().info("{}: not chaining the earlier one-shot handler, which would terminate the program",
                 stats::signal_name(s.signo));
    } else {
      s.old = old;
      s.old_ready.store(true, std::memory_order_release);
    }
    s.installed.store(true, std::memory_order_release);
    log().debug("{} handler installed{}", stats::signal_name(s.signo),
                has_handler && s.old_ready.load() ? " (chaining the program's handler)" : "");
  }
}

// The program may install its own handler after ours: say so once per
// change instead of silently ignoring the signal.
void check_handlers() {
  const int n = g_nslots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    struct sigaction cur {};
    if (sigaction(s.signo, nullptr, &cur) != 0) continue;
    const bool ours = (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal;
    const bool was = s.installed.exchange(ours, std::memory_order_acq_rel);
    if (was == ours) continue;
    std::string what;
    for (unsigned a = 0; a < kActions; ++a)
      if (s.actions & (1u << a)) {
        if (!what.empty()) what += ", ";
        what +=
            std::string(kActionInfo[a].name) + " (use `gpupool " + kActionInfo[a].verb + " PID`)";
      }
    if (!ours)
      add_warning("the program replaced gpupool's " + stats::signal_name(s.signo) +
                  " handler; signal-driven " + what + " no longer works");
    else log().info("gpupool's {} handler is back in place", stats::signal_name(s.signo));
  }
}

}  // namespace gpupool::control
