// The control thread: it wakes on the channel the signal handlers poke,
// on the control socket and on its timers, and does the work.
//
// The program may close any descriptor, gpupool's included, and reuse the
// number (config/io.hpp): every descriptor here is checked before each use,
// and one found closed or replaced is forgotten and built anew (a bounded
// number of times; then the thread still serves signals, once a second).
//
// A program that closed 0, 1 or 2 gets those numbers back from its next
// opens (daemons rely on it), and every descriptor this thread creates
// (a dump's file, an accepted client, /proc reads, NVML's dlopen and its
// device files) takes the lowest free number, if only for a moment. So
// while one of 0-2 is closed the thread creates none: dumps, new clients,
// requests (a release publishes, a stats request may read symbols),
// rebuilds, publishing and the pressure watch wait, at most kStdioWait (a
// program that keeps them closed longer is not about to reopen them).
// What the program's own threads do inside its calls is not this thread's
// concern: a single-threaded program is never opening files meanwhile.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>

#include <algorithm>

#include "config/log.hpp"
#include "interpose/control/internal.hpp"
#include "interpose/node/node.hpp"

namespace gpupool::control {
namespace {

// Every descriptor still the one gpupool opened; lost ones are forgotten
// (never closed: the number is the program's now) and built anew.
void check_descriptors(State& st) {
  if (st.wake_rd.valid() && (!st.wake_rd.ours() || !st.wake_wr.ours())) {
    // One end closed under us: the other is no use alone.
    st.wake_rd.close();
    st.wake_wr.close();
    log().info(
        "the program closed gpupool's control channel; {}",
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

constexpr std::uint64_t kStdioWait = 1000 * kMs;
// How often a thread that waits for 0-2 looks again.
constexpr std::uint64_t kStdioPoll = 10 * kMs;

bool stdio_closed() {
  for (int fd = 0; fd <= 2; ++fd)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) return true;
  return false;
}

// Whether this thread may create descriptors now; `since` is when it first
// found one of 0-2 closed (0: not waiting).
bool may_create_descriptors(std::uint64_t now, std::uint64_t* since) {
  if (!stdio_closed()) {
    *since = 0;
    return true;
  }
  if (*since == 0) {
    *since = now;
    log().debug("the program has closed 0, 1 or 2: gpupool's thread opens nothing until it "
                "reopens them (at most {} ms)",
                kStdioWait / kMs);
  }
  return now - *since >= kStdioWait;
}

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
  std::uint64_t next_node = now;
  std::uint64_t stdio_closed_since = 0;

  std::vector<pollfd> fds;
  for (;;) {
    // A failure inside (out of host memory) costs this round, not the
    // thread: it is counted and the loop goes on.
    try {
      std::unique_lock round(st.round_mu);
      now = mono_ns();
      bool may_open = may_create_descriptors(now, &stdio_closed_since);
      if (may_open) check_descriptors(st);
      std::uint64_t next =
          std::min({next_interval, next_trim, next_prom, next_flush, next_check, next_node});
      if (!may_open) next = std::min(next, now + kStdioPoll);
      fds.clear();
      const bool wake = st.wake_rd.valid();
      // New clients wait in the backlog meanwhile.
      const bool listening = st.listen.valid() && may_open;
      if (wake) fds.push_back({st.wake_rd.get(), POLLIN, 0});
      if (listening) fds.push_back({st.listen.get(), POLLIN, 0});
      for (const Client& c : st.clients) {
        // A request is not read while 0-2 are closed (answering one may open
        // files: the registry, NVML); its client waits, not polled, so the
        // thread does not spin on it (a negative descriptor is skipped).
        if (!may_open && !c.answering) {
          fds.push_back({-1, 0, 0});
          continue;
        }
        fds.push_back({c.fd.get(), static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
        next = std::min(next, c.deadline);
      }
      const int timeout_ms =
          next <= now ? 0
                      : static_cast<int>(std::min<std::uint64_t>((next - now) / kMs + 1, 60'000));
      round.unlock();
      const int r = ::poll(fds.data(), fds.size(), timeout_ms);
      round.lock();
      // Exit began: the at-exit handler owns the last dump; touch nothing that
      // static destructors may be tearing down.
      if (exiting()) break;
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
      now = mono_ns();
      may_open = may_create_descriptors(now, &stdio_closed_since);
      unsigned taken[kActions];
      for (unsigned a = 0; a < kActions; ++a)  // a dump asked for waits, still asked
        taken[a] = a == kStats && !may_open ? 0 : take_requests(static_cast<Action>(a));
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
        if (!may_open && !c.answering) return false;  // waits for 0-2, at most kStdioWait
        const bool ready = r > 0 && j < fds.size() && fds[j].revents != 0;
        if (!ready && now < c.deadline) return false;
        if (!c.fd.ours()) {
          c.fd.forget();
          return true;
        }
        return !serve(rt, c, now);
      });
      if (incoming && may_open) accept_clients(st);

      now = mono_ns();
      if (now >= next_interval && may_open) {
        dump(rt, "interval");
        next_interval = now + interval;
      }
      if (now >= next_trim) {
        std::unique_lock lock(st.work_mu);
        if (!exiting()) {
          if (std::size_t n = rt.pool.trim_idle(rt.pool.now()))
            log().debug("released {} blocks held longer than GPUPOOL_RELEASE_AFTER", n);
        }
        next_trim = now + trim_period;
      }
      if (now >= next_prom && may_open) {
        write_prometheus(rt);
        next_prom = now + prom_period;
      }
      if (now >= next_flush) {
        if (st.tracer) st.tracer->flush();
        next_flush = now + kFlushPeriod;
      }
      {
        // Publishing and the pressure watch: every round, since a new
        // device wakes the thread (node::tick returns at once when nothing
        // is due).
        std::unique_lock lock(st.work_mu);
        if (!exiting() && may_open) next_node = node::tick(rt, now);
      }
      if (now >= next_check) {
        check_handlers();
        {
          std::unique_lock lock(st.work_mu);
          housekeeping(rt);
        }
        rt.pool.reclaim();
        next_check = now + kCheckPeriod;
      }
    } catch (...) {
      internal_failure("gpupool's control thread");
      const timespec pause{0, 10'000'000};
      nanosleep(&pause, nullptr);
    }
  }
  st.thread_running.store(false);
  return nullptr;
}

}  // namespace

// A new wake channel, published to the signal handler.
void build_wake(State& st) {
  unpublish_wake();
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
  publish_wake(st.wake_wr);
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

}  // namespace gpupool::control
