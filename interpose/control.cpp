// Signals, the control thread, dumps and the control socket.
//
// Signal handlers only bump an atomic counter per action and write one byte
// to a non-blocking self-pipe (both async-signal-safe, no lock), so a signal
// landing inside an allocation cannot deadlock. The control thread, which
// blocks every signal, wakes on the pipe, takes each counter and does the
// work. Counters are taken after draining the pipe, and set before writing to
// it, so a request is never lost, only coalesced with one pending.
#include "interpose/control.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "config/log.hpp"
#include "interpose/control_socket.hpp"
#include "interpose/runtime.hpp"
#include "interpose/stats_output.hpp"
#include "interpose/trace.hpp"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace gpupool::control {
namespace {

enum Action : unsigned { kStats = 0, kFreeHeld = 1, kStopHolding = 2, kActions = 3 };
const char* const kActionNames[kActions] = {"stats", "free_held", "stop_holding"};
const char* const kLauncherVerbs[kActions] = {"stats", "free-held", "stop-holding"};

// One installed signal (several actions may share one).
struct Slot {
  int signo = 0;
  unsigned actions = 0;  // bit per Action
  struct sigaction old{};
  std::atomic<bool> old_ready{false};  // `old` written: safe to chain
  std::atomic<bool> installed{false};  // our handler is the current one
};

// Read by the signal handler: plain globals with constant initialization.
Slot g_slots[kActions];
std::atomic<int> g_nslots{0};
std::atomic<int> g_wake_wr{-1};
std::atomic<unsigned> g_pending[kActions];

// Everything else; allocated at start and never destroyed, since the control
// thread and hooks may run while the process exits.
struct State {
  Runtime* rt = nullptr;
  int wake_rd = -1;
  int listen_fd = -1;
  trace::Tracer* tracer = nullptr;
  std::atomic<bool> exiting{false};
  std::atomic<bool> thread_running{false};
  // Serializes dumps and pool actions between the control thread, the
  // at-exit dump and the C API.
  std::mutex work_mu;
  std::mutex warn_mu;
  std::vector<std::string> warnings;
  std::string stats_path;  // %p expanded
  std::string prometheus_path;
};
State* g_state = nullptr;

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

double unix_time() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

void on_signal(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  const int n = g_nslots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    if (s.signo != sig) continue;
    for (unsigned a = 0; a < kActions; ++a)
      if (s.actions & (1u << a)) g_pending[a].fetch_add(1, std::memory_order_release);
    const int fd = g_wake_wr.load(std::memory_order_acquire);
    if (fd >= 0) {
      const char byte = 1;
      // EAGAIN: the pipe is full, so the control thread is due to wake anyway.
      ssize_t ignored = ::write(fd, &byte, 1);
      (void)ignored;
    }
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

void add_warning(const std::string& w) {
  log().warn("{}", w);
  std::lock_guard lock(g_state->warn_mu);
  g_state->warnings.push_back(w);
}

void install_handlers(const config::Config& cfg) {
  const int wanted[kActions] = {cfg.signal_stats, cfg.signal_free_held, cfg.signal_stop_holding};
  int n = 0;
  for (unsigned a = 0; a < kActions; ++a) {
    const int sig = wanted[a];
    if (sig <= 0) continue;
    if (sig == SIGKILL || sig == SIGSTOP || sig >= NSIG) {
      add_warning("cannot use " + stats::signal_name(sig) + " for " + kActionNames[a]);
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
    struct sigaction sa{};
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    struct sigaction old{};
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
    struct sigaction cur{};
    if (sigaction(s.signo, nullptr, &cur) != 0) continue;
    const bool ours = (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_signal;
    const bool was = s.installed.exchange(ours, std::memory_order_acq_rel);
    if (was == ours) continue;
    std::string what;
    for (unsigned a = 0; a < kActions; ++a)
      if (s.actions & (1u << a)) {
        if (!what.empty()) what += ", ";
        what += std::string(kActionNames[a]) + " (use `gpupool " + kLauncherVerbs[a] + " PID`)";
      }
    if (!ours)
      add_warning("the program replaced gpupool's " + stats::signal_name(s.signo) +
                  " handler; signal-driven " + what + " no longer works");
    else
      log().info("gpupool's {} handler is back in place", stats::signal_name(s.signo));
  }
}

// Callers hold work_mu.
bool dump_locked(Runtime& rt, const char* reason) {
  State& st = *g_state;
  const stats::Report r = report(rt, reason);
  std::string text = rt.config.stats_format == config::StatsFormat::json
                         ? stats::to_json(r) + "\n"
                         : stats::to_text(r);
  std::string why;
  bool ok = stats::append_dump(st.stats_path, text, &why);
  if (!ok) log().error("stats dump not written: {}", why);
  if (!st.prometheus_path.empty() &&
      !stats::replace_file(st.prometheus_path, stats::to_prometheus(r), &why))
    log().error("Prometheus file not written: {}", why);
  return ok;
}

void write_prometheus(Runtime& rt) {
  State& st = *g_state;
  if (st.prometheus_path.empty()) return;
  std::string why;
  if (!stats::replace_file(st.prometheus_path, stats::to_prometheus(report(rt, "interval")), &why))
    log().error("Prometheus file not written: {}", why);
}

std::string held_summary(const Stats& before, const Stats& after) {
  return "released " + std::to_string(before.held_blocks - std::min(before.held_blocks, after.held_blocks)) +
         " held blocks (" +
         stats::human_bytes(before.held_bytes - std::min(before.held_bytes, after.held_bytes)) +
         "); now held: " + std::to_string(after.held_blocks) + " blocks, " +
         stats::human_bytes(after.held_bytes) + "\n";
}

std::string handle_request(Runtime& rt, std::string req) {
  while (!req.empty() && (req.back() == '\n' || req.back() == '\r' || req.back() == ' ')) req.pop_back();
  if (req == "ping") return "ok\n";
  if (req == "stats") return "ok\n" + render(rt, false, "request");
  if (req == "stats json") return "ok\n" + render(rt, true, "request");
  if (req == "free-held" || req == "stop-holding") {
    const Stats before = rt.pool.totals();
    const bool ok = req == "free-held" ? free_held(rt) : stop_holding(rt);
    if (!ok) return "error exiting the process is exiting\n";
    return "ok\n" + held_summary(before, rt.pool.totals()) +
           (req == "stop-holding" ? "holding stopped: freed blocks are now released at once\n" : "");
  }
  return "error bad-request unknown command '" + req.substr(0, 64) + "'\n";
}

void serve_client(Runtime& rt, int lfd) {
  const int c = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return;
  timeval tv{1, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  // The request is read before anything is answered, refusals included:
  // closing with unread data would reset the connection before the client
  // reads the refusal.
  std::string req;
  char buf[256];
  while (req.size() < 512 && req.find('\n') == std::string::npos) {
    ssize_t n = ::recv(c, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    req.append(buf, static_cast<std::size_t>(n));
  }
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
    stats::write_all(c,
                     "error denied gpupool answers only its own user (uid " +
                         std::to_string(geteuid()) + ")\n",
                     /*socket=*/true);
    log().info("control socket: refused a request from uid {}", cred.uid);
    ::close(c);
    return;
  }
  if (!req.empty()) {
    req = req.substr(0, req.find('\n'));
    log().debug("control socket: '{}' from pid {}", req, cred.pid);
    stats::write_all(c, handle_request(rt, req), /*socket=*/true);
  }
  ::close(c);
}

int open_listen_socket() {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  sockaddr_un addr;
  const socklen_t len = socket_address(&addr, geteuid(), static_cast<long>(getpid()));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(fd, 16) != 0) {
    add_warning(std::string("control socket unavailable (") + strerror(errno) +
                "): `gpupool stats PID` cannot reach this process; signals still work");
    ::close(fd);
    return -1;
  }
  return fd;
}

void* control_thread(void* arg) {
  Runtime& rt = *static_cast<Runtime*>(arg);
  State& st = *g_state;
  const config::Config& cfg = rt.config;

  const std::uint64_t interval = cfg.stats_interval_ns;
  const std::uint64_t release_after = rt.pool.release_after_ns();
  const std::uint64_t trim_period =
      release_after ? std::clamp<std::uint64_t>(release_after / 4, 10'000'000, 1'000'000'000) : 0;
  // Without an interval, the Prometheus file is still kept fresh.
  const std::uint64_t prom_period =
      st.prometheus_path.empty() ? 0 : (interval ? 0 : 5'000'000'000ull);
  constexpr std::uint64_t kFlushPeriod = 100'000'000;   // trace buffers
  constexpr std::uint64_t kCheckPeriod = 1'000'000'000;  // handler replaced?

  std::uint64_t now = mono_ns();
  std::uint64_t next_interval = interval ? now + interval : UINT64_MAX;
  std::uint64_t next_trim = trim_period ? now + trim_period : UINT64_MAX;
  std::uint64_t next_prom = prom_period ? now : UINT64_MAX;
  std::uint64_t next_flush = st.tracer ? now + kFlushPeriod : UINT64_MAX;
  std::uint64_t next_check = now + kCheckPeriod;

  for (;;) {
    now = mono_ns();
    const std::uint64_t next = std::min({next_interval, next_trim, next_prom, next_flush, next_check});
    const int timeout_ms = next <= now ? 0 : static_cast<int>(std::min<std::uint64_t>((next - now) / 1'000'000 + 1, 60'000));
    pollfd fds[2] = {{st.wake_rd, POLLIN, 0}, {st.listen_fd, POLLIN, 0}};
    const int nfds = st.listen_fd >= 0 ? 2 : 1;
    const int r = ::poll(fds, nfds, timeout_ms);
    // Exit began: the at-exit handler owns the last dump; touch nothing that
    // static destructors may be tearing down.
    if (st.exiting.load(std::memory_order_acquire)) break;
    if (r < 0 && errno != EINTR) break;
    if (r > 0 && (fds[0].revents & POLLIN)) {
      char buf[256];
      while (::read(st.wake_rd, buf, sizeof buf) > 0) {
      }
    }
    unsigned taken[kActions];
    for (unsigned a = 0; a < kActions; ++a)
      taken[a] = g_pending[a].exchange(0, std::memory_order_acquire);
    // Release first, so that "USR2 then USR1" coalesced into one wake-up
    // still shows the released memory in the dump.
    if (taken[kStopHolding]) {
      log().info("stop_holding requested by signal");
      stop_holding(rt);
    }
    if (taken[kFreeHeld]) {
      log().info("free_held requested by signal");
      free_held(rt);
    }
    if (taken[kStats]) dump(rt, "signal");
    if (r > 0 && nfds == 2 && (fds[1].revents & POLLIN)) serve_client(rt, st.listen_fd);

    now = mono_ns();
    if (now >= next_interval) {
      dump(rt, "interval");
      next_interval = now + interval;
    }
    if (now >= next_trim) {
      std::lock_guard lock(st.work_mu);
      if (!st.exiting.load()) {
        if (std::size_t n = rt.pool.trim_idle(rt.pool.now()))
          log().debug("released {} blocks held longer than GPUPOOL_RELEASE_AFTER", n);
      }
      next_trim = now + trim_period;
    }
    if (now >= next_prom) {
      write_prometheus(rt);
      next_prom = now + prom_period;
    }
    if (now >= next_flush) {
      st.tracer->flush();
      next_flush = now + kFlushPeriod;
    }
    if (now >= next_check) {
      check_handlers();
      next_check = now + kCheckPeriod;
    }
  }
  st.thread_running.store(false);
  return nullptr;
}

void at_exit() {
  State& st = *g_state;
  if (!st.rt) return;
  st.exiting.store(true, std::memory_order_release);
  {
    const int fd = g_wake_wr.load();
    const char byte = 1;
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, &byte, 1);
      (void)ignored;
    }
  }
  // Waits for a dump or action in progress on the control thread; after
  // that the control thread does nothing more (it checks `exiting`).
  std::lock_guard lock(st.work_mu);
  if (st.tracer) st.tracer->flush();
  // Stats come from the pool's own counters: no driver call here.
  if (st.rt->config.stats_at_exit) dump_locked(*st.rt, "exit");
  else write_prometheus(*st.rt);
}

// A forked child shares the parent's pipe and socket but has no control
// thread: close them there, so the child's signals never make the parent
// act and requests to the parent's pid are never held by the child. The
// child keeps the C API.
void at_fork_child() {
  State& st = *g_state;
  const int wr = g_wake_wr.exchange(-1);
  if (wr >= 0) ::close(wr);
  if (st.wake_rd >= 0) ::close(st.wake_rd);
  st.wake_rd = -1;
  if (st.listen_fd >= 0) ::close(st.listen_fd);
  st.listen_fd = -1;
  st.thread_running.store(false);
}

}  // namespace

stats::Report report(Runtime& rt, const char* reason) {
  if (g_state) check_handlers();
  stats::Report r;
  r.version = GPUPOOL_VERSION;
  r.pid = static_cast<long>(getpid());
  r.time = unix_time();
  r.reason = reason;
  r.holding = rt.pool.holding();
  r.backends = rt.pool.snapshot(8);
  // Totals from the same snapshot, so they always equal the sum of the rows.
  for (const auto& b : r.backends) r.totals += b.stats;
  const config::Config& cfg = rt.config;
  const int sigs[kActions] = {cfg.signal_stats, cfg.signal_free_held, cfg.signal_stop_holding};
  const int n = g_nslots.load(std::memory_order_acquire);
  for (unsigned a = 0; a < kActions; ++a) {
    stats::SignalInfo si;
    si.action = kActionNames[a];
    si.signo = sigs[a];
    for (int i = 0; i < n; ++i)
      if (g_slots[i].signo == sigs[a]) si.installed = g_slots[i].installed.load();
    r.signals.push_back(si);
  }
  if (g_state) {
    std::lock_guard lock(g_state->warn_mu);
    r.warnings = g_state->warnings;
  }
  return r;
}

std::string render(Runtime& rt, bool json, const char* reason) {
  const stats::Report r = report(rt, reason);
  return json ? stats::to_json(r) + "\n" : stats::to_text(r);
}

bool dump(Runtime& rt, const char* reason) {
  if (!g_state) return false;
  std::lock_guard lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) && std::string(reason) != "exit") return false;
  return dump_locked(rt, reason);
}

bool free_held(Runtime& rt) {
  if (!g_state) {
    rt.pool.free_held();
    return true;
  }
  std::lock_guard lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) || exiting()) return false;
  rt.pool.free_held();
  return true;
}

bool stop_holding(Runtime& rt) {
  if (!g_state) {
    rt.pool.stop_holding();
    return true;
  }
  std::lock_guard lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) || exiting()) return false;
  rt.pool.stop_holding();
  return true;
}

void start(Runtime& rt) {
  if (g_state) return;
  auto* st = new State;
  st->rt = &rt;
  g_state = st;
  const config::Config& cfg = rt.config;
  const long pid = static_cast<long>(getpid());
  if (!cfg.stats_file.empty()) st->stats_path = stats::expand_path(cfg.stats_file, pid);
  if (!cfg.prometheus_file.empty()) st->prometheus_path = stats::expand_path(cfg.prometheus_file, pid);
  if (!cfg.trace_file.empty()) {
    std::string why;
    st->tracer = trace::Tracer::open(stats::expand_path(cfg.trace_file, pid), &why);
    if (st->tracer) rt.pool.set_observer(st->tracer);
    else add_warning("trace disabled: " + why);
  }

  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    add_warning(std::string("control thread not started (pipe: ") + strerror(errno) + ")");
    std::atexit(at_exit);
    return;
  }
  st->wake_rd = p[0];
  g_wake_wr.store(p[1], std::memory_order_release);

  std::atexit(at_exit);
  pthread_atfork(nullptr, nullptr, at_fork_child);
  install_handlers(cfg);
  // Bound before the first intercepted call returns: from then on `gpupool
  // stats PID` reaches the process (queued until the thread runs).
  st->listen_fd = open_listen_socket();

  // The thread inherits a full signal mask: program signals always land on
  // program threads, whose handlers only poke the pipe.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t tid;
  st->thread_running.store(true);
  const int err = pthread_create(&tid, &attr, control_thread, &rt);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (err != 0) {
    st->thread_running.store(false);
    add_warning(std::string("control thread not started: ") + strerror(err));
    return;
  }
#ifdef __GLIBC__
  pthread_setname_np(tid, "gpupool-ctl");
#endif
}

}  // namespace gpupool::control
