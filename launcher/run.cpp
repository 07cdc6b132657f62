// gpupool run: sets environment variables and exec()s the program, so its
// exit status and signals reach the caller unchanged.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
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
#include "launcher/launcher.hpp"
#include "observe/stats_format.hpp"
#include "observe/trace_reader.hpp"
#include "sys/outputs.hpp"

extern char** environ;

namespace gpupool::launcher {
namespace {

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
    {"--reuse", "GPUPOOL_REUSE", true, nullptr, false, "MODE",
     "safe, ordered, fenced or immediate"},
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
    {"--leaks", "GPUPOOL_LEAKS", false, "1", false, "",
     "list the blocks still held at exit; gpupool.snapshot() needs it"},
    {"--log", "GPUPOOL_LOG", true, nullptr, false, "LEVEL", "off, error, warn, info, debug, trace"},
    {"--log-file", "GPUPOOL_LOG_FILE", true, nullptr, true, "FILE", ""},
    {"--set", nullptr, true, nullptr, false, "NAME=VALUE",
     "any GPUPOOL_* variable (see `gpupool env`)"},
};

// A run replaces what an earlier run with the same --trace FILE wrote:
// FILE and its siblings (NAME.PID.EXT) that no live process holds, which a
// report would otherwise read with this run's (docs/trace.md). Not with
// %p in FILE (the user's names), nor within another run (the files of its
// processes that exited are its own).
void remove_earlier_traces(const std::string& file) {
  if (file.find("%p") != std::string::npos) return;
  const std::vector<std::string> removed =
      io::remove_unheld_outputs(file, "", trace::kTraceHeaderPrefix);
  if (removed.empty()) return;
  std::string names;
  for (const std::string& n : removed) names += (names.empty() ? "" : ", ") + n;
  std::fprintf(stderr, "%s: run: removed %zu trace%s an earlier run left beside %s: %s\n", kProg,
               removed.size(), removed.size() == 1 ? "" : "s", file.c_str(), names.c_str());
}

// A --trace FILE that a live process is writing (FILE or a sibling: another
// run given the same name is under way) is refused, as memray refuses an
// existing output: its report would read both runs' processes as one
// program's. Empty when none; else the message. Not with %p in FILE (the
// pid keeps the names apart).
std::string trace_in_use(const std::string& file) {
  if (file.find("%p") != std::string::npos) return {};
  const std::vector<std::string> held = io::held_outputs(file, trace::kTraceHeaderPrefix);
  if (held.empty()) return {};
  const std::size_t slash = file.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : file.substr(0, slash + 1);
  std::uint64_t pid = 0, run = 0;
  trace::trace_head(dir + held.front(), &pid, &run);
  std::string who = pid ? "process " + std::to_string(pid) : "a live process";
  if (run && run != pid) who += " of the `gpupool run` " + std::to_string(run);
  return "--trace " + file + ": " + dir + held.front() + " is being written by " + who +
         (held.size() > 1 ? " (and " + std::to_string(held.size() - 1) + " more of its names)"
                          : "") +
         ": another run is using this name; give this run another (or a directory of its own), "
         "or wait until it ends; the program was not started";
}

// The Prometheus files of processes that are gone (killed: they hold them
// no more), and the temporary files of writes an exec or a kill cut short,
// removed before the program starts (and then by each of its processes as
// it writes): node_exporter serves no dead process.
void remove_stale_prometheus(const std::string& file) {
  const std::vector<std::string> removed =
      io::remove_unheld_outputs(file, "", stats::kPrometheusStart, io::Names::any);
  if (removed.empty()) return;
  std::string names;
  for (const std::string& n : removed) names += (names.empty() ? "" : ", ") + n;
  say("run", "removed " + std::to_string(removed.size()) + " Prometheus file" +
                 (removed.size() == 1 ? "" : "s") + " of processes that are gone beside " + file +
                 ": " + names);
}

// `gpupool run` becomes the program (exec), so it has no exit of its own:
// a program killed with no other gpupool process writing Prometheus files
// beside it would leave its file until the next one starts. A watcher
// sweeps then: forked twice (reparented at once, so never a child the
// program waits for), in a session of its own (a signal to the program's
// group does not take it too), with none of the program's descriptors (a
// reader of its output sees the end when the program ends), it waits for
// this pid to end (a pidfd: the exec keeps the process) and sweeps. Without
// pidfds (Linux before 5.3) there is none; nor where an orphan would become
// the program's own child: `gpupool run` as a pid namespace's init (a
// container's entrypoint) or as a child subreaper, where a program that
// reaps all its children would wait for the watcher, which waits for it.
void watch_for_prometheus(const std::string& file) {
  int subreaper = 0;
  if (getpid() == 1 || (prctl(PR_GET_CHILD_SUBREAPER, &subreaper) == 0 && subreaper)) return;
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  if (pidfd < 0) return;
  // Above the standard descriptors, which the watcher points at /dev/null
  // (stdin may have been closed, and the pidfd taken its number).
  const int program = fcntl(pidfd, F_DUPFD_CLOEXEC, 3);
  close(pidfd);
  if (program < 0) return;
  const pid_t first = fork();
  if (first == 0) {
    if (fork() != 0) _exit(0);
    setsid();
    const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    for (int fd = 0; fd < 3; ++fd) dup2(null, fd);
    if (program > 3) close_range(3, program - 1, 0);
    close_range(program + 1, ~0U, 0);
    pollfd p{program, POLLIN, 0};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
    (void)io::remove_unheld_outputs(file, "", stats::kPrometheusStart, io::Names::any);
    _exit(0);
  }
  close(program);
  if (first > 0) waitpid(first, nullptr, 0);
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  else s += ' ';
  return s;
}

}  // namespace

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
  // An option that sets no variable of its own has its help where the
  // variable would be; a help that does not fit goes on under it.
  for (const RunOption& o : kRunOptions) {
    const std::string var = var_of(o);
    std::string line = "  " + pad(flag_of(o), flag_w) + (var.empty() ? "" : pad(var, var_w));
    const std::size_t at = text_columns(line);
    const std::vector<std::string> help =
        wrap_text(o.help, kTextColumns > at + 20 ? kTextColumns - at : kTextColumns - 8);
    if (kTextColumns <= at + 20 && *o.help) line += "\n" + std::string(8, ' ');
    for (std::size_t k = 0; k < help.size(); ++k)
      line += (k ? "\n" + std::string(at, ' ') : "") + help[k];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    h += line + "\n";
  }
  h += "  " + pad("-h, --help", flag_w + var_w) + "show this help\n";
  return h;
}

namespace {

// A variable an option sets, and the option (for a message about it).
struct Var {
  std::string name, value, option;
};
using Vars = std::vector<Var>;
// What an option handler returns when the command line may go on.
constexpr int kGoOn = -1;

// --disable LIST: the variables that turn each backend off.
int disable_vars(const std::string& value, Vars* vars) {
  std::stringstream ss(value);
  std::string what;
  bool any = false;
  while (std::getline(ss, what, ',')) {
    any = true;
    if (what == "all") vars->push_back({"GPUPOOL_DISABLE", "1", "--disable"});
    else if (what == "cuda") vars->push_back({"GPUPOOL_CUDA", "0", "--disable"});
    else if (what == "cuda-host") vars->push_back({"GPUPOOL_CUDA_HOST", "0", "--disable"});
    else if (what == "opencl") vars->push_back({"GPUPOOL_OPENCL", "0", "--disable"});
    else
      return usage_error(
          "run: --disable: unknown backend '" + what + "' (accepted: cuda, cuda-host, opencl, all)",
          "run");
  }
  if (!any) return usage_error("run: --disable needs a backend", "run");
  return kGoOn;
}

// --set NAME=VALUE, NAME one of the options table's (GPUPOOL_ optional).
int set_var(const std::string& value, Vars* vars) {
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
  vars->push_back({name, value.substr(eq + 1), "--set"});
  return kGoOn;
}

// The options before the program, as variables; *program: the program's
// index in argv. kGoOn, or the exit status (help, a usage error).
int run_options(int argc, char** argv, int* program, Vars* vars) {
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
    int status = kGoOn;
    if (std::string(opt->flag) == "--disable") status = disable_vars(value, vars);
    else if (std::string(opt->flag) == "--set") status = set_var(value, vars);
    else if (opt->takes_value && value.empty())
      return usage_error("run: option " + arg + " needs a non-empty value", "run");
    else
      vars->push_back({opt->variable,
                       opt->takes_value ? (opt->path ? absolute(value) : value) : opt->fixed_value,
                       opt->flag});
    if (status != kGoOn) return status;
  }
  *program = i;
  return kGoOn;
}

}  // namespace

int cmd_run(int argc, char** argv) {
  Vars vars;
  int i = 0;
  if (const int status = run_options(argc, argv, &i, &vars); status != kGoOn) return status;
  if (i >= argc) return usage_error("run: no program given", "run");
  // A bad value is refused before anything runs (the library, given it,
  // would use the default instead).
  for (const Var& v : vars) {
    const std::string why = config::value_problem(v.name, v.value);
    if (why.empty()) continue;
    say("run", (v.option == "--set" ? "--set " + v.name + "='" + v.value + "'"
                                    : v.option + " '" + v.value + "' (" + v.name + ")") +
                   " " + why + "; the program was not started");
    return kUsage;
  }
  const std::string lib = find_library();
  if (lib.empty()) {
    std::fprintf(stderr,
                 "%s: run: cannot find libgpupool.so next to %s (looked in ../lib and ..)\n", kProg,
                 self_dir().c_str());
    return kFailed;
  }
  bool run_pid_given = false;
  for (const Var& v : vars) run_pid_given |= v.name == "GPUPOOL_RUN_PID";
  const bool within_a_run = run_pid_given || getenv("GPUPOOL_RUN_PID");
  // Nothing is changed before every check has passed.
  for (const Var& v : vars)
    if (v.name == "GPUPOOL_TRACE_FILE" && !within_a_run)
      if (const std::string why = trace_in_use(v.value); !why.empty()) {
        say("run", why);
        return kUsage;
      }
  for (const Var& v : vars) {
    setenv(v.name.c_str(), v.value.c_str(), 1);
    if (v.name == "GPUPOOL_TRACE_FILE" && !within_a_run) remove_earlier_traces(v.value);
  }
  if (const char* prom = getenv("GPUPOOL_PROMETHEUS_FILE"); prom && *prom) {
    remove_stale_prometheus(prom);
    watch_for_prometheus(prom);
  }
  // exec keeps the pid: the program is this process. It writes the files
  // as named; its children, and theirs, write siblings (docs/trace.md).
  if (!run_pid_given) setenv("GPUPOOL_RUN_PID", std::to_string(getpid()).c_str(), 1);
  setenv("LD_PRELOAD", preload_value(lib, getenv("LD_PRELOAD")).c_str(), 1);
  execvp(argv[i], argv + i);
  const int e = errno;
  std::fprintf(stderr, "%s: run: %s: %s\n", kProg, argv[i],
               e == ENOENT ? "command not found" : std::strerror(e));
  return e == ENOENT ? 127 : 126;
}

// ---------------------------------------------------------------- PID commands

}  // namespace gpupool::launcher
