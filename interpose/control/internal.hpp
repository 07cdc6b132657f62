// What the control files share; nothing outside interpose/control uses it.
//
//   signals.cpp  the signal handlers and the wake word they poke
//   thread.cpp   the control thread: wakes, requests, periodic work
//   server.cpp   the control socket: its thread (in gpupool's private
//                descriptor table, sys/io.hpp) accepts, reads, and
//                sends the answers the control thread gives
//   control.cpp  start, dumps, the exit dump, fork, the public calls
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "interpose/control/control.hpp"
#include "interpose/control/recorder.hpp"
#include "interpose/control/trace.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "sys/outputs.hpp"

namespace gpupool::control {

// The control actions (config/actions.def).
using config::Action;
using config::kActionInfo;
using config::kActions;
using config::kFreeHeld;
using config::kStats;
using config::kStopHolding;

inline constexpr std::uint64_t kMs = 1'000'000;

// One connection to the control socket (the server thread's).
struct Client {
  io::OwnedFd fd;
  std::string in;   // the request so far
  std::string out;  // the answer, once the request is in
  std::size_t sent = 0;
  std::uint64_t deadline = 0;
  bool answering = false;
  // Descriptors sent with the answer (an "ipc" request's granules), in
  // this thread's table.
  std::vector<io::OwnedFd> out_fds;
  pid_t pid = 0;  // the connecting process (SO_PEERCRED)
  // Another user's process (GPUPOOL_NEIGHBOURS=all): it may only ask for a
  // release; nothing of ours is shown to it.
  bool foreign = false;
};

// Everything else: the room's state, made by the runtime's create()
// (control.cpp: make) and never destroyed, since the control thread and
// hooks may run while the process exits.
struct State {
  Runtime* rt = nullptr;
  // The control socket, a number of the private table: only the server
  // thread (and start, on the files thread) uses it.
  // Its file in the user's private directory (wire/socket.hpp), or the abstract
  // name where that cannot be used; listen_public: the abstract name beside
  // the file, for other users' releases (GPUPOOL_NEIGHBOURS=all).
  io::OwnedFd listen, listen_public;
  // Made on a thread of the private table; false where none could be made
  // (io.hpp): then they are numbers of the program's, which the program may
  // close and reuse, and which a forked child has copies of.
  bool listen_private = false;
  // Its file, when it has one: the same for the process's life once set
  // (the server thread binds it again under that name), so the exit handler
  // reads it while the server runs; what was bound there last, to remove at
  // exit if it is still that.
  std::string socket_path;
  std::atomic<std::uint64_t> socket_dev{0}, socket_ino{0};
  // Set by the exit handler before it removes the file: the server thread
  // binds it no more, and removes what it bound meanwhile (server.cpp:
  // check_file). This flag and dev/ino are sequentially consistent, so
  // one of the two sees the other's file.
  std::atomic<bool> socket_file_closing{false};
  std::string socket_dir_note;    // why the private directory is not used
  bool socket_dir_taken = false;  // ... because another user took its name
  std::string socket_name;        // the abstract name, when one is bound
  std::string socket_taken;       // the usual abstract name, when another process holds it
  int listen_error = 0;           // why there is no socket
  // Requests the server thread read, answered by the control thread (which
  // may call the driver; the server thread must not).
  struct Request {
    std::string line;
    std::uint64_t deadline = 0;  // io::mono_ns(): not begun by then, not done (0: none)
    bool foreign = false;
    std::string answer;
    bool done = false;
    // An answer's descriptors, the program's (made by the driver on the
    // control thread): the server thread copies them into its table
    // (fds_taken), then the control thread closes them (fds_closed) and
    // touches the request no more.
    std::vector<int> fds;
    bool fds_taken = false, fds_closed = false;
  };
  Ranked<LockRank::control_requests> req_mu;
  std::condition_variable_any req_cv;
  std::deque<Request*> requests GPUPOOL_GUARDED_BY(req_mu);

  // Set before the thread starts (set_node_work), read by it unlocked.
  NodeWork node_work;

  // The tracer (GPUPOOL_TRACE_FILE, or the program's gpupool_trace_start):
  // made once, then only restarted, never replaced; whether it traces now is
  // the recorder's (Recorder::tracing). Set, as the recorder is, under
  // round_mu (so a fork sees it before or after, never between its
  // handlers) and work_mu.
  std::atomic<trace::Tracer*> tracer{nullptr};
  // The pool's observer, when sites, a trace or leaks are on.
  std::atomic<Recorder*> recorder{nullptr};
  sites::Sites* sites = nullptr;  // GPUPOOL_SITES; set at start
  std::atomic<bool> thread_running{false};
  // Serializes dumps and pool actions between the control thread, the
  // at-exit dump and the C API. The exit handler waits for it a bounded
  // time (at_exit_locked_dump).
  Ranked<LockRank::control_work> work_mu;
  // Held by the control thread for each round of work (everything but its
  // wait for a poke), and by fork()'s prepare: the child never inherits a lock
  // or an allocator's lock that this thread took mid-round (see fork_round).
  Ranked<LockRank::control_round> round_mu;
  Ranked<LockRank::control_warnings> warn_mu;
  // Each distinct warning once, with how often it came: a program that keeps
  // swapping a signal handler repeats one warning forever. The texts are a
  // few fixed phrases filled with signal names and error strings, so the
  // list stays short however long the program runs.
  struct Warning {
    std::string text;
    std::uint64_t times = 0;
  };
  std::vector<Warning> warnings GPUPOOL_GUARDED_BY(warn_mu);
  std::string stats_path;  // %p expanded
  // The names this process may write GPUPOOL_PROMETHEUS_FILE as, in order
  // (sys/outputs.hpp), and the one it writes now: the first that no
  // other live process holds, and its number (the series' `slot`). Empty:
  // none. The file is the files thread's.
  io::NumberedNames prometheus_names;
  std::size_t prometheus_next = 0;
  std::string prometheus_path;
  long prometheus_slot = 0;
  stats::PromSource prometheus_source;  // the labels every series has
  io::HeldFile prometheus_file;
  std::atomic<std::uint64_t> dumps_dropped{0};
  std::atomic<std::uint64_t> prometheus_dropped{0};  // updates of the Prometheus file that failed
};
// The room's state (Runtime::control, made with the runtime): nullptr before
// the runtime exists, and when gpupool is disabled.
inline State* state() {
  Runtime* rt = runtime_if_started();
  return rt ? rt->control : nullptr;
}

// Logged as a warning the first time and kept for the dumps' warnings; a
// repeat only counts ("... (3 times)" in the dumps).
void add_warning(const std::string& w);

// signals.cpp
void install_handlers(const config::Config& cfg);
// Says once when the program replaced (or restored) one of our handlers.
void check_handlers();
// Wakes the control thread. Async-signal-safe.
void poke();
// The pokes so far; wait_for_poke sleeps until another comes (or timeout).
std::uint32_t pokes_seen();
void wait_for_poke(std::uint32_t seen, std::uint64_t timeout_ns);
// The requests for an action since the last call (coalesced).
unsigned take_requests(Action action);
// Our handler is the one installed for signo.
bool handler_installed(int signo);

// thread.cpp
void start_thread(Runtime& rt);

// server.cpp
// Binds the control socket; on the files thread.
void build_listen(State& st);
// Starts the server thread on the socket build_listen bound.
void start_server(Runtime& rt);
// Removes the socket's file, at exit.
void remove_socket_file(State& st);
// The control thread: answers the requests the server thread queued.
void answer_requests(Runtime& rt);
bool requests_waiting();

// control.cpp
bool dump_locked(State& st, Runtime& rt, const char* reason) GPUPOOL_REQUIRES(st.work_mu);
// Takes st.work_mu.
void write_prometheus(Runtime& rt);

}  // namespace gpupool::control
