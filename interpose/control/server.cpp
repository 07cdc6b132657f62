// The control socket (socket.hpp has its names and protocol). The control
// thread never waits for one client: requests and answers are non-blocking,
// with deadlines, and other users are refused as they connect, before
// anything of theirs is read.
#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>

#include "config/log.hpp"
#include "interpose/control/internal.hpp"
#include "interpose/control/socket.hpp"
#include "interpose/node/node.hpp"

namespace gpupool::control {
namespace {

constexpr std::uint64_t kRequestTimeoutNs = 2'000 * kMs;  // a client's whole request line
constexpr std::size_t kMaxClients = 8;  // past this, the oldest is dropped
// Other users' (GPUPOOL_NEIGHBOURS=all) may take at most this many: their
// connections push out their own oldest, never the user's.
constexpr std::size_t kMaxForeignClients = 4;
constexpr std::size_t kMaxRequest = 512;

std::string held_summary(const Stats& before, const Stats& after) {
  return "released " +
         std::to_string(before.held_blocks - std::min(before.held_blocks, after.held_blocks)) +
         " held blocks (" +
         stats::human_bytes(before.held_bytes - std::min(before.held_bytes, after.held_bytes)) +
         "); now held: " + std::to_string(after.held_blocks) + " blocks, " +
         stats::human_bytes(after.held_bytes) + "\n";
}

std::string handle_request(Runtime& rt, std::string req, bool foreign) {
  while (!req.empty() && (req.back() == '\n' || req.back() == '\r' || req.back() == ' '))
    req.pop_back();
  if (foreign && req.rfind("release ", 0) != 0)
    return "error denied another user's process may only ask for a release\n";
  if (req == "ping") return "ok\n";
  if (req == "stats") return "ok\n" + render(rt, false, "request");
  if (req == "stats json") return "ok\n" + render(rt, true, "request");
  if (req == "free-held" || req == "stop-holding") {
    const Stats before = rt.pool.totals();
    const bool ok = req == "free-held" ? free_held(rt) : stop_holding(rt);
    if (!ok) return "error exiting the process is exiting\n";
    return "ok\n" + held_summary(before, rt.pool.totals()) +
           (req == "stop-holding" ? "holding stopped: freed blocks are now released at once\n"
                                  : "");
  }
  if (req.rfind("release ", 0) == 0) {  // another gpupool process ran out of memory
    std::unique_lock lock(g_state->work_mu);
    if (exiting()) return "error exiting the process is exiting\n";
    return node::answer_release(rt, std::string_view(req).substr(8), foreign);
  }
  return "error bad-request unknown command '" + req.substr(0, 64) + "'\n";
}

}  // namespace

// The control socket, under the usual name or, when another process holds
// that, under a random one (control_socket.hpp).
void build_listen(State& st) {
  st.listen.forget();
  if (st.listen_builds >= kMaxRebuilds) return;
  ++st.listen_builds;
  io::OwnedFd fd =
      io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
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

// New connections: another user's is refused at once, before anything of
// theirs is read, unless GPUPOOL_NEIGHBOURS=all lets it ask for a release;
// the others join the clients (the oldest dropped past the limit).
void accept_clients(State& st) {
  const bool all_users = st.rt && st.rt->config.neighbours == config::Neighbours::all;
  for (int n = 0; n < 16 && st.listen.ours(); ++n) {
    io::OwnedFd c = io::OwnedFd::adopt(
        accept4(st.listen.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c.valid()) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    const bool known = getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0;
    const bool foreign = known && cred.uid != geteuid();
    if (!known || (foreign && !all_users)) {
      const std::string msg = "error denied gpupool answers only its own user (uid " +
                              std::to_string(geteuid()) + ")\n";
      ssize_t ignored = ::send(c.get(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      (void)ignored;
      log().info("control socket: refused a connection from uid {}", cred.uid);
      continue;  // closed by c's destructor
    }
    const auto oldest_foreign = std::find_if(st.clients.begin(), st.clients.end(),
                                             [](const Client& x) { return x.foreign; });
    const std::size_t foreign_now = static_cast<std::size_t>(std::count_if(
        st.clients.begin(), st.clients.end(), [](const Client& x) { return x.foreign; }));
    if (foreign && foreign_now >= kMaxForeignClients) {
      st.clients.erase(oldest_foreign);
    } else if (st.clients.size() >= kMaxClients) {
      log().info("control socket: {} clients at once; dropping the oldest", kMaxClients);
      st.clients.erase(oldest_foreign != st.clients.end() ? oldest_foreign : st.clients.begin());
    }
    Client cl;
    cl.fd = std::move(c);
    cl.foreign = foreign;
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
      break;                                    // closed after a request without a newline
    }
    c.in = c.in.substr(0, c.in.find('\n'));
    log().debug("control socket: '{}'", c.in);
    c.out = handle_request(rt, c.in, c.foreign);
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

}  // namespace gpupool::control
