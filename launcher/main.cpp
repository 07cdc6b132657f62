// gpupool: run a program under the pool, and talk to a running one.
//
//   gpupool run [options] [--] PROGRAM [ARGS...]          run.cpp
//   gpupool stats PID [--json] | free-held PID | stop-holding PID   talk.cpp
//   gpupool ps [--json] (and free-held --all's list)                node.cpp
//   gpupool trace convert TRACE... --to perfetto|rmm -o OUTPUT     trace.cpp
//   gpupool report TRACE... -o OUTPUT.html | --text [--diff BASE]  report.cpp
//   gpupool env | --version | --help | help COMMAND        here
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
#include <cstdint>
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

extern char** environ;

namespace gpupool::launcher {

int usage_error(const std::string& msg, const char* cmd) {
  std::fprintf(stderr, "%s: %s\nTry '%s %s--help'.\n", kProg, terminal_text(msg).c_str(), kProg,
               cmd ? (std::string(cmd) + " ").c_str() : "");
  return kUsage;
}

std::string terminal_text(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  auto escape = [&](unsigned char c) {
    static const char kHex[] = "0123456789abcdef";
    o += "\\x";
    o += kHex[c >> 4];
    o += kHex[c & 15];
  };
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) escape(c);
      else o += static_cast<char>(c);
      ++i;
      continue;
    }
    // A UTF-8 sequence: its length and smallest code point (no overlong
    // forms, surrogates or values past U+10FFFF).
    const std::size_t n = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
    std::uint32_t cp = n == 4 ? c & 0x07u : n == 3 ? c & 0x0fu : c & 0x1fu;
    bool valid = n != 0 && c < 0xf5 && i + n <= s.size();
    for (std::size_t k = 1; valid && k < n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      valid = (cc & 0xc0) == 0x80;
      cp = cp << 6 | (cc & 0x3fu);
    }
    valid = valid && !(n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp < 0xe000))) &&
            !(n == 4 && (cp < 0x10000 || cp > 0x10ffff));
    if (!valid) {
      escape(c);
      ++i;
    } else if (cp < 0xa0) {  // a C1 control (U+0080..U+009F): its bytes
      for (std::size_t k = 0; k < n; ++k) escape(static_cast<unsigned char>(s[i + k]));
      i += n;
    } else {
      o.append(s.substr(i, n));
      i += n;
    }
  }
  return o;
}

std::string json_string(std::string_view s) {
  return "\"" + stats::json_escape(std::string(s)) + "\"";
}

void say(const char* cmd, const std::string& what) {
  std::fprintf(stderr, "%s: %s: %s\n", kProg, cmd, terminal_text(what).c_str());
}

namespace {

const char kMainHelp[] =
    "Usage: gpupool COMMAND [ARGS...]\n"
    "\n"
    "Run GPU programs with a pooled memory allocator (CUDA and OpenCL), and\n"
    "observe or control programs running with it.\n"
    "\n"
    "Commands:\n"
    "  run [OPTIONS] [--] PROGRAM [ARGS...]  run PROGRAM with gpupool preloaded\n"
    "  stats PID [--json]                    print the pool statistics of process PID\n"
    "  free-held PID [--json]                release the memory PID's pool holds\n"
    "  free-held --all [--device DEVICE]     ask every gpupool process here to release\n"
    "  stop-holding PID [--json]             release held memory and stop holding\n"
    "  ps [--json]                           list gpupool processes here, per device\n"
    "  trace convert TRACE... --to FMT -o F  GPUPOOL_TRACE_FILEs for Perfetto or RMM\n"
    "  report TRACE... -o F.html | --text    where traced programs' memory went: a page,\n"
    "                                        text or --json (--diff BASE: what changed)\n"
    "  env [--json]                          list the GPUPOOL_* variables and values\n"
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

const char kEnvHelp[] =
    "Usage: gpupool env [--json]\n"
    "\n"
    "List every GPUPOOL_* variable: its value in this environment (or '-'),\n"
    "its default and what it does; then any problem with the values set.\n"
    "--json: one JSON object, {\"variables\": [{\"name\", \"value\" (null when\n"
    "unset), \"default\", \"description\"}], \"problems\": [MESSAGE...]}.\n";

// The problems with the values set, as the library would log them.
std::vector<std::string> env_problems() {
  std::vector<gpupool::config::Diagnostic> diags;
  (void)gpupool::config::parse(environ, &diags);
  std::vector<std::string> out;
  for (const auto& d : diags)
    if (d.level >= gpupool::config::LogLevel::warn) out.push_back(d.message);
  return out;
}

int env_json() {
  std::string o = "{\"variables\": [";
  bool first = true;
  for (const auto& opt : gpupool::config::options()) {
    const char* v = getenv(opt.name);
    o += std::string(first ? "" : ", ") + "{\"name\": " + json_string(opt.name) +
         ", \"value\": " + (v ? json_string(v) : "null") +
         ", \"default\": " + json_string(opt.default_value) +
         ", \"description\": " + json_string(opt.doc) + "}";
    first = false;
  }
  o += "], \"problems\": [";
  first = true;
  for (const std::string& p : env_problems()) {
    o += (first ? "" : ", ") + json_string(p);
    first = false;
  }
  std::printf("%s]}\n", o.c_str());
  return kOk;
}

int cmd_env(int argc, char** argv) {
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    if (is_help(argv[i])) {
      std::fputs(kEnvHelp, stdout);
      return kOk;
    }
    if (std::string(argv[i]) == "--json") {
      json = true;
      continue;
    }
    return usage_error(std::string("env: unexpected argument '") + argv[i] + "'", "env");
  }
  if (json) return env_json();
  const auto& opts = gpupool::config::options();
  std::size_t name_w = 8, value_w = 5, def_w = 7;
  for (const auto& o : opts) {
    name_w = std::max(name_w, std::strlen(o.name));
    const char* v = getenv(o.name);
    value_w = std::max(value_w, v ? std::strlen(v) : 1);
    def_w = std::max(def_w, std::strlen(o.default_value));
  }
  value_w = std::min<std::size_t>(value_w, 24);
  // The description wrapped to what is left of kTextColumns (at least 30
  // columns; a longer value is shortened: --json has it whole).
  const std::size_t desc_at = name_w + value_w + def_w + 6;
  const std::size_t desc_w = kTextColumns > desc_at + 30 ? kTextColumns - desc_at : 30;
  std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(name_w), "VARIABLE",
              static_cast<int>(value_w), "VALUE", static_cast<int>(def_w), "DEFAULT",
              "DESCRIPTION");
  for (const auto& o : opts) {
    const char* v = getenv(o.name);
    std::string value = v ? terminal_text(v) : "-";
    if (text_columns(value) > value_w) value = shorten_middle(value, value_w);
    const std::vector<std::string> doc = wrap_text(o.doc, desc_w);
    for (std::size_t k = 0; k < doc.size(); ++k) {
      if (k == 0)
        std::printf("%-*s  %s%*s  %-*s  %s\n", static_cast<int>(name_w), o.name, value.c_str(),
                    static_cast<int>(value_w - text_columns(value)), "", static_cast<int>(def_w),
                    *o.default_value ? o.default_value : "-", doc[k].c_str());
      else std::printf("%*s%s\n", static_cast<int>(desc_at), "", doc[k].c_str());
    }
  }
  bool first = true;
  for (const std::string& p : env_problems()) {
    if (first) std::printf("\nProblems:\n");
    first = false;
    const std::vector<std::string> lines = wrap_text(terminal_text(p), kTextColumns - 4);
    for (std::size_t k = 0; k < lines.size(); ++k)
      std::printf("%s%s\n", k ? "    " : "  ", lines[k].c_str());
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
  else if (const char* h = pid_help(c)) std::fputs(h, stdout);
  else if (c == "env") std::fputs(kEnvHelp, stdout);
  else if (c == "ps") std::fputs(ps_help(), stdout);
  else if (c == "trace") std::fputs(trace_help(), stdout);
  else if (c == "report") std::fputs(report_help(), stdout);
  else if (c == "help") std::fputs(kMainHelp, stdout);
  else return usage_error("help: unknown command '" + c + "'");
  return kOk;
}

}  // namespace
}  // namespace gpupool::launcher

using namespace gpupool::launcher;

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
  if (gpupool::config::action_of_verb(cmd) != gpupool::config::kActions)
    return cmd_pid(cmd, argc - 2, argv + 2);
  if (cmd == "env") return cmd_env(argc - 2, argv + 2);
  if (cmd == "ps") return cmd_ps(argc - 2, argv + 2);
  if (cmd == "trace") return cmd_trace(argc - 2, argv + 2);
  if (cmd == "report") return cmd_report(argc - 2, argv + 2);
  if (cmd == "help") return cmd_help(argc - 2, argv + 2);
  if (!cmd.empty() && cmd[0] == '-') return usage_error("unknown option '" + cmd + "'");
  return usage_error("unknown command '" + cmd + "'");
}
