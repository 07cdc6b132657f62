// gpupool: run a program under the pool, and talk to a running one.
//
//   gpupool run [options] [--] PROGRAM [ARGS...]
//   gpupool stats PID [--json] | free-held PID | stop-holding PID
//   gpupool env | --version | --help | help COMMAND
//
// `run` only sets environment variables and exec()s the program, so its exit
// status and signals reach the caller unchanged.
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

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

extern char** environ;

namespace {

// Exit codes of the PID commands (documented in --help and docs/c-api.md).
enum Exit : int {
  kOk = 0,
  kFailed = 1,      // the process answered with an error, or an I/O error
  kUsage = 2,       // bad command line
  kNoProcess = 3,   // no such process
  kNotGpupool = 4,  // the process does not have libgpupool loaded
  kIdle = 5,        // loaded, but no GPU call yet: control not started
  kDenied = 6,      // another user's process
  kTimeout = 7,     // no answer in time (stopped or busy process)
};

const char* kProg = "gpupool";

const char kMainHelp[] =
    "Usage: gpupool COMMAND [ARGS...]\n"
    "\n"
    "Run GPU programs with a pooled memory allocator (CUDA and OpenCL), and\n"
    "observe or control programs running with it.\n"
    "\n"
    "Commands:\n"
    "  run [OPTIONS] [--] PROGRAM [ARGS...]  run PROGRAM with gpupool preloaded\n"
    "  stats PID [--json]                    print the pool statistics of process PID\n"
    "  free-held PID                         release the memory PID's pool holds\n"
    "  stop-holding PID                      release held memory and stop holding\n"
    "  env                                   list the GPUPOOL_* variables and values\n"
    "  help [COMMAND]                        show help for COMMAND\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help\n"
    "  -V, --version  show the version\n"
    "\n"
    "Exit status of stats, free-held, stop-holding:\n"
    "  0 success, 1 the request failed, 2 usage error, 3 no such process,\n"
    "  4 process not running gpupool, 5 gpupool loaded but idle (no GPU call\n"
    "  yet), 6 permission denied (another user's process), 7 no answer in time.\n"
    "`gpupool run` exits with PROGRAM's status (127: not found, 126: cannot run).\n";

const char kStatsHelp[] =
    "Usage: gpupool stats PID [--json] [--timeout SECONDS]\n"
    "\n"
    "Print the pool statistics of process PID (a process of this user running\n"
    "gpupool, through `gpupool run` or a plain LD_PRELOAD) as a table, or as one\n"
    "JSON object (docs/stats-schema.json) with --json.\n";

const char kFreeHeldHelp[] =
    "Usage: gpupool free-held PID [--timeout SECONDS]\n"
    "\n"
    "Release every block process PID's pool holds (freed by the program, kept\n"
    "for reuse). The pool keeps holding blocks freed afterwards.\n";

const char kStopHoldingHelp[] =
    "Usage: gpupool stop-holding PID [--timeout SECONDS]\n"
    "\n"
    "Release every held block of process PID and stop holding: blocks the\n"
    "program frees from now on go straight back to the driver.\n";

const char kEnvHelp[] =
    "Usage: gpupool env\n"
    "\n"
    "List every GPUPOOL_* variable: its value in this environment (or '-'),\n"
    "its default and what it does; then any problem with the values set.\n";

int usage_error(const std::string& msg, const char* cmd = nullptr) {
  std::fprintf(stderr, "%s: %s\nTry '%s %s--help'.\n", kProg, msg.c_str(), kProg,
               cmd ? (std::string(cmd) + " ").c_str() : "");
  return kUsage;
}

bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// ---------------------------------------------------------------- run

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  std::string p(buf);
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

std::string find_library() {
  const std::string dir = self_dir();
  const std::vector<std::string> candidates = {
#ifdef GPUPOOL_INSTALL_LIBDIR
      dir + "/../" GPUPOOL_INSTALL_LIBDIR "/libgpupool.so",
#endif
      dir + "/../lib/libgpupool.so", dir + "/../lib64/libgpupool.so",
      dir + "/../libgpupool.so",  // the build directory (build/bin/gpupool)
  };
  for (const auto& c : candidates) {
    char real[PATH_MAX];
    if (access(c.c_str(), R_OK) == 0 && realpath(c.c_str(), real)) return real;
  }
  return {};
}

bool is_sanitizer_runtime(const std::string& entry) {
  const auto slash = entry.rfind('/');
  const std::string base = slash == std::string::npos ? entry : entry.substr(slash + 1);
  for (const char* s : {"libasan", "libtsan", "libubsan", "liblsan", "libclang_rt."})
    if (base.rfind(s, 0) == 0) return true;
  return false;
}

// LD_PRELOAD with `lib` added: after sanitizer runtimes (which must come
// first), before everything else; unchanged if a libgpupool is already there.
std::string preload_value(const std::string& lib, const char* current) {
  std::vector<std::string> entries;
  if (current) {
    std::string cur(current);
    std::string item;
    for (char c : cur + " ") {
      if (c == ' ' || c == ':') {
        if (!item.empty()) entries.push_back(item);
        item.clear();
      } else {
        item += c;
      }
    }
  }
  for (const auto& e : entries)
    if (e.find("libgpupool") != std::string::npos) return current;
  std::size_t pos = 0;
  while (pos < entries.size() && is_sanitizer_runtime(entries[pos])) ++pos;
  entries.insert(entries.begin() + static_cast<long>(pos), lib);
  std::string out;
  for (const auto& e : entries) out += (out.empty() ? "" : ":") + e;
  return out;
}

std::string absolute(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  char cwd[PATH_MAX];
  if (!getcwd(cwd, sizeof cwd)) return path;
  return std::string(cwd) + "/" + path;
}

// The configuration parser's verdict on one variable: "" if fine.
std::string check_value(const std::string& name, const std::string& value) {
  const std::string entry = name + "=" + value;
  const char* envp[] = {entry.c_str(), nullptr};
  std::vector<gpupool::config::Diagnostic> diags;
  (void)gpupool::config::parse(envp, &diags);
  for (const auto& d : diags)
    if (d.variable == name && d.level >= gpupool::config::LogLevel::warn) return d.message;
  return {};
}

// `gpupool run`'s options: what each sets, and its line in the help (one
// table for both).
struct RunOption {
  const char* flag;
  const char* variable;  // nullptr: special
  bool takes_value;
  const char* fixed_value;  // for flags without a value
  bool path;                // made absolute: the program may chdir
  const char* value_name;   // in the help: "--max-held SIZE"
  const char* help;
};

const RunOption kRunOptions[] = {
    {"--max-held", "GPUPOOL_MAX_HELD", true, nullptr, false, "SIZE", "cap on held bytes (2G, 25%)"},
    {"--max-pooled", "GPUPOOL_MAX_POOLED", true, nullptr, false, "SIZE", "largest pooled request"},
    {"--release-after", "GPUPOOL_RELEASE_AFTER", true, nullptr, false, "TIME",
     "release blocks idle this long (10s)"},
    {"--reuse", "GPUPOOL_REUSE", true, nullptr, false, "safe|immediate", ""},
    {"--leading-bits", "GPUPOOL_LEADING_BITS", true, nullptr, false, "N", ""},
    {"--no-hold", "GPUPOOL_HOLD", false, "0", false, "", "start with holding stopped"},
    {"--no-probe", "GPUPOOL_PROBE", false, "0", false, "", ""},
    {"--disable", nullptr, true, nullptr, false, "WHAT",
     "cuda, cuda-host, opencl (comma-separated) or all"},
    {"--stats", "GPUPOOL_STATS_AT_EXIT", false, "1", false, "", "print stats at exit"},
    {"--stats-file", "GPUPOOL_STATS_FILE", true, nullptr, true, "FILE", "(%p: pid)"},
    {"--stats-interval", "GPUPOOL_STATS_INTERVAL", true, nullptr, false, "TIME", ""},
    {"--json", "GPUPOOL_STATS_FORMAT", false, "json", false, "", ""},
    {"--prometheus", "GPUPOOL_PROMETHEUS_FILE", true, nullptr, true, "FILE", ""},
    {"--trace", "GPUPOOL_TRACE_FILE", true, nullptr, true, "FILE",
     "record every allocation and free"},
    {"--log", "GPUPOOL_LOG", true, nullptr, false, "LEVEL", "off, error, warn, info, debug, trace"},
    {"--log-file", "GPUPOOL_LOG_FILE", true, nullptr, true, "FILE", ""},
    {"--set", nullptr, true, nullptr, false, "NAME=VALUE",
     "any GPUPOOL_* variable (see `gpupool env`)"},
};

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  else s += ' ';
  return s;
}

std::string run_help() {
  std::string h =
      "Usage: gpupool run [OPTIONS] [--] PROGRAM [ARGS...]\n"
      "\n"
      "Run PROGRAM with libgpupool.so in LD_PRELOAD (kept after any sanitizer\n"
      "runtime, before whatever LD_PRELOAD held) and GPUPOOL_* variables set from\n"
      "OPTIONS. Exits with PROGRAM's exit status.\n"
      "\n"
      "Options (each sets the variable shown; values are checked first):\n";
  auto flag_of = [](const RunOption& o) {
    return *o.value_name ? std::string(o.flag) + " " + o.value_name : std::string(o.flag);
  };
  auto var_of = [](const RunOption& o) {
    std::string v = o.variable ? o.variable : "";
    if (o.variable && o.fixed_value) v += std::string("=") + o.fixed_value;
    return v;
  };
  std::size_t flag_w = 0, var_w = 0;
  for (const RunOption& o : kRunOptions) {
    flag_w = std::max(flag_w, flag_of(o).size() + 2);
    var_w = std::max(var_w, var_of(o).size() + 2);
  }
  for (const RunOption& o : kRunOptions) {
    std::string line = "  " + pad(flag_of(o), flag_w) + pad(var_of(o), var_w) + o.help;
    while (!line.empty() && line.back() == ' ') line.pop_back();
    h += line + "\n";
  }
  h += "  " + pad("-h, --help", flag_w + var_w) + "show this help\n";
  return h;
}

int cmd_run(int argc, char** argv) {
  std::vector<std::pair<std::string, std::string>> vars;
  int i = 0;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (is_help(arg)) {
      std::fputs(run_help().c_str(), stdout);
      return kOk;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    std::string value;
    bool has_inline = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    const RunOption* opt = nullptr;
    for (const auto& o : kRunOptions)
      if (arg == o.flag) opt = &o;
    if (!opt) return usage_error("run: unknown option '" + arg + "'", "run");
    if (opt->takes_value && !has_inline) {
      if (i + 1 >= argc) return usage_error("run: option " + arg + " needs a value", "run");
      value = argv[++i];
    } else if (!opt->takes_value && has_inline) {
      return usage_error("run: option " + arg + " takes no value", "run");
    }
    if (std::string(opt->flag) == "--disable") {
      std::stringstream ss(value);
      std::string what;
      bool any = false;
      while (std::getline(ss, what, ',')) {
        any = true;
        if (what == "all") vars.emplace_back("GPUPOOL_DISABLE", "1");
        else if (what == "cuda") vars.emplace_back("GPUPOOL_CUDA", "0");
        else if (what == "cuda-host") vars.emplace_back("GPUPOOL_CUDA_HOST", "0");
        else if (what == "opencl") vars.emplace_back("GPUPOOL_OPENCL", "0");
        else
          return usage_error("run: --disable: unknown backend '" + what +
                                 "' (accepted: cuda, cuda-host, opencl, all)",
                             "run");
      }
      if (!any) return usage_error("run: --disable needs a backend", "run");
      continue;
    }
    if (std::string(opt->flag) == "--set") {
      const auto eq = value.find('=');
      if (eq == std::string::npos || eq == 0)
        return usage_error("run: --set needs NAME=VALUE, got '" + value + "'", "run");
      std::string name = value.substr(0, eq);
      if (name.rfind("GPUPOOL_", 0) != 0) name = "GPUPOOL_" + name;
      bool known = false;
      for (const auto& o : gpupool::config::options()) known |= name == o.name;
      if (!known)
        return usage_error("run: --set: " + name + " is not a gpupool variable (see `gpupool env`)",
                           "run");
      vars.emplace_back(name, value.substr(eq + 1));
      continue;
    }
    if (opt->takes_value && value.empty())
      return usage_error("run: option " + arg + " needs a non-empty value", "run");
    vars.emplace_back(opt->variable,
                      opt->takes_value ? (opt->path ? absolute(value) : value) : opt->fixed_value);
  }
  if (i >= argc) return usage_error("run: no program given", "run");
  for (const auto& [name, value] : vars) {
    const std::string why = check_value(name, value);
    if (!why.empty()) {
      std::fprintf(stderr, "%s: run: %s\n", kProg, why.c_str());
      return kUsage;
    }
  }
  const std::string lib = find_library();
  if (lib.empty()) {
    std::fprintf(stderr,
                 "%s: run: cannot find libgpupool.so next to %s (looked in ../lib and ..)\n", kProg,
                 self_dir().c_str());
    return kFailed;
  }
  for (const auto& [name, value] : vars) setenv(name.c_str(), value.c_str(), 1);
  setenv("LD_PRELOAD", preload_value(lib, getenv("LD_PRELOAD")).c_str(), 1);
  execvp(argv[i], argv + i);
  const int e = errno;
  std::fprintf(stderr, "%s: run: %s: %s\n", kProg, argv[i],
               e == ENOENT ? "command not found" : std::strerror(e));
  return e == ENOENT ? 127 : 126;
}

// ---------------------------------------------------------------- PID commands

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

int cmd_pid(const std::string& cmd, int argc, char** argv) {
  const char* help = cmd == "stats"       ? kStatsHelp
                     : cmd == "free-held" ? kFreeHeldHelp
                                          : kStopHoldingHelp;
  bool json = false;
  double timeout = 5;
  std::optional<long> pid;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (is_help(a)) {
      std::fputs(help, stdout);
      return kOk;
    }
    if (a == "--json" && cmd == "stats") {
      json = true;
    } else if (a == "--timeout" || a.rfind("--timeout=", 0) == 0) {
      std::string v;
      if (a == "--timeout") {
        if (i + 1 >= argc) return usage_error(cmd + ": --timeout needs a value", cmd.c_str());
        v = argv[++i];
      } else {
        v = a.substr(10);
      }
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
  if (!pid) return usage_error(cmd + ": no PID given", cmd.c_str());
  std::string request = cmd == "stats" ? (json ? "stats json" : "stats") : cmd;
  return talk(*pid, request, timeout, false);
}

// ---------------------------------------------------------------- env

int cmd_env(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (is_help(argv[i])) {
      std::fputs(kEnvHelp, stdout);
      return kOk;
    }
    return usage_error(std::string("env: unexpected argument '") + argv[i] + "'", "env");
  }
  const auto& opts = gpupool::config::options();
  std::size_t name_w = 8, value_w = 5, def_w = 7;
  for (const auto& o : opts) {
    name_w = std::max(name_w, std::strlen(o.name));
    const char* v = getenv(o.name);
    value_w = std::max(value_w, v ? std::strlen(v) : 1);
    def_w = std::max(def_w, std::strlen(o.default_value));
  }
  value_w = std::min<std::size_t>(value_w, 24);
  std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(name_w), "VARIABLE",
              static_cast<int>(value_w), "VALUE", static_cast<int>(def_w), "DEFAULT",
              "DESCRIPTION");
  for (const auto& o : opts) {
    const char* v = getenv(o.name);
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(name_w), o.name,
                static_cast<int>(value_w), v ? v : "-", static_cast<int>(def_w),
                *o.default_value ? o.default_value : "-", o.doc);
  }
  std::vector<gpupool::config::Diagnostic> diags;
  (void)gpupool::config::parse(environ, &diags);
  bool first = true;
  for (const auto& d : diags) {
    if (d.level < gpupool::config::LogLevel::warn) continue;
    if (first) std::printf("\nProblems:\n");
    first = false;
    std::printf("  %s\n", d.message.c_str());
  }
  return kOk;
}

int cmd_help(int argc, char** argv) {
  if (argc == 0) {
    std::fputs(kMainHelp, stdout);
    return kOk;
  }
  const std::string c = argv[0];
  if (c == "run") std::fputs(run_help().c_str(), stdout);
  else if (c == "stats") std::fputs(kStatsHelp, stdout);
  else if (c == "free-held") std::fputs(kFreeHeldHelp, stdout);
  else if (c == "stop-holding") std::fputs(kStopHoldingHelp, stdout);
  else if (c == "env") std::fputs(kEnvHelp, stdout);
  else if (c == "help") std::fputs(kMainHelp, stdout);
  else return usage_error("help: unknown command '" + c + "'");
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kMainHelp, stderr);
    return kUsage;
  }
  const std::string cmd = argv[1];
  if (is_help(cmd)) return cmd_help(0, nullptr);
  if (cmd == "-V" || cmd == "--version") {
    std::printf("gpupool %s\n", GPUPOOL_VERSION);
    return kOk;
  }
  if (cmd == "run") return cmd_run(argc - 2, argv + 2);
  if (cmd == "stats" || cmd == "free-held" || cmd == "stop-holding")
    return cmd_pid(cmd, argc - 2, argv + 2);
  if (cmd == "env") return cmd_env(argc - 2, argv + 2);
  if (cmd == "help") return cmd_help(argc - 2, argv + 2);
  if (!cmd.empty() && cmd[0] == '-') return usage_error("unknown option '" + cmd + "'");
  return usage_error("unknown command '" + cmd + "'");
}
