// gpupool stats | free-held | stop-holding PID: one request over the
// process's control socket (interpose/control/socket.hpp).
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.hpp"
#include "interpose/control/socket.hpp"
#include "interpose/node/registry.hpp"
#include "launcher/launcher.hpp"

namespace gpupool::launcher {
namespace {

const char kStatsHelp[] =
    "Usage: gpupool stats PID [--json] [--timeout SECONDS]\n"
    "\n"
    "Print the pool statistics of process PID (a process of this user running\n"
    "gpupool, through `gpupool run` or a plain LD_PRELOAD) as a table, or as one\n"
    "JSON object (docs/stats-schema.json) with --json.\n";

const char kFreeHeldHelp[] =
    "Usage: gpupool free-held PID [--timeout SECONDS]\n"
    "       gpupool free-held --all [--device UUID] [--timeout SECONDS]\n"
    "\n"
    "Release every block process PID's pool holds (freed by the program, kept\n"
    "for reuse). The pool keeps holding blocks freed afterwards. --all asks\n"
    "every gpupool process of this user on the node (`gpupool ps`); with\n"
    "--device, only their blocks on that GPU (GPU-... as `gpupool ps` and\n"
    "nvidia-smi -L show it), or their pinned host memory (host).\n";

const char kStopHoldingHelp[] =
    "Usage: gpupool stop-holding PID [--timeout SECONDS]\n"
    "\n"
    "Release every held block of process PID and stop holding: blocks the\n"
    "program frees from now on go straight back to the driver.\n";

bool parse_pid(const std::string& s, long* pid) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *pid = std::strtol(s.c_str(), nullptr, 10);
  return *pid > 0;
}

std::optional<unsigned> process_euid(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("Uid:", 0) == 0) {
      std::istringstream ss(line.substr(4));
      unsigned real = 0, effective = 0;
      if (ss >> real >> effective) return effective;
    }
  return std::nullopt;
}

// 1: libgpupool is mapped, 0: not, -1: cannot tell (maps unreadable).
int has_gpupool_mapped(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/maps");
  if (!f) return -1;
  std::string line;
  bool any = false;
  while (std::getline(f, line)) {
    any = true;
    if (line.find("libgpupool") != std::string::npos) return 1;
  }
  return any ? 0 : -1;
}

std::uint64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000 + std::uint64_t(ts.tv_nsec) / 1000000;
}

int talk(long pid, const std::string& request, double timeout_s, bool quiet_ok_line) {
  const std::string who = "process " + std::to_string(pid);
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
    std::fprintf(stderr, "%s: no such process: %ld\n", kProg, pid);
    return kNoProcess;
  }
  const auto euid = process_euid(pid);
  if (!euid) {
    std::fprintf(stderr, "%s: no such process: %ld\n", kProg, pid);
    return kNoProcess;
  }
  if (*euid != geteuid()) {
    std::fprintf(stderr,
                 "%s: permission denied: %s belongs to uid %u; gpupool only talks to processes "
                 "of the same user (run this as that user)\n",
                 kProg, who.c_str(), *euid);
    return kDenied;
  }
  // The process's socket under any of its names, held by that very process
  // as this user: a name squatter is skipped, never trusted.
  int fd = -1;
  int connect_error = ECONNREFUSED;
  std::string squatter;
  for (const std::string& name : gpupool::control::socket_candidates(geteuid(), pid)) {
    const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) {
      std::fprintf(stderr, "%s: socket: %s\n", kProg, std::strerror(errno));
      return kFailed;
    }
    sockaddr_un addr;
    const socklen_t len = gpupool::control::socket_address(&addr, name);
    if (connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      if (errno != ECONNREFUSED && errno != ENOENT) connect_error = errno;
      close(s);
      continue;
    }
    ucred cred{};
    socklen_t clen = sizeof cred;
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.pid != pid ||
        cred.uid != geteuid()) {
      squatter = "pid " + std::to_string(cred.pid) + ", uid " + std::to_string(cred.uid);
      close(s);
      continue;
    }
    fd = s;
    break;
  }
  if (fd < 0) {
    if (!squatter.empty())
      std::fprintf(stderr,
                   "%s: note: the usual control socket name of %s is held by another "
                   "process (%s); not trusting it\n",
                   kProg, who.c_str(), squatter.c_str());
    if (connect_error != ECONNREFUSED) {
      std::fprintf(stderr, "%s: cannot reach %s: %s\n", kProg, who.c_str(),
                   std::strerror(connect_error));
      return kFailed;
    }
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::fprintf(stderr, "%s: no such process: %ld\n", kProg, pid);
      return kNoProcess;
    }
    const int mapped = has_gpupool_mapped(pid);
    if (mapped == 1) {
      std::fprintf(stderr,
                   "%s: %s has gpupool loaded but idle: its control starts at the program's "
                   "first GPU call (or gpupool is disabled there)\n",
                   kProg, who.c_str());
      return kIdle;
    }
    if (mapped < 0) {
      std::fprintf(stderr, "%s: permission denied: cannot inspect %s\n", kProg, who.c_str());
      return kDenied;
    }
    std::fprintf(stderr, "%s: %s is not running gpupool (libgpupool.so is not loaded)\n", kProg,
                 who.c_str());
    return kNotGpupool;
  }
  const std::string line = request + "\n";
  // A refusal may already be waiting even if the send fails: read it.
  const bool sent =
      send(fd, line.data(), line.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(line.size());
  const int send_errno = errno;
  std::string reply;
  const std::uint64_t deadline = now_ms() + static_cast<std::uint64_t>(timeout_s * 1000);
  for (;;) {
    const std::uint64_t now = now_ms();
    if (now >= deadline) {
      close(fd);
      std::fprintf(stderr, "%s: no answer from %s within %gs (is it stopped or hung?)\n", kProg,
                   who.c_str(), timeout_s);
      return kTimeout;
    }
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, static_cast<int>(deadline - now));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[65536];
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    // ECONNRESET after the answer: the process closed without reading all
    // we sent (a refusal is sent before anything is read).
    if (n <= 0) break;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  close(fd);
  const auto nl = reply.find('\n');
  const std::string status = reply.substr(0, nl);
  const std::string body = nl == std::string::npos ? "" : reply.substr(nl + 1);
  if (status == "ok") {
    (void)quiet_ok_line;
    std::fwrite(body.data(), 1, body.size(), stdout);
    return kOk;
  }
  if (status.rfind("error denied", 0) == 0) {
    std::fprintf(stderr, "%s: permission denied by %s: %s\n", kProg, who.c_str(),
                 status.substr(13).c_str());
    return kDenied;
  }
  if (status.empty() && !sent) {
    std::fprintf(stderr, "%s: cannot send to %s: %s\n", kProg, who.c_str(),
                 std::strerror(send_errno));
    return kFailed;
  }
  if (status.empty()) {
    std::fprintf(stderr, "%s: %s closed the connection without answering\n", kProg, who.c_str());
    return kFailed;
  }
  std::fprintf(stderr, "%s: %s answered: %s\n", kProg, who.c_str(),
               status.rfind("error ", 0) == 0 ? status.substr(6).c_str() : status.c_str());
  return kFailed;
}

}  // namespace

const char* pid_help(const std::string& cmd) {
  if (cmd == "stats") return kStatsHelp;
  if (cmd == "free-held") return kFreeHeldHelp;
  if (cmd == "stop-holding") return kStopHoldingHelp;
  return nullptr;
}

int cmd_pid(const std::string& cmd, int argc, char** argv) {
  const char* help = cmd == "stats"       ? kStatsHelp
                     : cmd == "free-held" ? kFreeHeldHelp
                                          : kStopHoldingHelp;
  bool json = false, all = false;
  double timeout = 5;
  std::optional<long> pid;
  std::optional<node::Uuid> device;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (is_help(a)) {
      std::fputs(help, stdout);
      return kOk;
    }
    // "--name VALUE" or "--name=VALUE": true when `a` is that option, with
    // v set, or `bad` set to the usage error when the value is missing.
    std::string v;
    int bad = 0;
    auto value_of = [&](const std::string& name, const char* what) {
      if (a.rfind(name + "=", 0) == 0) {
        v = a.substr(name.size() + 1);
        return true;
      }
      if (a != name) return false;
      if (i + 1 >= argc) bad = usage_error(cmd + ": " + name + " needs " + what, cmd.c_str());
      else v = argv[++i];
      return true;
    };
    if (a == "--json" && cmd == "stats") {
      json = true;
    } else if (a == "--all" && cmd == "free-held") {
      all = true;
    } else if (cmd == "free-held" && value_of("--device", "a GPU UUID")) {
      if (bad) return bad;
      node::Uuid u;
      if (!node::parse_uuid(v, &u))
        return usage_error(cmd + ": --device: '" + v + "' is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) nor host", cmd.c_str());
      device = u;
    } else if (value_of("--timeout", "a value")) {
      if (bad) return bad;
      char* end = nullptr;
      timeout = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(timeout > 0) || timeout > 3600)
        return usage_error(
            cmd + ": --timeout: '" + v + "' is not a number of seconds (0 < s <= 3600)",
            cmd.c_str());
    } else if (!a.empty() && a[0] == '-') {
      return usage_error(cmd + ": unknown option '" + a + "'", cmd.c_str());
    } else {
      long p;
      if (pid) return usage_error(cmd + ": more than one PID given", cmd.c_str());
      if (!parse_pid(a, &p))
        return usage_error(cmd + ": '" + a + "' is not a process id", cmd.c_str());
      pid = p;
    }
  }
  if (all && pid) return usage_error(cmd + ": --all and a PID given", cmd.c_str());
  if (device && !all) return usage_error(cmd + ": --device goes with --all", cmd.c_str());
  if (all) {
    std::vector<node::ProcessEntry> procs;
    if (!registry_processes(&procs)) return kFailed;
    const std::string req = device ? "release " + node::uuid_text(*device) + " " +
                                         std::to_string(UINT64_MAX)
                                   : std::string("free-held");
    int worst = kOk;
    for (const auto& p : procs) {
      if (device) {
        bool there = false;
        for (const auto& d : p.devices) there = there || d.uuid == *device;
        if (!there) continue;
      }
      std::printf("process %ld (%s): ", p.pid, p.command.c_str());
      std::fflush(stdout);
      const int r = talk(p.pid, req, timeout, true);
      if (r != kOk) worst = kFailed;
    }
    if (procs.empty()) std::printf("no gpupool process of this user on this node\n");
    return worst;
  }
  if (!pid) return usage_error(cmd + ": no PID given", cmd.c_str());
  std::string request = cmd == "stats" ? (json ? "stats json" : "stats") : cmd;
  return talk(*pid, request, timeout, false);
}

// ---------------------------------------------------------------- env

}  // namespace gpupool::launcher
