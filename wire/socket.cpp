#include "wire/socket.hpp"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstring>
#include <unordered_set>

namespace gpupool::wire {

std::string socket_name(unsigned uid, long pid, const std::string& suffix) {
  std::string n = "gpupool." + std::to_string(uid) + "." + std::to_string(pid);
  if (!suffix.empty()) n += "." + suffix;
  return n;
}

std::string socket_dir(unsigned uid) {
  struct stat s {};
  if (uid == 0 && lstat("/run", &s) == 0 && S_ISDIR(s.st_mode) && s.st_uid == 0 &&
      !(s.st_mode & 022))
    return "/run/gpupool";
  return "/dev/shm/gpupool-" + std::to_string(uid);
}

std::string socket_file(const std::string& dir, long pid) {
  return dir + "/control." + std::to_string(pid);
}

socklen_t socket_address(sockaddr_un* addr, const std::string& name) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  const std::size_t at = !name.empty() && name[0] == '/' ? 0 : 1;
  const std::size_t n = std::min(name.size(), sizeof addr->sun_path - 1);
  std::memcpy(addr->sun_path + at, name.data(), n);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + at + n);
}

Reached reach(const std::vector<std::string>& names, long pid, unsigned uid,
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
    while ((r = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len)) != 0 &&
           errno == EINTR) {
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

bool wait_for(int fd, short events, std::uint64_t deadline) {
  for (;;) {
    const std::uint64_t now = io::mono_ns();
    if (now >= deadline) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>((deadline - now) / 1'000'000 + 1));
    if (r > 0) return (p.revents & (events | POLLHUP)) != 0;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool send_all(int fd, std::string_view data, std::uint64_t deadline) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n > 0) sent += static_cast<std::size_t>(n);
    else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, deadline)) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string request_line(const std::string& request, std::uint64_t deadline) {
  return (deadline ? "by " + std::to_string(deadline) + " " : std::string()) + request + "\n";
}

std::string_view split_request(std::string_view line, std::uint64_t* deadline) {
  *deadline = 0;
  if (line.rfind("by ", 0) != 0) return line;
  const char* last = line.data() + line.size();
  std::uint64_t d = 0;
  const auto [p, ec] = std::from_chars(line.data() + 3, last, d);
  if (ec != std::errc() || p == last || *p != ' ') return line;
  *deadline = d;
  return line.substr(static_cast<std::size_t>(p + 1 - line.data()));
}

std::vector<SocketName> listed_sockets() {
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
    while (i < v.size() && i < 19 && v[i] >= '0' && v[i] <= '9')
      x = x * 10 + unsigned(v[i++] - '0');
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

std::vector<std::string> socket_candidates(unsigned uid, long pid) {
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

}  // namespace gpupool::wire
