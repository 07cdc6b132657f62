// Control and observation: start-up, dumps (to the stats file or stderr,
// and the Prometheus file), the exit dump, fork, and the calls the C API,
// the control socket and the control thread share. See internal.hpp for the
// other files of the room.
#include "interpose/control/control.hpp"

#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <new>

#include "core/fork_wait.hpp"
#include "interpose/control/internal.hpp"
#include "interpose/hook_scope.hpp"
#include "sys/log.hpp"
#include "wire/registry.hpp"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace gpupool::control {

void set_node_work(Runtime& rt, NodeWork work) { rt.control->node_work = work; }

void add_warning(const std::string& w) {
  State& st = *state();
  {
    LockGuard lock(st.warn_mu);
    bool repeat = false;
    for (State::Warning& k : st.warnings)
      if (k.text == w) {
        ++k.times;
        repeat = true;
        break;
      }
    if (!repeat) st.warnings.push_back({w, 1});
    if (repeat) return;
  }
  log().warn("{}", w);
}

namespace {

double unix_time() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Append one dump to the stats file, or write it to stderr. One write per
// dump: with O_APPEND, dumps of processes sharing a file do not interleave.
bool append_dump(const std::string& path, const std::string& data, std::string* why) {
  if (path.empty()) {
    if (!io::write_stderr(data)) {
      *why = "stderr does not take it (closed, or nobody reads it)";
      return false;
    }
    return true;
  }
  bool ok = false;
  io::in_private([&] {  // opened, written and closed on the files thread
    io::OwnedFd fd = io::open_output(path, /*append=*/true, why);
    if (!fd.valid()) return;
    ok = io::write_bounded(fd.get(), data);
    if (!ok) *why = "cannot write " + path + ": " + strerror(errno);
  });
  return ok;
}

// The Prometheus files a killed process left (it holds them no more), and
// the temporary files of writes an exec or a kill cut short: removed, so
// that node_exporter serves no dead process and the directory does not
// fill. Every update does it (a write interval at most after the death),
// and so does the exit.
std::size_t sweep_prometheus(State& st, const std::string& keep) {
  const std::size_t slash = keep.rfind('/');
  return io::remove_unheld_outputs(st.rt->config.prometheus_file,
                                   slash == std::string::npos ? keep : keep.substr(slash + 1),
                                   stats::kPrometheusStart, io::Names::any)
      .size();
}

void at_exit_locked_dump() {
  State& st = *state();
  if (!st.rt) return;
  poke();
  // Waits for a dump or action in progress on the control thread (its
  // writes are bounded); after that the control thread does nothing more.
  // Polled: the wait must be bounded (a stuck driver or NVML call must not
  // hang the exit) and timed locks escape ThreadSanitizer.
  for (const std::uint64_t give_up = io::mono_ns() + 2 * io::kWriteTimeoutNs;
       !st.work_mu.try_lock();) {
    if (io::mono_ns() >= give_up) {
      st.dumps_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const timespec ms{0, 1'000'000};
    nanosleep(&ms, nullptr);
  }
  LockGuard lock(st.work_mu, std::adopt_lock);
  if (trace::Tracer* t = st.tracer.load()) t->finish();
  // Stats come from the pool's own counters: no driver call here.
  if (st.rt->config.stats_at_exit) dump_locked(st, *st.rt, "exit");
  if (Recorder* rec = st.recorder.load()) {
    const std::string leaks = rec->leak_report(static_cast<long>(getpid()));
    std::string why;
    if (!leaks.empty() && !append_dump(st.stats_path, leaks, &why))
      st.dumps_dropped.fetch_add(1, std::memory_order_relaxed);
  }
  // A process's series end with it: a file left behind would be exported
  // forever. (Killed, it leaves the file, which the next gpupool process
  // writing there removes: nobody holds it any more.)
  if (!st.prometheus_path.empty())
    io::in_private([&] {
      st.prometheus_file.remove(st.prometheus_path);
      sweep_prometheus(st, std::string());
    });
}

// The files a process writes: %p is its pid. The stats file is shared
// (dumps are appended whole, and each names its pid); the Prometheus file
// is the process's own (sys/outputs.hpp: its name, or a sibling).
void set_paths(State& st, bool child) {
  const config::Config& cfg = st.rt->config;
  const long pid = static_cast<long>(getpid());
  st.stats_path = cfg.stats_file.empty() ? std::string() : io::expand_path(cfg.stats_file, pid);
  st.prometheus_next = 0;
  st.prometheus_path.clear();
  if (!cfg.prometheus_file.empty()) {
    st.prometheus_names = io::numbered_names(cfg.prometheus_file, pid, cfg.run_pid, child);
    st.prometheus_path = st.prometheus_names.name(0, &st.prometheus_slot);
    // A forked child has its parent's user and command: nothing to read.
    if (!child) {
      st.prometheus_source.uid = static_cast<long>(getuid());
      // /proc/self/comm opened in gpupool's own descriptor table: in the
      // program's it could take a number 0-2 the program just closed
      // (host.cuda.fds.stdio_race, 1 round in 42,849 under ASan).
      io::in_private([&] { st.prometheus_source.program = wire::comm_of_self(); });
    }
  }
}

// fork(): see runtime.hpp. The observer's part (Part::trace): the
// tracer's locks, then the recorder's (the sites', then its shards), in
// rank order (core/lock_rank.hpp).
// Both are set under round_mu, which fork holds (Part::round, first):
// the same in all three handlers.
void fork_trace_prepare() {
  State* st = state();
  if (!st) return;
  if (trace::Tracer* t = st->tracer.load(); t && !t->fork_prepare()) return;
  if (Recorder* r = st->recorder.load()) r->fork_prepare();
}

void fork_trace_parent() {
  State* st = state();
  if (!st) return;
  if (Recorder* r = st->recorder.load()) r->fork_parent();
  if (trace::Tracer* t = st->tracer.load()) t->fork_parent();
}

void fork_trace_child() {
  State* st = state();
  if (!st) return;
  if (Recorder* r = st->recorder.load()) r->fork_child();
  if (trace::Tracer* t = st->tracer.load()) t->fork_child();
}

// The control part. The work lock serializes, it protects no data: the
// child gets a new one rather than the parent waiting for a dump.
void fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* st = state();
  if (st && fork_wait::take(st->warn_mu)) fork_wait::take(st->req_mu);
}

void fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  State* st = state();
  if (!st) return;
  st->req_mu.unlock();
  st->warn_mu.unlock();
}

void fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (!state()) return;
  State& st = *state();
  new (&st.work_mu) decltype(st.work_mu);
  // The server thread and its requests are the parent's (a condition
  // variable would wait for the parent's waiter to wake).
  new (&st.req_cv) std::condition_variable_any;
  new (&st.requests) std::deque<State::Request*>;
  st.req_mu.unlock();
  st.warn_mu.unlock();
  st.thread_running.store(false);
}

// The child's own start (it may allocate: see runtime.cpp).
void fork_renew() {
  if (!state()) return;
  State& st = *state();
  // The parent's socket was in its files thread's table, which the child
  // does not have: nothing to close. Where there was none, it is a copy in
  // the child's table: closed (if the number is still that socket).
  for (io::OwnedFd* l : {&st.listen, &st.listen_public}) {
    if (st.listen_private) l->forget();
    else l->close();
  }
  // The file is the parent's: the child binds its own, and never removes
  // the parent's at its exit.
  st.socket_path.clear();
  st.socket_dev.store(0);
  st.socket_ino.store(0);
  st.dumps_dropped.store(0);
  st.prometheus_dropped.store(0);
  st.prometheus_file.forget_in_child();
  // A trace the program stopped stays stopped in its children.
  if (trace::Tracer* t = st.tracer.load(); t && st.recorder.load()->tracing()) t->renew_in_child();
  set_paths(st, /*child=*/true);
}

// The control thread's round, first of all parts: fork() waits until the
// thread waits for a poke, so that nothing it does mid-round (a malloc, above
// all: many allocators keep locks that a child inherits held, and
// AddressSanitizer's and ThreadSanitizer's before LLVM 18 and 19 do) is cut
// off in the child. The wait is one round at most; the child's thread is new.
void fork_round_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (State* st = state()) fork_wait::take(st->round_mu);
}
void fork_round_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (State* st = state()) st->round_mu.unlock();
}
}  // namespace

namespace {

// Writes this process's file: the first of its names that no other live
// process holds. The first failure is said; later ones are counted in the
// warnings (a full disk would otherwise log every interval).
void update_prometheus(State& st, const stats::Report& r) GPUPOOL_REQUIRES(st.work_mu) {
  std::string why, passed_over;
  io::Hold h = io::Hold::failed;
  std::size_t swept = 0;
  io::in_private([&] {
    // Each name's text has its number: rendered again only when a name is
    // passed over (the first update of a process that finds it held).
    for (std::string name = st.prometheus_path; !name.empty();) {
      st.prometheus_source.slot = st.prometheus_slot;
      h = st.prometheus_file.replace(name, stats::to_prometheus(r, st.prometheus_source), &why);
      if (h != io::Hold::taken) break;
      passed_over = name;
      name = st.prometheus_names.name(++st.prometheus_next, &st.prometheus_slot);
      if (!name.empty()) st.prometheus_path = name;
    }
    swept = sweep_prometheus(st, h == io::Hold::held ? st.prometheus_path : std::string());
  });
  if (!passed_over.empty() && h == io::Hold::held)
    log().info("GPUPOOL_PROMETHEUS_FILE: {} is written by another live process; this one writes {}",
               passed_over, st.prometheus_path);
  if (swept)
    log().info("GPUPOOL_PROMETHEUS_FILE: removed {} file{} of processes that are gone", swept,
               swept == 1 ? "" : "s");
  if (h != io::Hold::held && st.prometheus_dropped.fetch_add(1, std::memory_order_relaxed) == 0)
    log().error("Prometheus file not written: {} (later failures are counted in the warnings)",
                why);
}
}  // namespace

bool dump_locked(State& st, Runtime& rt, const char* reason) {
  const stats::Report r = report(rt, reason);
  std::string text = rt.config.stats_format == config::StatsFormat::json ? stats::to_json(r) + "\n"
                                                                         : stats::to_text(r);
  std::string why;
  const bool ok = append_dump(st.stats_path, text, &why);
  if (!ok && st.dumps_dropped.fetch_add(1, std::memory_order_relaxed) == 0)
    log().error("stats dump not written: {} (later ones that fail are counted in the warnings)",
                why);
  // At exit the file goes (at_exit_locked_dump).
  if (!st.prometheus_path.empty() && std::string(reason) != "exit") update_prometheus(st, r);
  return ok;
}

void write_prometheus(Runtime& rt) {
  State& st = *state();
  // Serialized with dumps (which update the file too) and with the exit,
  // which removes it: no update may come after.
  UniqueLock lock(st.work_mu);
  if (st.prometheus_path.empty() || exiting()) return;
  update_prometheus(st, report(rt, "interval"));
}

stats::Report report(Runtime& rt, const char* reason) {
  State* st = state();
  if (st) check_handlers();
  stats::Report r;
  r.version = GPUPOOL_VERSION;
  r.pid = static_cast<long>(getpid());
  r.time = unix_time();
  r.reason = reason;
  r.holding = rt.pool.holding();
  r.arenas = rt.pool.snapshot(8);
  // Totals from the same snapshot, so they always equal the sum of the rows.
  for (const auto& b : r.arenas) r.totals += b.stats;
  for (unsigned a = 0; a < kActions; ++a) {
    stats::SignalInfo si;
    si.action = kActionInfo[a].name;
    si.signo = rt.config.*kActionInfo[a].signal;
    si.installed = si.signo > 0 && handler_installed(si.signo);
    r.signals.push_back(si);
  }
  if (st) {
    {
      LockGuard lock(st->warn_mu);
      for (const State::Warning& w : st->warnings)
        r.warnings.push_back(w.times == 1 ? w.text
                                          : w.text + " (" + std::to_string(w.times) + " times)");
    }
    if (const std::uint64_t d = st->dumps_dropped.load())
      r.warnings.push_back(std::to_string(d) + " stats dump" + (d == 1 ? "" : "s") +
                           " could not be written and " + (d == 1 ? "was" : "were") + " dropped");
    if (const std::uint64_t d = st->prometheus_dropped.load())
      r.warnings.push_back(std::to_string(d) + " update" + (d == 1 ? "" : "s") +
                           " of the Prometheus file could not be written");
    if (const std::uint64_t d = internal_failures())
      r.warnings.push_back(std::to_string(d) + " call" + (d == 1 ? "" : "s") +
                           " failed inside gpupool (out of host memory?) and went to the "
                           "driver alone");
    if (const std::uint64_t d = forks_without_gpupool())
      r.warnings.push_back(std::to_string(d) + " fork" + (d == 1 ? "" : "s") +
                           " went without gpupool (from inside gpupool: a signal handler's; or "
                           "a lock stayed busy): " +
                           (d == 1 ? "its child pools" : "their children pool") + " nothing");
    if (trace::Tracer* t = st->tracer.load())
      if (const std::uint64_t d = t->records_dropped())
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
  State* st = state();
  if (!st) return false;
  UniqueLock lock(st->work_mu);
  if (exiting() && std::string(reason) != "exit") return false;
  return dump_locked(*st, rt, reason);
}

void wake() noexcept { poke(); }

bool free_held(Runtime& rt) {
  State* st = state();
  if (!st) {
    rt.pool.free_held();
    return true;
  }
  UniqueLock lock(st->work_mu);
  if (exiting()) return false;
  rt.pool.free_held();
  return true;
}

bool reset_peaks(Runtime& rt) {
  State* st = state();
  if (!st) return false;
  UniqueLock lock(st->work_mu);
  if (exiting()) return false;
  rt.pool.reset_peaks();
  return true;
}

bool trace_start(Runtime& rt, const std::string& path, std::string* msg) {
  State* st = state();
  if (!st) return false;
  // round_mu first (its rank), as the control thread's rounds take both.
  UniqueLock round(st->round_mu);
  UniqueLock lock(st->work_mu);
  if (exiting()) {
    *msg = "the process is exiting";
    return false;
  }
  Recorder* rec = st->recorder.load();
  trace::Tracer* t = st->tracer.load();
  if (rec && rec->tracing() && t) {
    *msg = "a trace is already running, into " + t->path() +
           (rt.config.trace_file.empty() ? "" : " (GPUPOOL_TRACE_FILE)") +
           ": stop it first (gpupool_trace_stop)";
    return false;
  }
  // As a forked child's (sys/outputs.hpp): this process writes the name
  // unless another live process holds it, then its sibling.
  const long self = static_cast<long>(getpid());
  if (t) {
    if (!t->restart(path, self, msg)) return false;
  } else {
    t = trace::Tracer::open(path, self, st->sites, /*attached=*/true, msg);
    if (!t) return false;
    st->tracer.store(t);
  }
  if (!rec) {
    rec = new Recorder(st->sites, nullptr, false);  // never destroyed: see recorder.hpp
    st->recorder.store(rec);
    rt.pool.set_observer(rec);
  }
  rec->trace_into(t);
  poke();  // the control thread writes the records out from now on
  *msg = t->path();
  return true;
}

bool trace_stop(Runtime& /*rt*/, std::string* msg) {
  State* st = state();
  if (!st) return false;
  UniqueLock round(st->round_mu);
  UniqueLock lock(st->work_mu);
  Recorder* rec = st->recorder.load();
  trace::Tracer* t = st->tracer.load();
  if (!rec || !rec->tracing() || !t) {
    *msg = "no trace is running";
    return false;
  }
  // Exit began: its handler finishes the trace (or has).
  if (exiting()) {
    *msg = "the process is exiting";
    return false;
  }
  rec->stop_tracing();
  t->finish();
  *msg = t->path();
  return true;
}

std::string snapshot_json(Runtime& /*rt*/) {
  State* st = state();
  Recorder* rec = st ? st->recorder.load() : nullptr;
  if (rec) return rec->snapshot_json(static_cast<long>(getpid())) + "\n";
  return std::string("{\"version\":1,\"gpupool\":\"" GPUPOOL_VERSION "\",\"pid\":") +
         std::to_string(getpid()) +
         ",\"tracked\":false,\"sites\":false,\"arenas\":{},\"blocks\":[],\"stacks\":{}}\n";
}

bool stop_holding(Runtime& rt) {
  State* st = state();
  if (!st) {
    rt.pool.stop_holding();
    return true;
  }
  UniqueLock lock(st->work_mu);
  if (exiting()) return false;
  rt.pool.stop_holding();
  return true;
}

namespace {

// The control socket, bound on the files thread, and its thread.
void listen(Runtime& rt) {
  State& st = *state();
  st.socket_taken.clear();
  st.socket_dir_note.clear();
  st.socket_dir_taken = false;
  st.listen_error = 0;
  io::in_private([&] { build_listen(st); });
  if (!st.socket_dir_note.empty() && st.listen.valid()) {
    const std::string said = "control socket: " + st.socket_dir_note +
                             "; bound in the abstract namespace instead, where other users can "
                             "connect to it";
    if (st.socket_dir_taken) add_warning(said);
    else log().info("{}", said);
  }
  if (!st.socket_taken.empty())
    log().info("control socket: @{} is taken by another process; using @{}", st.socket_taken,
               st.socket_name);
  if (!st.listen.valid()) {
    add_warning(std::string("control socket unavailable (") + strerror(st.listen_error) +
                "): `gpupool stats PID` cannot reach this process; signals still work");
    return;
  }
  start_server(rt);
}

}  // namespace

namespace {

// The room's state, before the runtime is published; never destroyed.
void make(Runtime& rt) {
  auto* st = new State;
  st->rt = &rt;
  rt.control = st;
}

// Right after the runtime is published (first intercepted call), once the
// other rooms gave the control thread their work: opens the sites, the
// trace and the recorder, installs the signal handlers, binds the control
// socket and starts the control thread as configured.
void start(Runtime& rt) {
  State* st = rt.control;
  const config::Config& cfg = rt.config;
  set_paths(*st, /*child=*/false);
  sites::Sites* sites = sites::Sites::create(cfg.sites);
  st->sites = sites;
  trace::Tracer* tracer = nullptr;
  if (!cfg.trace_file.empty()) {
    std::string why;
    tracer = trace::Tracer::open(cfg.trace_file, cfg.run_pid, sites, /*attached=*/false, &why);
    if (!tracer) add_warning("trace disabled: " + why);
  }
  st->tracer.store(tracer);
  if (sites || tracer || cfg.leaks) {
    auto* rec = new Recorder(sites, tracer, cfg.leaks);  // never destroyed: see recorder.hpp
    st->recorder.store(rec);
    rt.pool.set_observer(rec);
  }
  install_handlers(cfg);
  // Bound before the first intercepted call returns: from then on `gpupool
  // stats PID` reaches the process (queued until the thread runs).
  listen(rt);
  start_thread(rt);
}

// Exit began (exiting() is true): the last trace records and, with
// GPUPOOL_STATS_AT_EXIT, the exit dump. Waits a bounded time for a dump in
// progress; the control thread stops.
void at_exit() noexcept {
  if (!state()) return;
  try {
    at_exit_locked_dump();
  } catch (...) {
    internal_failure("gpupool's exit handler");
  }
  remove_socket_file(*state());
}

// _exit() or _Exit(): the process ends without its exit handlers
// (multiprocessing's children, os._exit). What would be lost is written
// first: the trace's buffered records and its end. Nothing when a signal
// handler interrupted gpupool on this thread (its locks may be held) or in
// a vfork() child (the parent's memory; trace.cpp).
void at_quick_exit() noexcept {
  State* st = state();
  trace::Tracer* t = st ? st->tracer.load() : nullptr;
  if (!t || !st->rt || inside_hook() || exiting()) return;
  try {
    t->finish();
  } catch (...) {
    internal_failure("_exit");
  }
}

// In a forked child, at its first intercepted call: the child's own wake
// channel, control socket and control thread (the parent's stay the
// parent's).
void restart(Runtime& rt) {
  State* st = rt.control;
  if (!st || st->thread_running.load() || exiting()) return;
  listen(rt);
  start_thread(rt);
}

}  // namespace

// The room's three parts (runtime.hpp: Part::round, trace and control).
constinit const PartHandlers kRoundPart{
    .fork = {fork_round_prepare, fork_round_parent, fork_round_parent, nullptr}};
constinit const PartHandlers kTracePart{
    .fork = {fork_trace_prepare, fork_trace_parent, fork_trace_child, nullptr}};
constinit const PartHandlers kPart{.make = make,
                                   .start = start,
                                   .restart = restart,
                                   .exit = at_exit,
                                   .quick_exit = at_quick_exit,
                                   .fork = {fork_prepare, fork_parent, fork_child, fork_renew}};

}  // namespace gpupool::control
