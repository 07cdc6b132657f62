// Asking another gpupool process for its held memory, over its control
// socket (wire/socket.hpp: names and protocol).
// Non-blocking throughout, bounded by the caller's deadline: the caller is a
// program thread whose allocation failed.
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <set>
#include <string>
#include <vector>

#include "interpose/node/internal.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "wire/socket.hpp"

namespace gpupool::node {
namespace {

// The bytes an answer says were released: "ok\nreleased <bytes>\n"; any
// other answer (a refusal, "error denied ...") says none.
std::size_t released_in(const std::string& answer) {
  const std::string key = "ok\nreleased ";
  std::uint64_t got = 0;
  if (answer.compare(0, key.size(), key) == 0)
    std::from_chars(answer.data() + key.size(), answer.data() + answer.size(), got);
  return static_cast<std::size_t>(std::min<std::uint64_t>(got, SIZE_MAX));
}

std::size_t ask_release_here(long pid, unsigned uid, const wire::DeviceKey& key, std::size_t bytes,
                             std::uint64_t deadline) {
  const io::OwnedFd fd = wire::reach(wire::socket_candidates(uid, pid), pid, uid, deadline).fd;
  if (!fd.valid()) return 0;
  // Dropped by a holder that gets to it after we gave up (stopped, busy).
  const std::string req =
      wire::request_line("release " + wire::key_text(key) + " " + std::to_string(bytes), deadline);
  if (!wire::send_all(fd.get(), req, deadline)) return 0;
  std::string in;
  char buf[256];
  for (;;) {
    const ssize_t n = ::recv(fd.get(), buf, sizeof buf, 0);
    if (n > 0) {
      in.append(buf, static_cast<std::size_t>(n));
      if (in.size() > 4096) return 0;
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    if (errno != EAGAIN || !wire::wait_for(fd.get(), POLLIN, deadline)) return 0;
  }
  return released_in(in);
}

}  // namespace

// The sockets are made and used on a thread of gpupool's private
// descriptor table (sys/io.hpp), one of their own: the caller is the
// program's allocating thread, and the wait must not hold up gpupool's
// other files.
std::size_t ask_release(long pid, unsigned uid, const wire::DeviceKey& key, std::size_t bytes,
                        std::uint64_t deadline) {
  std::size_t got = 0;
  io::in_private_own_thread([&] { got = ask_release_here(pid, uid, key, bytes, deadline); });
  return got;
}

// Other users' processes, all at once: we cannot see what they hold, so
// each is asked; one that does not answer (stopped, busy) must not use up
// the wait the others could have answered in. Each releases up to `bytes`.
// Each process is asked once: a process may bind any number of names under
// its own uid and pid (the owner check passes them all), and those must not
// take the places of the processes that hold memory.
namespace {

std::size_t ask_release_all_here(const std::vector<Target>& targets, const wire::DeviceKey& key,
                                 std::size_t bytes, std::uint64_t deadline) {
  struct Asked {
    io::OwnedFd fd;
    std::string in;
  };
  std::vector<Asked> asked;
  std::set<std::pair<unsigned, long>> reached;  // (uid, pid) asked
  const std::string req =
      wire::request_line("release " + wire::key_text(key) + " " + std::to_string(bytes), deadline);
  // Connects to t and sends the request; false when its queue is full
  // (busy: tried again while the wait lasts).
  auto ask_one = [&](const Target& t) {
    io::OwnedFd fd =
        io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return true;
    // Once, not waiting: one process's full queue must not use up the wait
    // the others could have answered in.
    sockaddr_un addr;
    const socklen_t len = wire::socket_address(&addr, t.name);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return errno != EAGAIN;
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid != t.pid ||
        cred.uid != t.uid)
      return true;
    // A few dozen bytes into an empty socket buffer: all or nothing.
    if (::send(fd.get(), req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size()))
      return true;
    reached.insert({t.uid, t.pid});
    asked.push_back({std::move(fd), {}});
    return true;
  };
  std::vector<const Target*> busy;
  for (const Target& t : targets) {
    if (asked.size() + busy.size() >= 256) break;
    if (reached.count({t.uid, t.pid})) continue;
    if (!ask_one(t)) busy.push_back(&t);
  }
  std::size_t released = 0;
  std::vector<pollfd> fds;
  // Once enough is released, a process that has not answered (stopped,
  // busy in a long driver call) must not hold up the program: the requests
  // are sent, late answers change nothing.
  while (released < bytes) {
    const std::uint64_t now = io::mono_ns();
    if (now >= deadline) break;
    std::erase_if(busy, [&](const Target* t) {
      return reached.count({t->uid, t->pid}) || ask_one(*t);
    });
    fds.clear();
    for (const Asked& a : asked)
      if (a.fd.valid()) fds.push_back({a.fd.get(), POLLIN, 0});
    if (fds.empty() && busy.empty()) break;
    // While some queue is full, looked at again every 2 ms.
    const std::uint64_t wait_ms =
        std::min<std::uint64_t>((deadline - now) / 1'000'000 + 1, busy.empty() ? 60'000 : 2);
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (r < 0 && errno != EINTR) break;
    for (Asked& a : asked) {
      if (!a.fd.valid()) continue;
      char buf[256];
      bool done = false;
      for (;;) {
        const ssize_t n = ::recv(a.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0 && a.in.size() < 4096) {
          a.in.append(buf, static_cast<std::size_t>(n));
          continue;
        }
        done = n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR) || n > 0;
        break;
      }
      if (!done) continue;
      const std::size_t got = released_in(a.in);
      released += std::min(got, SIZE_MAX - released);
      a.fd = {};
    }
  }
  return released;
}

}  // namespace

std::size_t ask_release_all(const std::vector<Target>& targets, const wire::DeviceKey& key,
                            std::size_t bytes, std::uint64_t deadline) {
  std::size_t got = 0;
  io::in_private_own_thread([&] { got = ask_release_all_here(targets, key, bytes, deadline); });
  return got;
}

}  // namespace gpupool::node
