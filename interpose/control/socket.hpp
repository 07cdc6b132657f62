// The per-process control socket, shared by the library (server, in the
// control thread) and the launcher (client).
//
// Address: a file, <socket_dir>/control.<pid>, in a directory of the user's
// that nobody else may search (0700): another user cannot connect at all,
// so cannot keep its listen queue full and shut out the user's own
// neighbours and `gpupool stats`. socket_dir is /dev/shm/gpupool-<uid> (the
// registry's default directory; /run/gpupool for root), the same in every
// session of the user. A file left by a killed process is stale (nothing
// listens): replaced by the next process of that pid, removed by the next
// process that starts.
//
// Where that directory cannot be used (another user made it first, no
// /dev/shm), and beside it where GPUPOOL_NEIGHBOURS=all lets other users ask
// for releases, the process binds the Linux abstract name
// "\0gpupool.<euid>.<pid>", which any user can reach. Abstract names belong
// to nobody, so anyone can bind a future process's name first: then the
// process binds "\0gpupool.<euid>.<pid>.<random>" instead, and clients find
// it in /proc/net/unix. Both ends check the other with SO_PEERCRED: the
// server refuses other users (unless GPUPOOL_NEIGHBOURS=all, and then
// answers them only a release) as it accepts, before reading anything; the
// client only trusts a socket held by the pid it asked for, running as its
// own user (a squatter can at worst make a request fail, never answer it).
//
// Protocol: the client sends one line within 2 s: "stats", "stats json",
// "free-held", "stop-holding", "ping", or "release GPU-<uuid> <bytes>" from
// another gpupool process that ran out of memory on that GPU, optionally
// after "by <ns> ", a deadline in CLOCK_MONOTONIC nanoseconds (one clock for
// every process of the node): a request the process has not begun by then
// is answered "error expired" and not carried out, so a client that gave
// up changed nothing (a stopped process continued later, say). The server
// answers "ok\n" followed by the body, or "error <code> <message>\n"
// (codes: denied, bad-request, exiting, expired), and closes the
// connection.
#pragma once

#include <errno.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <string>
#include <unordered_set>
#include <vector>

#include "config/io.hpp"

namespace gpupool::control {

// The abstract name without its leading NUL ("gpupool.1000.4242"), with
// ".<suffix>" when suffix is not empty.
inline std::string socket_name(unsigned uid, long pid, const std::string& suffix = {}) {
  std::string n = "gpupool." + std::to_string(uid) + "." + std::to_string(pid);
  if (!suffix.empty()) n += "." + suffix;
  return n;
}

// The directory of the user's control socket files. Root's in /run, where
// only root makes entries; another user's in /dev/shm, whose sticky bit
// keeps others from replacing it once made.
inline std::string socket_dir(unsigned uid) {
  struct stat s {};
  if (uid == 0 && lstat("/run", &s) == 0 && S_ISDIR(s.st_mode) && s.st_uid == 0 &&
      !(s.st_mode & 022))
    return "/run/gpupool";
  return "/dev/shm/gpupool-" + std::to_string(uid);
}

inline std::string socket_file(const std::string& dir, long pid) {
  return dir + "/control." + std::to_string(pid);
}

// `name`: a file's path (it starts with '/') or an abstract name.
inline socklen_t socket_address(sockaddr_un* addr, const std::string& name) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  const std::size_t at = !name.empty() && name[0] == '/' ? 0 : 1;
  const std::size_t n = std::min(name.size(), sizeof addr->sun_path - 1);
  std::memcpy(addr->sun_path + at, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + at + n);
}

// A connection to a process's control socket (reach), or why there is none.
struct Reached {
  io::OwnedFd fd;
  int error = ECONNREFUSED;  // connect()'s, when no name was reached
  int socket_error = 0;      // socket()'s, when none could be made
  std::string squatter;      // "pid P, uid U": a name held by another process
};

// Connects to the process `pid` of `uid` under the first of `names` held by
// that very process as that user (SO_PEERCRED): a name squatter is skipped,
// never trusted. Non-blocking; a name whose listen queue is full (EAGAIN:
// the process is busy or stopped, or others keep the queue full) is tried
// again, in turn with the other full ones, until `deadline` (io::mono_ns();
// 0: each tried once): counting it as "nobody there" would make a
// neighbour see out-of-memory with memory held for it. A squatter that
// keeps its own queue full holds up no other name.
inline Reached reach(const std::vector<std::string>& names, long pid, unsigned uid,
                     std::uint64_t deadline) {
  Reached out;
  std::vector<const std::string*> busy;
  // 1: reached; 0: not there; -1: its queue is full.
  auto attempt = [&](const std::string& name) {
    io::OwnedFd fd =
        io::OwnedFd::adopt(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      out.socket_error = errno;
      return 0;
    }
    sockaddr_un addr;
    const socklen_t len = socket_address(&addr, name);
    int r;
    while ((r = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len)) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      if (errno == EAGAIN) return -1;
      if (errno != ECONNREFUSED && errno != ENOENT) out.error = errno;
      return 0;
    }
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.pid != pid ||
        cred.uid != uid) {
      out.squatter = "pid " + std::to_string(cred.pid) + ", uid " + std::to_string(cred.uid);
      return 0;
    }
    out.fd = std::move(fd);
    return 1;
  };
  for (const std::string& name : names) {
    const int r = attempt(name);
    if (r > 0) return out;
    if (r < 0) busy.push_back(&name);
  }
  std::uint64_t pause_ns = 100'000;
  while (!busy.empty()) {
    const std::uint64_t now = io::mono_ns();
    if (now >= deadline) {
      out.error = EAGAIN;
      return out;
    }
    const timespec pause{0, static_cast<long>(std::min(pause_ns, deadline - now))};
    nanosleep(&pause, nullptr);
    pause_ns = std::min<std::uint64_t>(pause_ns * 2, 5'000'000);
    for (std::size_t i = 0; i < busy.size();) {
      const int r = attempt(*busy[i]);
      if (r > 0) return out;
      if (r == 0) busy.erase(busy.begin() + static_cast<std::ptrdiff_t>(i));
      else ++i;
    }
  }
  return out;
}

// A request line with its deadline (CLOCK_MONOTONIC ns; 0: none).
inline std::string request_line(const std::string& request, std::uint64_t deadline) {
  return (deadline ? "by " + std::to_string(deadline) + " " : std::string()) + request + "\n";
}

// A line's request, and its deadline in *deadline (0 when it has none).
inline std::string_view split_request(std::string_view line, std::uint64_t* deadline) {
  *deadline = 0;
  if (line.rfind("by ", 0) != 0) return line;
  const char* last = line.data() + line.size();
  std::uint64_t d = 0;
  const auto [p, ec] = std::from_chars(line.data() + 3, last, d);
  if (ec != std::errc() || p == last || *p != ' ') return line;
  *deadline = d;
  return line.substr(static_cast<std::size_t>(p + 1 - line.data()));
}

// The abstract names of the gpupool control sockets on the node (from
// /proc/net/unix, without the leading '@'), with the uid and pid they name.
// Read with read(2), not iostreams: the library uses this too, and iostreams
// would pull the locale machinery into every process it is preloaded into.
struct SocketName {
  unsigned uid = 0;
  long pid = 0;
  std::string name;
};
inline std::vector<SocketName> listed_sockets() {
  std::string table;
  const int fd = ::open("/proc/net/unix", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[8192];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0 && table.size() < (64u << 20))
      table.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
  }
  // "gpupool.<uid>.<pid>" or "gpupool.<uid>.<pid>.<suffix>"
  auto number = [](std::string_view& v, unsigned long long* out) {
    std::size_t i = 0;
    unsigned long long x = 0;
    while (i < v.size() && i < 19 && v[i] >= '0' && v[i] <= '9') x = x * 10 + unsigned(v[i++] - '0');
    if (i == 0) return false;
    v.remove_prefix(i);
    *out = x;
    return true;
  };
  std::vector<SocketName> out;
  std::unordered_set<std::string> seen;
  std::size_t pos = 0;
  while (pos < table.size()) {
    std::size_t eol = table.find('\n', pos);
    if (eol == std::string::npos) eol = table.size();
    const std::string_view line(table.data() + pos, eol - pos);
    pos = eol + 1;
    const std::size_t at = line.rfind(' ');
    if (at == std::string_view::npos) continue;
    std::string_view path = line.substr(at + 1);
    if (path.compare(0, 9, "@gpupool.") != 0) continue;
    const std::string name(path.substr(1));
    path.remove_prefix(9);
    unsigned long long uid = 0, pid = 0;
    if (!number(path, &uid) || path.empty() || path[0] != '.') continue;
    path.remove_prefix(1);
    if (!number(path, &pid) || (!path.empty() && path[0] != '.')) continue;
    if (uid > UINT32_MAX || pid == 0 || pid > LONG_MAX) continue;
    // Each name once (a listening socket's accepted and queued connections
    // list its name too), through a set: a process may squat thousands of
    // names, and a scan of `out` per name would grow with their square.
    if (seen.insert(name).second)
      out.push_back({static_cast<unsigned>(uid), static_cast<long>(pid), name});
  }
  return out;
}

// Every address the process's socket may have: its file, then the usual
// abstract name, then the fallback names listed in /proc/net/unix.
inline std::vector<std::string> socket_candidates(unsigned uid, long pid) {
  std::vector<std::string> out;
  // The file first, if its directory is uid's own and nobody else may
  // write there (a socket planted in another user's directory of that name
  // could keep its queue full to hold us up).
  const std::string dir = socket_dir(uid);
  struct stat s {};
  if (lstat(dir.c_str(), &s) == 0 && S_ISDIR(s.st_mode) && s.st_uid == uid && !(s.st_mode & 022))
    out.push_back(socket_file(dir, pid));
  const std::string usual = socket_name(uid, pid);
  out.push_back(usual);
  for (SocketName& n : listed_sockets())
    if (n.uid == uid && n.pid == pid && n.name != usual) out.push_back(std::move(n.name));
  return out;
}

}  // namespace gpupool::control
