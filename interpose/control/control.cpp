// Signals, the control thread, dumps and the control socket.
//
// Signal handlers only bump an atomic counter per action and send one byte
// on a non-blocking socket pair (both async-signal-safe, no lock), so a
// signal landing inside an allocation cannot deadlock. The control thread,
// which blocks every signal, wakes on it, takes each counter and does the
// work. Counters are taken after draining the channel, and set before
// writing to it, so a request is never lost, only coalesced with one
// pending.
//
// The program may close any descriptor, gpupool's included, and reuse the
// number (config/io.hpp): every descriptor here is checked before each use,
// and one found closed or replaced is forgotten and built anew (a bounded
// number of times; then the control thread still serves signals, once a
// second). The control thread never waits for one client: requests and
// answers are non-blocking, with deadlines, and other users are refused as
// they connect, before anything is read.
#include "interpose/control/control.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "config/io.hpp"
#include "config/log.hpp"
#include "interpose/control/socket.hpp"
#include "interpose/runtime.hpp"
#include "interpose/control/trace.hpp"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace gpupool::control {
namespace {

enum Action : unsigned { kStats = 0, kFreeHeld = 1, kStopHolding = 2, kActions = 3 };
const char* const kActionNames[kActions] = {"stats", "free_held", "stop_holding"};
const char* const kLauncherVerbs[kActions] = {"stats", "free-held", "stop-holding"};

constexpr std::uint64_t kMs = 1'000'000;
constexpr std::uint64_t kRequestTimeoutNs = 2'000 * kMs;  // a client's whole request line
constexpr std::size_t kMaxClients = 8;     // past this, the oldest client is dropped
constexpr std::size_t kMaxRequest = 512;
constexpr int kMaxRebuilds = 16;           // per descriptor kind and process

// One installed signal (several actions may share one).
struct Slot {
  int signo = 0;
  unsigned actions = 0;  // bit per Action
  struct sigaction old{};
  std::atomic<bool> old_ready{false};  // `old` written: safe to chain
  std::atomic<bool> installed{false};  // our handler is the current one
};

// The wake channel's write end as the signal handler sees it: immutable once
// published, never freed (a handler may be reading an old one).
struct Wake {
  int fd;
  io::FileId id;
};

// Read by the signal handler: plain globals with constant initialization.
Slot g_slots[kActions];
std::atomic<int> g_nslots{0};
std::atomic<const Wake*> g_wake{nullptr};
std::atomic<unsigned> g_pending[kActions];

// One connection to the control socket.
struct Client {
  io::OwnedFd fd;
  std::string in;   // the request so far
  std::string out;  // the answer, once the request is in
  std::size_t sent = 0;
  std::uint64_t deadline = 0;
  bool answering = false;
};

// Everything else; allocated at start and never destroyed, since the control
// thread and hooks may run while the process exits.
struct State {
  Runtime* rt = nullptr;
  // The control thread's (and start's, restart's and the fork child's).
  io::OwnedFd wake_rd, wake_wr;
  io::OwnedFd listen;
  std::string socket_name;
  std::vector<Client> clients;
  int wake_builds = 0, listen_builds = 0;

  trace::Tracer* tracer = nullptr;
  std::atomic<bool> exiting{false};
  std::atomic<bool> thread_running{false};
  // Serializes dumps and pool actions between the control thread, the
  // at-exit dump and the C API. The exit handler waits for it a bounded
  // time (try_lock, polled: timed locks escape ThreadSanitizer).
  std::mutex work_mu;
  std::mutex warn_mu;
  std::vector<std::string> warnings;
  std::string stats_path;       // %p expanded
  std::string prometheus_path;  // %p expanded; empty: none
  std::atomic<std::uint64_t> dumps_dropped{0};
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

// Wakes the control thread. Async-signal-safe. A channel the program closed
// or replaced is not written to: the control thread notices within a second.
void poke() {
  const Wake* w = g_wake.load(std::memory_order_acquire);
  if (!w || io::id_of(w->fd) != w->id) return;
  const char byte = 1;
  // EAGAIN: the channel is full, so the control thread is due to wake anyway.
  ssize_t ignored = ::send(w->fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)ignored;
}

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

// ---- descriptors ---------------------------------------------------------

// A new wake channel, published to the signal handler.
void build_wake(State& st) {
  g_wake.store(nullptr, std::memory_order_release);
  st.wake_rd.forget();
  st.wake_wr.forget();
  if (st.wake_builds >= kMaxRebuilds) return;
  ++st.wake_builds;
  int p[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, p) != 0) {
    add_warning(std::string("control channel unavailable (socketpair: ") + strerror(errno) +
                "); signals are served once a second");
    return;
  }
  st.wake_rd = io::OwnedFd::adopt(p[0]);
  st.wake_wr = io::OwnedFd::adopt(p[1]);
  if (!st.wake_rd.valid() || !st.wake_wr.valid()) {
    st.wake_rd.close();
    st.wake_wr.close();
    return;
  }
  g_wake.store(new Wake{st.wake_wr.get(), st.wake_wr.id()}, std::memory_order_release);
}

// The control socket, under the usual name or, when another process holds
// that, under a random one (control_socket.hpp).
void build_listen(State& st) {
  st.listen.forget();
  if (st.listen_builds >= kMaxRebuilds) return;
  ++st.listen_builds;
  io::OwnedFd fd = io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return;
  const unsigned uid = geteuid();
  const long pid = static_cast<long>(getpid());
  std::string name = socket_name(uid, pid);
  sockaddr_un addr;
  socklen_t len = socket_address(&addr, name);
  int r = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len);
  if (r != 0 && errno == EADDRINUSE) {
    unsigned char rnd[8] = {};
    if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof rnd)) {
      const std::uint64_t t = mono_ns() ^ (std::uint64_t(pid) << 32);
      std::memcpy(rnd, &t, sizeof rnd);
    }
    char hex[17];
    for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    log().info("control socket: @{} is taken by another process; using @{}.{}", name, name, hex);
    name = socket_name(uid, pid, hex);
    len = socket_address(&addr, name);
    r = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len);
  }
  if (r != 0 || ::listen(fd.get(), 64) != 0) {
    add_warning(std::string("control socket unavailable (") + strerror(errno) +
                "): `gpupool stats PID` cannot reach this process; signals still work");
    return;
  }
  st.socket_name = name;
  st.listen = std::move(fd);
}

// Every descriptor still the one gpupool opened; lost ones are forgotten
// (never closed: the number is the program's now) and built anew.
void check_descriptors(State& st) {
  if (st.wake_rd.valid() && (!st.wake_rd.ours() || !st.wake_wr.ours())) {
    // One end closed under us: the other is no use alone.
    st.wake_rd.close();
    st.wake_wr.close();
    log().info("the program closed gpupool's control channel; {}",
               st.wake_builds < kMaxRebuilds ? "opening a new one" : "serving signals once a second");
    build_wake(st);
  }
  if (st.listen.valid() && !st.listen.ours()) {
    log().info("the program closed gpupool's control socket; {}",
               st.listen_builds < kMaxRebuilds ? "opening a new one" : "it stays closed");
    build_listen(st);
  }
  std::erase_if(st.clients, [](Client& c) {
    if (c.fd.ours()) return false;
    c.fd.forget();
    return true;
  });
}

// ---- dumps ---------------------------------------------------------------

// Append one dump to the stats file, or write it to stderr. One write per
// dump: with O_APPEND, dumps of processes sharing a file do not interleave.
bool append_dump(const std::string& path, const std::string& data, std::string* why) {
  if (path.empty()) {
    if (!io::write_bounded(STDERR_FILENO, data)) {
      *why = "stderr does not take it (closed, or nobody reads it)";
      return false;
    }
    return true;
  }
  io::OwnedFd fd = io::open_output(path, /*append=*/true, why);
  if (!fd.valid()) return false;
  const bool ok = io::write_bounded(fd.get(), data);
  if (!ok) *why = "cannot write " + path + ": " + strerror(errno);
  return ok;
}

// Callers hold work_mu.
bool dump_locked(Runtime& rt, const char* reason) {
  State& st = *g_state;
  const stats::Report r = report(rt, reason);
  std::string text = rt.config.stats_format == config::StatsFormat::json
                         ? stats::to_json(r) + "\n"
                         : stats::to_text(r);
  std::string why;
  const bool ok = append_dump(st.stats_path, text, &why);
  if (!ok && st.dumps_dropped.fetch_add(1, std::memory_order_relaxed) == 0)
    log().error("stats dump not written: {} (later ones that fail are counted in the warnings)", why);
  if (!st.prometheus_path.empty() &&
      !io::replace_file(st.prometheus_path, stats::to_prometheus(r), &why))
    log().error("Prometheus file not written: {}", why);
  return ok;
}

void write_prometheus(Runtime& rt) {
  State& st = *g_state;
  if (st.prometheus_path.empty()) return;
  std::string why;
  if (!io::replace_file(st.prometheus_path, stats::to_prometheus(report(rt, "interval")), &why))
    log().error("Prometheus file not written: {}", why);
}

// ---- the control socket --------------------------------------------------

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

// New connections: another user's is refused at once, before anything of
// theirs is read; ours join the clients (the oldest dropped past the limit).
void accept_clients(State& st) {
  for (int n = 0; n < 16 && st.listen.ours(); ++n) {
    io::OwnedFd c = io::OwnedFd::adopt(
        accept4(st.listen.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c.valid()) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
      const std::string msg = "error denied gpupool answers only its own user (uid " +
                              std::to_string(geteuid()) + ")\n";
      ssize_t ignored = ::send(c.get(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)ignored;
      log().info("control socket: refused a connection from uid {}", cred.uid);
      continue;  // closed by c's destructor
    }
    if (st.clients.size() >= kMaxClients) {
      log().info("control socket: {} clients at once; dropping the oldest", kMaxClients);
      st.clients.erase(st.clients.begin());
    }
    Client cl;
    cl.fd = std::move(c);
    cl.deadline = mono_ns() + kRequestTimeoutNs;
    st.clients.push_back(std::move(cl));
  }
}

// Reads what the client sent, answers once the line is complete, sends what
// the socket takes. False when the client is done (or given up on).
bool serve(Runtime& rt, Client& c, std::uint64_t now) {
  if (!c.answering) {
    char buf[256];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (c.in.find('\n') != std::string::npos || c.in.size() >= kMaxRequest) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (now >= c.deadline) {
          log().info("control socket: a client sent no complete request within {} ms; dropped",
                     kRequestTimeoutNs / kMs);
          return false;
        }
        return true;
      }
      if (n < 0 || c.in.empty()) return false;  // an error, or closed without asking
      break;  // closed after a request without a newline
    }
    c.in = c.in.substr(0, c.in.find('\n'));
    log().debug("control socket: '{}'", c.in);
    c.out = handle_request(rt, c.in);
    c.answering = true;
    c.deadline = mono_ns() + io::kWriteTimeoutNs;
  }
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return mono_ns() < c.deadline;
    return false;
  }
  return false;  // answered
}

// ---- the control thread --------------------------------------------------

void* control_thread(void* arg) {
  Runtime& rt = *static_cast<Runtime*>(arg);
  State& st = *g_state;
  const config::Config& cfg = rt.config;

  const std::uint64_t interval = cfg.stats_interval_ns;
  const std::uint64_t release_after = rt.pool.release_after_ns();
  const std::uint64_t trim_period =
      release_after ? std::clamp<std::uint64_t>(release_after / 4, 10 * kMs, 1000 * kMs) : 0;
  // Without an interval, the Prometheus file is still kept fresh.
  const std::uint64_t prom_period =
      st.prometheus_path.empty() ? 0 : (interval ? 0 : 5'000'000'000ull);
  constexpr std::uint64_t kFlushPeriod = 100 * kMs;  // trace buffers
  // Handlers replaced, descriptors closed under us, retired arenas to free:
  // looked at this often even when nothing else wakes the thread.
  constexpr std::uint64_t kCheckPeriod = 1000 * kMs;

  std::uint64_t now = mono_ns();
  std::uint64_t next_interval = interval ? now + interval : UINT64_MAX;
  std::uint64_t next_trim = trim_period ? now + trim_period : UINT64_MAX;
  std::uint64_t next_prom = prom_period ? now : UINT64_MAX;
  std::uint64_t next_flush = st.tracer ? now + kFlushPeriod : UINT64_MAX;
  std::uint64_t next_check = now + kCheckPeriod;

  std::vector<pollfd> fds;
  for (;;) {
    check_descriptors(st);
    now = mono_ns();
    std::uint64_t next = std::min({next_interval, next_trim, next_prom, next_flush, next_check});
    fds.clear();
    const bool wake = st.wake_rd.valid();
    const bool listening = st.listen.valid();
    if (wake) fds.push_back({st.wake_rd.get(), POLLIN, 0});
    if (listening) fds.push_back({st.listen.get(), POLLIN, 0});
    for (const Client& c : st.clients) {
      fds.push_back({c.fd.get(), static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.deadline);
    }
    const int timeout_ms =
        next <= now ? 0 : static_cast<int>(std::min<std::uint64_t>((next - now) / kMs + 1, 60'000));
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    // Exit began: the at-exit handler owns the last dump; touch nothing that
    // static destructors may be tearing down.
    if (st.exiting.load(std::memory_order_acquire)) break;
    if (r < 0 && errno != EINTR) break;
    std::size_t k = 0;
    if (wake) {
      if (r > 0 && (fds[k].revents & POLLIN) && st.wake_rd.ours()) {
        char buf[64];
        while (::recv(st.wake_rd.get(), buf, sizeof buf, MSG_DONTWAIT) > 0) {
        }
      }
      ++k;
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

    const bool incoming = listening && r > 0 && (fds[k].revents & POLLIN);
    if (listening) ++k;
    // Clients first (the fds after k are theirs, in order), then new ones.
    now = mono_ns();
    std::size_t i = 0;
    std::erase_if(st.clients, [&](Client& c) {
      const std::size_t j = k + i++;
      const bool ready = r > 0 && j < fds.size() && fds[j].revents != 0;
      if (!ready && now < c.deadline) return false;
      if (!c.fd.ours()) {
        c.fd.forget();
        return true;
      }
      return !serve(rt, c, now);
    });
    if (incoming) accept_clients(st);

    now = mono_ns();
    if (now >= next_interval) {
      dump(rt, "interval");
      next_interval = now + interval;
    }
    if (now >= next_trim) {
      std::unique_lock lock(st.work_mu);
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
      if (st.tracer) st.tracer->flush();
      next_flush = now + kFlushPeriod;
    }
    if (now >= next_check) {
      check_handlers();
      rt.pool.reclaim();
      next_check = now + kCheckPeriod;
    }
  }
  st.thread_running.store(false);
  return nullptr;
}

void start_thread(Runtime& rt) {
  State& st = *g_state;
  // The thread inherits a full signal mask: program signals always land on
  // program threads, whose handlers only poke the channel.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t tid;
  st.thread_running.store(true);
  const int err = pthread_create(&tid, &attr, control_thread, &rt);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (err != 0) {
    st.thread_running.store(false);
    add_warning(std::string("control thread not started: ") + strerror(err));
    return;
  }
#ifdef __GLIBC__
  pthread_setname_np(tid, "gpupool-ctl");
#endif
}

void at_exit() {
  State& st = *g_state;
  if (!st.rt) return;
  st.exiting.store(true, std::memory_order_release);
  poke();
  // Waits for a dump or action in progress on the control thread (its
  // writes are bounded); after that the control thread does nothing more.
  std::unique_lock lock(st.work_mu, std::try_to_lock);
  for (const std::uint64_t give_up = mono_ns() + 2 * io::kWriteTimeoutNs; !lock.owns_lock();) {
    if (mono_ns() >= give_up) {
      st.dumps_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
    lock.try_lock();
  }
  if (st.tracer) st.tracer->flush();
  // Stats come from the pool's own counters: no driver call here.
  if (st.rt->config.stats_at_exit) dump_locked(*st.rt, "exit");
  else write_prometheus(*st.rt);
}

// The files a process writes: %p is its pid. A forked child without %p in
// the Prometheus path leaves that file to its parent.
void set_paths(State& st, bool child) {
  const config::Config& cfg = st.rt->config;
  const long pid = static_cast<long>(getpid());
  st.stats_path = cfg.stats_file.empty() ? std::string() : io::expand_path(cfg.stats_file, pid);
  st.prometheus_path.clear();
  if (!cfg.prometheus_file.empty() && (!child || cfg.prometheus_file.find("%p") != std::string::npos))
    st.prometheus_path = io::expand_path(cfg.prometheus_file, pid);
}

// fork(): see runtime.hpp. The work lock serializes, it protects no data:
// the child gets a new one rather than the parent waiting for a dump.
void fork_prepare() {
  if (!g_state) return;
  if (g_state->tracer) g_state->tracer->fork_prepare();
  g_state->warn_mu.lock();
}

void fork_parent() {
  if (!g_state) return;
  g_state->warn_mu.unlock();
  if (g_state->tracer) g_state->tracer->fork_parent();
}

void fork_child() {
  if (!g_state) return;
  State& st = *g_state;
  st.warn_mu.unlock();
  new (&st.work_mu) std::mutex;
  // The parent's channel, socket and clients: the parent's to serve.
  g_wake.store(nullptr, std::memory_order_release);
  st.wake_rd.close();
  st.wake_wr.close();
  st.listen.close();
  for (Client& c : st.clients) c.fd.close();
  st.clients.clear();
  st.wake_builds = st.listen_builds = 0;
  st.thread_running.store(false);
  st.dumps_dropped.store(0);
  if (st.tracer && !st.tracer->fork_child()) {
    st.rt->pool.set_observer(nullptr);
    st.tracer = nullptr;
  }
  set_paths(st, /*child=*/true);
}

const bool g_fork_registered = (set_fork_handlers(ForkPart::control, {fork_prepare, fork_parent,
                                                                     fork_child, nullptr}),
                                true);

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
    {
      std::lock_guard lock(g_state->warn_mu);
      r.warnings = g_state->warnings;
    }
    if (const std::uint64_t d = g_state->dumps_dropped.load())
      r.warnings.push_back(std::to_string(d) + " stats dump" + (d == 1 ? "" : "s") +
                           " could not be written and " + (d == 1 ? "was" : "were") + " dropped");
    if (g_state->tracer)
      if (const std::uint64_t d = g_state->tracer->records_dropped())
        r.warnings.push_back(std::to_string(d) + " trace record" + (d == 1 ? "" : "s") +
                             " could not be written and " + (d == 1 ? "was" : "were") + " dropped");
  }
  return r;
}

std::string render(Runtime& rt, bool json, const char* reason) {
  const stats::Report r = report(rt, reason);
  return json ? stats::to_json(r) + "\n" : stats::to_text(r);
}

bool dump(Runtime& rt, const char* reason) {
  if (!g_state) return false;
  std::unique_lock lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) && std::string(reason) != "exit") return false;
  return dump_locked(rt, reason);
}

bool free_held(Runtime& rt) {
  if (!g_state) {
    rt.pool.free_held();
    return true;
  }
  std::unique_lock lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) || exiting()) return false;
  rt.pool.free_held();
  return true;
}

bool stop_holding(Runtime& rt) {
  if (!g_state) {
    rt.pool.stop_holding();
    return true;
  }
  std::unique_lock lock(g_state->work_mu);
  if (g_state->exiting.load(std::memory_order_acquire) || exiting()) return false;
  rt.pool.stop_holding();
  return true;
}

void start(Runtime& rt) {
  if (g_state) return;
  (void)g_fork_registered;
  auto* st = new State;
  st->rt = &rt;
  g_state = st;
  const config::Config& cfg = rt.config;
  set_paths(*st, /*child=*/false);
  if (!cfg.trace_file.empty()) {
    std::string why;
    st->tracer = trace::Tracer::open(cfg.trace_file, &why);
    if (st->tracer) rt.pool.set_observer(st->tracer);
    else add_warning("trace disabled: " + why);
  }
  build_wake(*st);
  std::atexit(at_exit);
  install_handlers(cfg);
  // Bound before the first intercepted call returns: from then on `gpupool
  // stats PID` reaches the process (queued until the thread runs).
  build_listen(*st);
  start_thread(rt);
}

void restart(Runtime& rt) {
  State* st = g_state;
  if (!st || st->thread_running.load() || st->exiting.load()) return;
  build_wake(*st);
  build_listen(*st);
  start_thread(rt);
}

}  // namespace gpupool::control
