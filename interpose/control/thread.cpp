// The control thread: it wakes when a signal handler or the control
// socket's thread pokes it (signals.cpp), or on its timers, and does the
// work: everything that may call a GPU driver or NVML runs here.
//
// It keeps no descriptor: the files it writes and the control socket are
// made and used on gpupool's files thread and server thread, whose
// descriptor table is their own (sys/io.hpp), so the program, which may
// close or reuse any number, never sees gpupool take one of its numbers.
//
// NVML runs in that table too. What remains in the program's table is a
// driver call's, if one opens something: that takes the lowest free
// number. So while one of 0-2 is closed, the work here waits (dumps,
// requests, publishing and the pressure watch), at most
// kStdioWait (a program that keeps them closed longer is not about to
// reopen them). What the program's own threads do inside its calls is not
// this thread's concern: a single-threaded program is never opening files
// meanwhile.
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>

#include <algorithm>

#include "interpose/control/internal.hpp"
#include "sys/io.hpp"
#include "sys/log.hpp"

namespace gpupool::control {
namespace {

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
    log().debug(
        "the program has closed 0, 1 or 2: gpupool's control thread waits until it "
        "reopens them (at most {} ms)",
        kStdioWait / kMs);
  }
  return now - *since >= kStdioWait;
}

// When each of the control thread's periodic jobs is next due.
struct Schedule {
  std::uint64_t interval = 0, trim_period = 0, prom_period = 0;
  std::uint64_t next_interval = UINT64_MAX, next_trim = UINT64_MAX, next_prom = UINT64_MAX,
                next_flush = UINT64_MAX, next_check = 0, next_node = 0;
  static constexpr std::uint64_t kFlushPeriod = 100 * kMs;  // trace buffers
  // Handlers replaced, descriptors closed under us, retired arenas to free:
  // looked at this often even when nothing else wakes the thread.
  static constexpr std::uint64_t kCheckPeriod = 1000 * kMs;

  Schedule(const Runtime& rt, const State& st, std::uint64_t now) {
    interval = rt.config.stats_interval_ns;
    const std::uint64_t release_after = rt.pool.release_after_ns();
    trim_period =
        release_after ? std::clamp<std::uint64_t>(release_after / 4, 10 * kMs, 1000 * kMs) : 0;
    // Without an interval, the Prometheus file is still kept fresh.
    prom_period = st.prometheus_path.empty() ? 0 : (interval ? 0 : 5'000'000'000ull);
    next_interval = interval ? now + interval : UINT64_MAX;
    next_trim = trim_period ? now + trim_period : UINT64_MAX;
    next_prom = prom_period ? now : UINT64_MAX;
    next_flush = st.tracer.load() ? now + kFlushPeriod : UINT64_MAX;
    next_check = now + kCheckPeriod;
    next_node = st.node_work.tick ? now : UINT64_MAX;
  }
  std::uint64_t earliest() const {
    return std::min({next_interval, next_trim, next_prom, next_flush, next_check, next_node});
  }
};

// What signals asked for, then the control socket's requests. A dump
// asked for while 0-2 are closed waits, still asked.
void serve_asked(Runtime& rt, bool may_open) {
  unsigned taken[kActions];
  for (unsigned a = 0; a < kActions; ++a)
    taken[a] = a == kStats && !may_open ? 0 : take_requests(static_cast<Action>(a));
  // Release first, so that "USR2 then USR1" coalesced into one wake-up
  // still shows the released memory in the dump.
  if (taken[kStopHolding]) {
    log().info("{} requested by signal", kActionInfo[kStopHolding].name);
    stop_holding(rt);
  }
  if (taken[kFreeHeld]) {
    log().info("{} requested by signal", kActionInfo[kFreeHeld].name);
    free_held(rt);
  }
  if (taken[kStats]) dump(rt, "signal");
  if (may_open) answer_requests(rt);
}

// The periodic jobs due at `now`.
void run_due(Runtime& rt, State& st, Schedule& s, std::uint64_t now, bool may_open) {
  if (now >= s.next_interval && may_open) {
    dump(rt, "interval");
    s.next_interval = now + s.interval;
  }
  if (now >= s.next_trim) {
    UniqueLock lock(st.work_mu);
    if (!exiting()) {
      if (std::size_t n = rt.pool.trim_idle(rt.pool.now()))
        log().debug("released {} blocks held longer than GPUPOOL_RELEASE_AFTER", n);
    }
    s.next_trim = now + s.trim_period;
  }
  if (now >= s.next_prom && may_open) {
    write_prometheus(rt);
    s.next_prom = now + s.prom_period;
  }
  // A trace the program started (control.cpp: trace_start pokes).
  if (s.next_flush == UINT64_MAX && st.tracer.load()) s.next_flush = now + Schedule::kFlushPeriod;
  if (now >= s.next_flush) {
    if (trace::Tracer* t = st.tracer.load()) t->flush();
    s.next_flush = now + Schedule::kFlushPeriod;
  }
  {
    // Publishing and the pressure watch: every round, since a new device
    // wakes the thread (the node room's tick returns at once when nothing
    // is due).
    UniqueLock lock(st.work_mu);
    if (!exiting() && may_open && st.node_work.tick) s.next_node = st.node_work.tick(rt, now);
  }
  if (now >= s.next_check) {
    check_handlers();
    {
      UniqueLock lock(st.work_mu);
      housekeeping(rt);
    }
    rt.pool.reclaim();
    s.next_check = now + Schedule::kCheckPeriod;
  }
}

void* control_thread(void* arg) {
  Runtime& rt = *static_cast<Runtime*>(arg);
#ifdef __GLIBC__
  // Named by itself: naming another thread opens /proc/self/task/TID/comm.
  pthread_setname_np(pthread_self(), "gpupool-ctl");
#endif
  State& st = *state();
  Schedule sched(rt, st, io::mono_ns());
  std::uint64_t stdio_closed_since = 0;
  std::uint32_t seen = pokes_seen();

  for (;;) {
    // A failure inside (out of host memory) costs this round, not the
    // thread: it is counted and the loop goes on.
    try {
      UniqueLock round(st.round_mu);
      std::uint64_t now = io::mono_ns();
      bool may_open = may_create_descriptors(now, &stdio_closed_since);
      std::uint64_t next = sched.earliest();
      if (!may_open) next = std::min(next, now + kStdioPoll);
      // Requests from the control socket wait while 0-2 are closed
      // (answering one may call the driver).
      if (may_open && requests_waiting()) next = now;
      round.unlock();
      if (next > now) wait_for_poke(seen, std::min<std::uint64_t>(next - now, 60'000 * kMs));
      round.lock();
      // Read before looking at what the pokes asked for: one that comes
      // after this ends the next wait at once.
      seen = pokes_seen();
      // Exit began: the at-exit handler owns the last dump; touch nothing that
      // static destructors may be tearing down.
      if (exiting()) break;
      may_open = may_create_descriptors(io::mono_ns(), &stdio_closed_since);
      serve_asked(rt, may_open);
      run_due(rt, st, sched, io::mono_ns(), may_open);
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

void start_thread(Runtime& rt) {
  State& st = *state();
  // Every signal blocked: program signals always land on program threads,
  // whose handlers only poke the channel.
  st.thread_running.store(true);
  const int err = io::start_detached(control_thread, &rt);
  if (err != 0) {
    st.thread_running.store(false);
    add_warning(std::string("control thread not started: ") + strerror(err));
    return;
  }
}

}  // namespace gpupool::control
