// The control socket (wire/socket.hpp has its names and protocol). Its own
// thread, in gpupool's private descriptor table (sys/io.hpp), accepts
// and reads: its descriptors never take a number of the program's. It
// never waits for one client: requests and answers are non-blocking, with
// deadlines, and other users are refused as they connect, before anything
// of theirs is read. A complete request goes to the control thread, which
// may call the driver (this thread must not), and the answer comes back.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "interpose/control/internal.hpp"
#include "sys/log.hpp"
#include "wire/socket.hpp"

namespace gpupool::control {
namespace {

constexpr std::uint64_t kRequestTimeoutNs = 2'000 * kMs;  // a client's whole request line
// Past this, a client that has not sent a whole request is dropped: the
// oldest of the process with most such, so a client of the user's that
// keeps connections open without asking (a runaway loop) pushes out its
// own, never one that asked (its request is read as it is accepted), nor
// another process's that has not sent its line yet.
constexpr std::size_t kMaxClients = 64;
// Other users' (GPUPOOL_NEIGHBOURS=all) may take at most this many: their
// connections push out their own oldest, never the user's.
constexpr std::size_t kMaxForeignClients = 4;
constexpr std::size_t kMaxRequest = 512;
constexpr int kAcceptsPerRound = 32;  // then the clients' turn
// A line about refused, dropped or timed-out clients at most this often
// for each, with how many there were: a flood of connections costs a line
// per interval, not one per connection.
constexpr std::uint64_t kQuietNs = 10'000 * kMs;
// Without a private table: how often a socket the program closed is bound
// again, and how long a poll() lasts before the numbers are checked again.
constexpr int kMaxRebuilds = 16;
constexpr int kSharedTablePollMs = 100;

// What a free-held or stop-holding did, as text or as one JSON object
// (`gpupool free-held PID --json`, docs/c-api.md).
std::string held_summary(const Stats& before, const Stats& after, bool holding, bool json) {
  const std::uint64_t blocks = before.held_blocks - std::min(before.held_blocks, after.held_blocks);
  const std::uint64_t bytes = before.held_bytes - std::min(before.held_bytes, after.held_bytes);
  if (json)
    return "{\"released_blocks\": " + std::to_string(blocks) +
           ", \"released_bytes\": " + std::to_string(bytes) +
           ", \"held_blocks\": " + std::to_string(after.held_blocks) +
           ", \"held_bytes\": " + std::to_string(after.held_bytes) +
           ", \"holding\": " + (holding ? "true" : "false") + "}\n";
  return "released " + std::to_string(blocks) + " held blocks (" + stats::human_bytes(bytes) +
         "); now held: " + std::to_string(after.held_blocks) + " blocks, " +
         stats::human_bytes(after.held_bytes) + "\n" +
         (holding ? "" : "holding stopped: freed blocks are now released at once\n");
}

std::string handle_request(Runtime& rt, std::string req, bool foreign, std::vector<int>* fds) {
  while (!req.empty() && (req.back() == '\n' || req.back() == '\r' || req.back() == ' '))
    req.pop_back();
  if (foreign && req.rfind("release ", 0) != 0)
    return "error denied another user's process may only ask for a release\n";
  if (req == "ping") return "ok\n";
  if (req == "stats") return "ok\n" + render(rt, false, "request");
  if (req == "stats json") return "ok\n" + render(rt, true, "request");
  const bool json = req.size() > 5 && req.compare(req.size() - 5, 5, " json") == 0;
  if (const Action a = config::action_of_verb(json ? req.substr(0, req.size() - 5) : req);
      a == kFreeHeld || a == kStopHolding) {
    const Stats before = rt.pool.totals();
    const bool ok = a == kFreeHeld ? free_held(rt) : stop_holding(rt);
    if (!ok) return "error exiting the process is exiting\n";
    return "ok\n" + held_summary(before, rt.pool.totals(), rt.pool.holding(), json);
  }
  if (req.rfind("ipc ", 0) == 0) {  // another process of the user opens a piece we exported
    const Runtime::IpcAnswer answer = rt.ipc_answer.load(std::memory_order_acquire);
    if (!answer) return "error bad-request no such export\n";
    return answer(std::string_view(req).substr(4), fds);
  }
  if (req.rfind("release ", 0) == 0 && state()->node_work.answer_release) {
    // another gpupool process ran out of memory
    UniqueLock lock(state()->work_mu);
    if (exiting()) return "error exiting the process is exiting\n";
    return state()->node_work.answer_release(rt, std::string_view(req).substr(8), foreign);
  }
  return "error bad-request unknown command '" + req.substr(0, 64) + "'\n";
}

}  // namespace

namespace {

// A socket listening at `name` (wire/socket.hpp: a file's path or an abstract
// name); invalid with errno set when it cannot be bound.
io::OwnedFd listen_at(const std::string& name) {
  io::OwnedFd fd =
      io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return fd;  // a seccomp filter's EPERM, say
  sockaddr_un addr;
  const socklen_t len = wire::socket_address(&addr, name);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(fd.get(), SOMAXCONN) != 0)
    return {};
  return fd;
}

// Nothing listens at the socket file `path` (its process has ended).
bool stale(const std::string& path) {
  const io::OwnedFd probe =
      io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return false;
  sockaddr_un addr;
  const socklen_t len = wire::socket_address(&addr, path);
  return ::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 &&
         errno == ECONNREFUSED;
}

// The files of processes that ended without removing theirs (killed): a
// look at a few dozen at each start keeps the directory from growing.
void sweep_stale(const std::string& dir, long pid) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  int looked = 0;
  while (dirent* e = readdir(d)) {
    if (++looked > 1024) break;
    const std::string_view n = e->d_name;
    if (n.rfind("control.", 0) != 0) continue;
    char* end = nullptr;
    const long other = std::strtol(e->d_name + 8, &end, 10);
    if (*end || other <= 0 || other == pid) continue;
    // A process of another pid namespace sharing the directory is alive
    // though kill() cannot see it: only a socket nobody listens on goes.
    if (kill(static_cast<pid_t>(other), 0) == 0 || errno != ESRCH) continue;
    if (const std::string path = dir + "/" + e->d_name; stale(path)) ::unlink(path.c_str());
  }
  closedir(d);
}

// The control socket's file, in the user's private directory (wire/socket.hpp),
// made (0700) if missing. Invalid, with st.socket_dir_note saying why, when
// the directory is not the user's alone or the name is held by a live
// socket; a stale file (its process was killed) is replaced.
io::OwnedFd bind_file(State& st) {
  const unsigned uid = geteuid();
  const long pid = static_cast<long>(getpid());
  const std::string dir = wire::socket_dir(uid);
  auto refuse = [&](std::string why, bool taken) {
    st.socket_dir_note = std::move(why);
    st.socket_dir_taken = taken;
    return io::OwnedFd();
  };
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return refuse("cannot create " + dir + ": " + strerror(errno), false);
  struct stat s {};
  if (lstat(dir.c_str(), &s) != 0)
    return refuse("cannot examine " + dir + ": " + strerror(errno), false);
  if (S_ISLNK(s.st_mode) || !S_ISDIR(s.st_mode) || s.st_uid != uid)
    return refuse(dir +
                      (S_ISLNK(s.st_mode)   ? " is a symbolic link"
                       : S_ISDIR(s.st_mode) ? ""
                                            : " is not a directory") +
                      " of uid " + std::to_string(s.st_uid) +
                      " (another user took its name; remove it)",
                  s.st_uid != uid);
  // Ours: nobody else may search it (a user who opened it up closes it again).
  if ((s.st_mode & 077) && ::chmod(dir.c_str(), 0700) != 0)
    return refuse("cannot make " + dir + " private: " + strerror(errno), false);
  const std::string path = wire::socket_file(dir, pid);
  io::OwnedFd fd = listen_at(path);
  if (!fd.valid() && errno == EADDRINUSE) {
    if (!stale(path)) return refuse(path + " is held by a live socket", false);
    ::unlink(path.c_str());
    fd = listen_at(path);
  }
  if (!fd.valid()) return refuse("cannot bind " + path + ": " + strerror(errno), false);
  if (lstat(path.c_str(), &s) == 0) {
    st.socket_dev.store(s.st_dev);
    st.socket_ino.store(s.st_ino);
  }
  if (st.socket_path != path) st.socket_path = path;  // only ever set once: see State
  st.socket_dir_note.clear();
  sweep_stale(dir, pid);
  return fd;
}

// The abstract name, the usual one or, when another process holds that, a
// random one (wire/socket.hpp). Invalid with st.listen_error set when none.
io::OwnedFd bind_abstract(State& st) {
  const unsigned uid = geteuid();
  const long pid = static_cast<long>(getpid());
  std::string name = wire::socket_name(uid, pid);
  io::OwnedFd fd = listen_at(name);
  if (!fd.valid() && errno == EADDRINUSE) {
    unsigned char rnd[8] = {};
    if (getrandom(rnd, sizeof rnd, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof rnd)) {
      const std::uint64_t t = io::mono_ns() ^ (std::uint64_t(pid) << 32);
      std::memcpy(rnd, &t, sizeof rnd);
    }
    char hex[17];
    for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    st.socket_taken = name;
    name = wire::socket_name(uid, pid, hex);
    fd = listen_at(name);
  }
  if (!fd.valid()) {
    st.listen_error = errno;
    return fd;
  }
  st.socket_name = name;
  return fd;
}

}  // namespace

// The control socket: its file in the user's private directory, which no
// other user can connect to; the abstract name where that cannot be made,
// and beside it where GPUPOOL_NEIGHBOURS=all lets other users ask for
// releases (wire/socket.hpp). On the files thread.
void build_listen(State& st) {
  st.listen.forget();
  st.listen_public.forget();
  st.socket_name.clear();
  const bool all_users = st.rt && st.rt->config.neighbours == config::Neighbours::all;
  st.listen = bind_file(st);
  if (!st.listen.valid() || all_users) {
    io::OwnedFd abstract = bind_abstract(st);
    (st.listen.valid() ? st.listen_public : st.listen) = std::move(abstract);
  }
  st.listen_private = io::on_private_thread();
}

// At exit: the socket's file goes with the process (if it is still ours).
void remove_socket_file(State& st) {
  st.socket_file_closing.store(true);
  struct stat s {};
  if (!st.socket_path.empty() && lstat(st.socket_path.c_str(), &s) == 0 &&
      s.st_dev == st.socket_dev.load() && s.st_ino == st.socket_ino.load())
    ::unlink(st.socket_path.c_str());
}

namespace {

// What the server thread has to say, logged after its round (fork() may
// hold the log while it waits for the round): each kind of client trouble
// at most once per kQuietNs, with how many there were meanwhile.
struct Notes {
  enum Kind { refused, dropped, timed_out, kinds };
  std::vector<std::string> lines;
  std::uint64_t unsaid[kinds] = {}, said_at[kinds] = {};
  bool said[kinds] = {};
  template <class Text>
  void add(Kind k, std::uint64_t now, Text text) {
    if (said[k] && now - said_at[k] < kQuietNs) {
      ++unsaid[k];
      return;
    }
    std::string line = text();
    if (unsaid[k])
      line += " (and " + std::to_string(unsaid[k]) + " more in the " +
              std::to_string((now - said_at[k]) / (1000 * kMs)) + " s before)";
    lines.push_back(std::move(line));
    unsaid[k] = 0;
    said_at[k] = now;
    said[k] = true;
  }
};

bool read_request(Client& c, std::uint64_t now, Notes& notes);

// New connections: another user's is refused at once, before anything of
// theirs is read, unless GPUPOOL_NEIGHBOURS=all lets it ask for a release;
// the others join the clients, with what they have sent already read.
// Past the limit a client without a whole request makes room (another
// user's, for one of theirs; see kMaxClients); where every one has asked,
// the new one is turned away.
void accept_clients(State& st, int listening, std::vector<Client>& clients, Notes& notes) {
  const bool all_users = st.rt && st.rt->config.neighbours == config::Neighbours::all;
  for (int n = 0; n < kAcceptsPerRound; ++n) {
    io::OwnedFd c =
        io::OwnedFd::adopt(accept4(listening, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c.valid()) return;
    const std::uint64_t now = io::mono_ns();
    ucred cred{};
    socklen_t len = sizeof cred;
    const bool known = getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    const bool foreign = known && cred.uid != geteuid();
    if (!known || (foreign && !all_users)) {
      const std::string msg = "error denied gpupool answers only its own user (uid " +
                              std::to_string(geteuid()) + ")\n";
      ssize_t ignored = ::send(c.get(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)ignored;
      notes.add(Notes::refused, now, [&] {
        return "control socket: refused a connection from uid " + std::to_string(cred.uid);
      });
      continue;  // closed by c's destructor
    }
    Client cl;
    cl.fd = std::move(c);
    cl.foreign = foreign;
    cl.deadline = now + kRequestTimeoutNs;
    if (!read_request(cl, now, notes)) continue;  // closed without asking
    cl.pid = known ? cred.pid : 0;
    // The oldest client that has not asked, of the process that has most
    // such clients (among other users' only, when foreign_only): a process
    // that keeps connections open without asking pushes out its own, never
    // another process's client that has not sent its line yet.
    const auto idle = [&](bool foreign_only) {
      const auto candidate = [&](const Client& x) {
        return !x.answering && (x.foreign || !foreign_only);
      };
      std::vector<pid_t> pids;
      for (const Client& x : clients)
        if (candidate(x)) pids.push_back(x.pid);
      std::sort(pids.begin(), pids.end());
      std::size_t most = 0;
      for (std::size_t i = 0, j; i < pids.size(); i = j) {
        for (j = i; j < pids.size() && pids[j] == pids[i]; ++j) {
        }
        most = std::max(most, j - i);
      }
      return std::find_if(clients.begin(), clients.end(), [&](const Client& x) {
        if (!candidate(x)) return false;
        const auto [first, last] = std::equal_range(pids.begin(), pids.end(), x.pid);
        return static_cast<std::size_t>(last - first) == most;
      });
    };
    // Clients that asked are answered within the round (or their answer's
    // 1 s), so the limits count those that have not.
    const auto waiting = [&](bool foreign_only) {
      return static_cast<std::size_t>(std::count_if(
          clients.begin(), clients.end(),
          [&](const Client& x) { return !x.answering && (x.foreign || !foreign_only); }));
    };
    const bool foreign_full = foreign && waiting(true) >= kMaxForeignClients;
    if (!cl.answering && (foreign_full || waiting(false) >= kMaxClients)) {
      auto victim = idle(true);
      if (victim == clients.end() && !foreign_full) victim = idle(false);
      notes.add(Notes::dropped, now, [&] {
        return "control socket: " +
               std::to_string(foreign_full ? kMaxForeignClients : kMaxClients) +
               (foreign_full ? " other users' clients" : " clients") + " at once; " +
               (victim == clients.end() ? "turned a new one away"
                                        : "dropped the oldest that had not asked of the process "
                                          "with most such");
      });
      if (victim == clients.end()) continue;
      clients.erase(victim);
    }
    clients.push_back(std::move(cl));
  }
}

// Reads what the client sent. False when the client is done (or given up
// on); true with c.answering set once its request line is complete.
bool read_request(Client& c, std::uint64_t now, Notes& notes) {
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
        notes.add(Notes::timed_out, now, [] {
          return "control socket: a client sent no complete request within " +
                 std::to_string(kRequestTimeoutNs / kMs) + " ms; dropped";
        });
        return false;
      }
      return true;
    }
    if (n < 0 || c.in.empty()) return false;  // an error, or closed without asking
    break;                                    // closed after a request without a newline
  }
  c.in = c.in.substr(0, c.in.find('\n'));
  c.answering = true;
  return true;
}

// The answer's first bytes with its descriptors (SCM_RIGHTS); false when
// the socket would not take them.
bool send_with_fds(Client& c) {
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 253)];
  const std::size_t n = std::min<std::size_t>(c.out_fds.size(), 253);
  iovec iov{c.out.data(), c.out.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
  cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
  for (std::size_t k = 0; k < n; ++k) {
    const int fd = c.out_fds[k].get();
    memcpy(CMSG_DATA(cm) + k * sizeof(int), &fd, sizeof fd);
  }
  const ssize_t sent = ::sendmsg(c.fd.get(), &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent <= 0) return false;
  c.sent = static_cast<std::size_t>(sent);
  c.out_fds.clear();  // the receiver has its own copies now
  return true;
}

// Sends what the socket takes. False when done (answered, or given up on).
bool send_answer(Client& c) {
  if (!c.out_fds.empty() && c.sent == 0 && !c.out.empty() && !send_with_fds(c)) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
      return io::mono_ns() < c.deadline;
    return false;
  }
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return io::mono_ns() < c.deadline;
    return false;
  }
  return false;  // answered
}

// The control thread's answer to one request; waits for it (not counted as
// private work, so fork() never waits for this wait). The request lives on
// this stack: once the control thread has taken it from the queue, it
// writes the answer here, so this returns before that only while the
// request is still queued (taken back).
// ask_control's self_pidfd when the server thread shares the program's
// descriptor table.
constexpr int kSharedTable = -2;

std::string ask_control(State& st, Client& c, int self_pidfd) {
  State::Request req;
  req.line = wire::split_request(c.in, &req.deadline);
  req.foreign = c.foreign;
  UniqueLock lock(st.req_mu);
  st.requests.push_back(&req);
  lock.unlock();
  poke();
  lock.lock();
  while (!req.done) {
    if ((exiting() || !st.thread_running.load()) && std::erase(st.requests, &req) != 0)
      return "error exiting the process is exiting\n";
    // Being answered (answer_requests always finishes one it took), or
    // still queued for a control thread that runs.
    st.req_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  if (!req.fds.empty()) {
    // The descriptors are the program's: copied into this table while the
    // control thread waits, which then closes them and touches the request
    // no more (whatever happens here: the guard ends the handoff).
    using Lock = decltype(lock);
    struct Handoff {
      State& st;
      State::Request& req;
      Lock& held;
      ~Handoff() {
        req.fds_taken = true;
        st.req_cv.notify_all();
        while (!req.fds_closed) st.req_cv.wait(held);
      }
    } handoff{st, req, lock};
    c.out_fds.clear();
    c.out_fds.reserve(req.fds.size());
    for (int fd : req.fds) {
      // In gpupool's own table, pidfd_getfd on this process (Linux 5.6);
      // sharing the program's (no unshare: a container's seccomp filter,
      // which also refuses pidfd_getfd without CAP_SYS_PTRACE), a dup.
      const int mine = self_pidfd == kSharedTable
                           ? fcntl(fd, F_DUPFD_CLOEXEC, 0)
                           : static_cast<int>(syscall(SYS_pidfd_getfd, self_pidfd, fd, 0));
      if (mine < 0) {
        const int e = self_pidfd < 0 && self_pidfd != kSharedTable ? ENOSYS : errno;
        c.out_fds.clear();
        req.answer = "error internal the descriptors could not be passed on (" +
                     std::string(self_pidfd == kSharedTable ? "dup" : "pidfd_getfd") + ": " +
                     strerror(e) + ")\n";
        break;
      }
      c.out_fds.push_back(io::OwnedFd::adopt(mine));
    }
  }
  return std::move(req.answer);
}

// The server thread's own state.
struct Server {
  std::vector<Client> clients;
  std::vector<pollfd> fds;
  Notes notes;
  // Without a private table (io.hpp) the numbers are the program's, which
  // may close them and get them back for its own files: each is checked
  // before every round, and the sockets bound again once one is gone.
  bool shared_table = false;
  int rebuilds = 0;
  std::uint64_t next_file_check = 0;
  bool file_lost_said = false;
  // This process as a pidfd, for pidfd_getfd (an answer's descriptors);
  // -1 before the first or where there are none (Linux before 5.6).
  io::OwnedFd self_pidfd;
  bool self_pidfd_tried = false;
};

constexpr std::uint64_t kFileCheckNs = 200 * kMs;

bool server_round(State& st, Server& sv);

void server_main(void* arg) {
  State& st = *static_cast<State*>(arg);
#ifdef __GLIBC__
  pthread_setname_np(pthread_self(), "gpupool-sock");
#endif
  Server sv;
  sv.shared_table = !io::on_private_thread();
  for (;;) {
    // A failure inside a round (host memory out: a client's record, a
    // request's text) costs that round, not the program: an exception
    // leaving this thread would end the process.
    try {
      if (!server_round(st, sv)) return;
    } catch (...) {
      internal_failure("gpupool's control socket thread");
      sv.clients.clear();  // their state may be half-made; they ask again
      ::poll(nullptr, 0, 10);
    }
  }
}

// The socket's file removed (a cleaner, logout with logind's RemoveIPC,
// which empties /dev/shm of the user's files) or replaced: bound again, so
// that `gpupool stats` and the user's neighbours keep reaching us. Looked
// at every kFileCheckNs.
void check_file(State& st, Server& sv, std::uint64_t now) {
  if (st.socket_path.empty() || now < sv.next_file_check || st.socket_file_closing.load()) return;
  sv.next_file_check = now + kFileCheckNs;
  struct stat s {};
  if (lstat(st.socket_path.c_str(), &s) == 0 && s.st_dev == st.socket_dev.load() &&
      s.st_ino == st.socket_ino.load())
    return;
  io::OwnedFd fd;
  {
    io::PrivateWork work;
    fd = bind_file(st);
  }
  if (fd.valid() && st.socket_file_closing.load()) {
    // The exit handler ran meanwhile and may have looked before this file
    // was there (internal.hpp).
    remove_socket_file(st);
  } else if (fd.valid()) {
    st.listen = std::move(fd);
    sv.file_lost_said = false;
    log().info("control socket: {} was removed; bound again", st.socket_path);
  } else if (!sv.file_lost_said) {
    sv.file_lost_said = true;  // tried again at the next look
    log().info("control socket: {} was removed and cannot be bound again yet ({})", st.socket_path,
               st.socket_dir_note);
  }
}

// One round of the server: waits for the sockets and their clients, reads
// requests and sends answers. False when the socket is gone for good.
bool server_round(State& st, Server& sv) {
  std::vector<Client>& clients = sv.clients;
  std::vector<pollfd>& fds = sv.fds;
  Notes& notes = sv.notes;
  if (sv.shared_table) {
    std::erase_if(clients, [](Client& c) {
      if (c.fd.ours()) return false;
      c.fd.forget();
      return true;
    });
    if (!st.listen.ours() || (st.listen_public.valid() && !st.listen_public.ours())) {
      for (io::OwnedFd* l : {&st.listen, &st.listen_public}) {
        if (l->ours()) l->close();
        else l->forget();
      }
      if (sv.rebuilds++ < kMaxRebuilds) {
        io::PrivateWork work;
        build_listen(st);
      }
      if (!st.listen.valid()) {
        log().warn(
            "control socket: closed by the program and not bound again; `gpupool "
            "stats PID` cannot reach this process any more");
        return false;
      }
      log().info("control socket: closed by the program; bound again as {}",
                 st.socket_path.empty() ? "@" + st.socket_name : st.socket_path);
    }
  }
  std::uint64_t now = io::mono_ns();
  check_file(st, sv, now);
  std::uint64_t next = st.socket_path.empty() ? UINT64_MAX : sv.next_file_check;
  fds.clear();
  fds.push_back({st.listen.get(), POLLIN, 0});
  // -1 when there is none: poll() skips it.
  fds.push_back({st.listen_public.valid() ? st.listen_public.get() : -1, POLLIN, 0});
  constexpr std::size_t kFirstClient = 2;
  for (const Client& c : clients) {
    fds.push_back({c.fd.get(), static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    next = std::min(next, c.deadline);
  }
  int timeout_ms = next == UINT64_MAX ? -1
                   : next <= now
                       ? 0
                       : static_cast<int>(std::min<std::uint64_t>((next - now) / kMs + 1, 60'000));
  if (sv.shared_table && (timeout_ms < 0 || timeout_ms > kSharedTablePollMs))
    timeout_ms = kSharedTablePollMs;
  const int r = ::poll(fds.data(), fds.size(), timeout_ms);
  if (r < 0 && errno != EINTR) return false;
  std::vector<Client*> asking;
  notes.lines.clear();
  {
    io::PrivateWork work;  // fork() waits for this, never for the answers
    now = io::mono_ns();
    std::size_t i = kFirstClient;
    std::erase_if(clients, [&](Client& c) {
      const std::size_t j = i++;
      const bool ready = r > 0 && (fds[j].revents != 0);
      if (!ready && now < c.deadline) return false;
      if (c.answering) return !send_answer(c);
      return !read_request(c, now, notes);
    });
    // New clients first: accepting moves the others (push_back, and the
    // oldest dropped past the limit), so no pointer into `clients` may
    // be held across it. Each socket gets its turn: other users flooding
    // the public one take at most kAcceptsPerRound of a round.
    for (std::size_t k = 0; k < kFirstClient; ++k)
      if (r > 0 && (fds[k].revents & POLLIN)) accept_clients(st, fds[k].fd, clients, notes);
    for (Client& c : clients)
      if (c.answering && c.out.empty()) asking.push_back(&c);
  }
  for (const std::string& n : notes.lines) log().info("{}", n);
  for (Client* c : asking) {
    log().debug("control socket: '{}'", c->in);
    std::uint64_t deadline = 0;
    if (!sv.shared_table && !sv.self_pidfd_tried &&
        wire::split_request(c->in, &deadline).substr(0, 4) == "ipc ") {
      sv.self_pidfd_tried = true;
      io::PrivateWork work;
      sv.self_pidfd = io::OwnedFd::adopt(static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0)));
    }
    c->out = ask_control(st, *c,
                         sv.shared_table         ? kSharedTable
                         : sv.self_pidfd.valid() ? sv.self_pidfd.get()
                                                 : -1);
    c->deadline = io::mono_ns() + io::kWriteTimeoutNs;
  }
  if (!asking.empty()) {
    io::PrivateWork work;
    std::erase_if(clients,
                  [](Client& c) { return c.answering && !c.out.empty() && !send_answer(c); });
  }
  return true;
}

}  // namespace

void start_server(Runtime& rt) {
  State& st = *state();
  if (!st.listen.valid()) return;
  if (!io::start_private_thread(server_main, &st))
    add_warning("control socket thread not started: `gpupool stats PID` cannot reach this process");
  (void)rt;
}

bool requests_waiting() {
  State& st = *state();
  LockGuard lock(st.req_mu);
  return !st.requests.empty();
}

// On the control thread.
void answer_requests(Runtime& rt) {
  State& st = *state();
  for (;;) {
    State::Request* req = nullptr;
    {
      LockGuard lock(st.req_mu);
      if (st.requests.empty()) return;
      req = st.requests.front();
      st.requests.pop_front();
    }
    std::string answer;
    std::vector<int> fds;
    try {
      // The client has given up (this process was stopped, or busy, past
      // the request's deadline): it said "no answer", so nothing is done.
      if (req->deadline != 0 && io::mono_ns() >= req->deadline) {
        log().debug("control socket: '{}' came past its deadline; not done", req->line);
        answer = "error expired the request's deadline passed before it could begin\n";
      } else {
        answer = handle_request(rt, req->line, req->foreign, &fds);
      }
    } catch (...) {
      internal_failure("gpupool's control socket");
      answer = "error internal gpupool failed inside (out of host memory?)\n";
    }
    UniqueLock lock(st.req_mu);
    req->answer = std::move(answer);
    req->fds = std::move(fds);
    const bool handoff = !req->fds.empty();
    req->done = true;
    st.req_cv.notify_all();
    if (!handoff) continue;
    // The server thread copies them (ask_control), then they go here. The
    // request lives until fds_closed is seen there.
    while (!req->fds_taken) st.req_cv.wait(lock);
    for (int fd : req->fds) ::close(fd);
    req->fds_closed = true;
    st.req_cv.notify_all();
  }
}

}  // namespace gpupool::control
