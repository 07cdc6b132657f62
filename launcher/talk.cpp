// gpupool stats | free-held | stop-holding PID: one request over the
// process's control socket (wire/socket.hpp).
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
#include "launcher/launcher.hpp"
#include "observe/text_width.hpp"
#include "sys/io.hpp"
#include "wire/registry.hpp"
#include "wire/socket.hpp"

namespace gpupool::launcher {
namespace {

const char kStatsHelp[] =
    "Usage: gpupool stats PID [--json] [--timeout SECONDS]\n"
    "\n"
    "Print the pool statistics of process PID (a process of this user running\n"
    "gpupool, through `gpupool run` or a plain LD_PRELOAD) as a table, or as one\n"
    "JSON object (docs/stats-schema.json) with --json.\n";

const char kFreeHeldHelp[] =
    "Usage: gpupool free-held PID [--json] [--timeout SECONDS]\n"
    "       gpupool free-held --all [--device DEVICE] [--json] [--timeout SECONDS]\n"
    "\n"
    "Release every block process PID's pool holds (freed by the program, kept\n"
    "for reuse). The pool keeps holding blocks freed afterwards. --json: one\n"
    "JSON object (docs/c-api.md), per process with --all. --all asks\n"
    "every gpupool process of this user on the node (`gpupool ps`) at once,\n"
    "each once, --timeout being one deadline for all answers; with\n"
    "--device, only their blocks on that device, as `gpupool ps` names it: a\n"
    "GPU (GPU-..., as nvidia-smi -L shows it too), pinned host memory (host),\n"
    "or an OpenCL device without a UUID (opencl-...).\n";

const char kStopHoldingHelp[] =
    "Usage: gpupool stop-holding PID [--json] [--timeout SECONDS]\n"
    "\n"
    "Release every held block of process PID and stop holding: blocks the\n"
    "program frees from now on go straight back to the driver. --json: what\n"
    "was released as one JSON object (docs/c-api.md).\n";

bool parse_pid(const std::string& s, long* pid) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  *pid = std::strtol(s.c_str(), nullptr, 10);
  return *pid > 0;
}

// What /proc/PID/status says: the effective uid (none: no such process)
// and the state letter ('Z': ended, not yet waited for by its parent).
struct ProcessStatus {
  std::optional<unsigned> euid;
  char state = 0;
};
ProcessStatus process_status(long pid) {
  ProcessStatus out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("State:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      ss >> out.state;
    } else if (line.rfind("Uid:", 0) == 0) {
      std::istringstream ss(line.substr(4));
      unsigned real = 0, effective = 0;
      if (ss >> real >> effective) out.euid = effective;
    }
  return out;
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

std::uint64_t now_ms() { return io::mono_ns() / 1'000'000; }

// The deadline a request carries (wire/socket.hpp), for a command that waits
// timeout_s from start_ns for its answer: a process that has not begun it
// by then drops it, so "no answer" means nothing was done. It comes before
// the command gives up by what a request takes to be carried out and
// answered: half the timeout, at most a second.
std::uint64_t request_deadline(std::uint64_t start_ns, double timeout_s) {
  const auto wait = static_cast<std::uint64_t>(timeout_s * 1e9);
  return start_ns + wait - std::min<std::uint64_t>(wait / 2, 1'000'000'000);
}

// One request to one process: connected and sent, then its answer read
// until the process closes or the deadline passes. --all keeps one per
// process in flight at once, so a stopped process costs the deadline once,
// not once per process.
struct Asking {
  long pid = 0;
  std::string who;   // "process PID"
  io::OwnedFd fd;    // valid while waiting for the answer
  int result = kOk;  // once settled without an answer: why (message in `err`)
  bool sent = false;
  bool busy = false;  // its socket's queue was full: not reached yet
  int send_errno = 0;
  std::string reply;
  bool closed = false;   // the process closed the connection: the answer is whole
  std::string out, err;  // what to print on stdout and stderr
};

// Checks the process and connects to its socket, then sends the request
// (a whole line, wire/socket.hpp's request_line). false with a->result and
// a->err set when there is nobody to ask. A full listen queue is tried
// again until connect_until (io::mono_ns(); 0: tried once), then a->busy.
bool ask(long pid, const std::string& line, Asking* a, std::uint64_t connect_until) {
  *a = Asking();  // asked again after its queue was full: from the start
  a->pid = pid;
  a->who = "process " + std::to_string(pid);
  auto settle = [&](int result, std::string msg) {
    a->result = result;
    a->err = std::string(kProg) + ": " + msg + "\n";
    return false;
  };
  const std::string no_such = "no such process: " + std::to_string(pid);
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return settle(kNoProcess, no_such);
  const ProcessStatus status = process_status(pid);
  const auto& euid = status.euid;
  if (!euid) return settle(kNoProcess, no_such);
  // Its pid stays until the parent waits for it, but nothing runs there
  // (and /proc shows no memory maps to inspect).
  if (status.state == 'Z' || status.state == 'X')
    return settle(kNoProcess,
                  a->who + " has ended (a zombie: its parent has not waited for it yet)");
  if (*euid != geteuid())
    return settle(kDenied, "permission denied: " + a->who + " belongs to uid " +
                               std::to_string(*euid) +
                               "; gpupool only talks to processes of the same user (run this "
                               "as that user)");
  // The process's socket under any of its names (wire/socket.hpp's reach: a
  // squatter is skipped; a full queue is tried again until connect_until).
  wire::Reached reached =
      wire::reach(wire::socket_candidates(geteuid(), pid), pid, geteuid(), connect_until);
  if (reached.socket_error != 0 && !reached.fd.valid() && reached.error == ECONNREFUSED)
    return settle(kFailed, std::string("socket: ") + std::strerror(reached.socket_error));
  a->fd = std::move(reached.fd);
  const int connect_error = reached.error;
  const std::string& squatter = reached.squatter;
  if (!a->fd.valid()) {
    std::string note;
    if (!squatter.empty())
      note = std::string(kProg) + ": note: the usual control socket name of " + a->who +
             " is held by another process (" + squatter + "); not trusting it\n";
    if (connect_error == EAGAIN) {
      a->busy = true;
      settle(kTimeout, "cannot reach " + a->who +
                           ": its control socket's queue stayed full (is it stopped or hung?)");
    } else if (connect_error != ECONNREFUSED)
      settle(kFailed, "cannot reach " + a->who + ": " + std::strerror(connect_error));
    else if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) settle(kNoProcess, no_such);
    else if (const int mapped = has_gpupool_mapped(pid); mapped == 1)
      settle(kIdle, a->who +
                        " has gpupool loaded but idle: its control starts at the "
                        "program's first GPU call (or gpupool is disabled there)");
    else if (mapped < 0) settle(kDenied, "permission denied: cannot inspect " + a->who);
    else settle(kNotGpupool, a->who + " is not running gpupool (libgpupool.so is not loaded)");
    a->err = note + a->err;
    return false;
  }
  // A refusal may already be waiting even if the send fails: read it.
  a->sent = send(a->fd.get(), line.data(), line.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(line.size());
  a->send_errno = errno;
  return true;
}

// Reads every answer until each process has closed its end or `deadline`
// (now_ms()) passes: one deadline for all of them.
void read_answers(std::vector<Asking>& asks, std::uint64_t deadline) {
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Asking*> of;
    for (Asking& a : asks)
      if (a.fd.valid() && !a.closed) {
        fds.push_back({a.fd.get(), POLLIN, 0});
        of.push_back(&a);
      }
    const std::uint64_t now = now_ms();
    if (fds.empty() || now >= deadline) return;
    const std::uint64_t wait_ms = std::min<std::uint64_t>(deadline - now, 60'000);
    const int r = poll(fds.data(), fds.size(), static_cast<int>(wait_ms));
    if (r <= 0) continue;  // EINTR, or the deadline: checked above
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      char buf[65536];
      const ssize_t n = recv(fds[i].fd, buf, sizeof buf, 0);
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      // ECONNRESET after the answer: the process closed without reading all
      // we sent (a refusal is sent before anything is read).
      if (n <= 0) of[i]->closed = true;
      else of[i]->reply.append(buf, static_cast<std::size_t>(n));
    }
  }
}

// What the answer (or its absence) means: the exit code, and a->out/err.
int settle(Asking& a, double timeout_s) {
  if (!a.fd.valid()) return a.result;
  a.fd.close();
  auto error = [&](int result, const std::string& msg) {
    a.err = std::string(kProg) + ": " + msg + "\n";
    return result;
  };
  char t[32];
  std::snprintf(t, sizeof t, "%g", timeout_s);
  if (!a.closed)
    return error(kTimeout, "no answer from " + a.who + " within " + t +
                               "s (is it stopped or hung?); the request expired: it will not "
                               "be carried out later");
  const auto nl = a.reply.find('\n');
  const std::string status = a.reply.substr(0, nl);
  const std::string body = nl == std::string::npos ? "" : a.reply.substr(nl + 1);
  if (status == "ok") {
    a.out = body;
    return kOk;
  }
  if (status.rfind("error expired", 0) == 0)
    return error(kTimeout, a.who + " did not begin the request within " + t +
                               "s (is it busy?); it expired, and nothing was done");
  if (status.rfind("error denied", 0) == 0)
    return error(kDenied, "permission denied by " + a.who + ": " + status.substr(13));
  if (status.empty() && !a.sent)
    return error(kFailed, "cannot send to " + a.who + ": " + std::strerror(a.send_errno));
  if (status.empty()) return error(kFailed, a.who + " closed the connection without answering");
  return error(kFailed, a.who + " answered: " +
                            (status.rfind("error ", 0) == 0 ? status.substr(6) : status));
}

void print(const Asking& a) {
  const std::string out = terminal_text(a.out);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
  std::fputs(terminal_text(a.err).c_str(), stderr);
}

int talk(long pid, const std::string& request, double timeout_s) {
  std::vector<Asking> asks(1);
  const std::uint64_t start = io::mono_ns();
  const std::uint64_t until = request_deadline(start, timeout_s);
  if (ask(pid, wire::request_line(request, until), &asks[0], until))
    read_answers(asks, start / 1'000'000 + static_cast<std::uint64_t>(timeout_s * 1000));
  const int r = settle(asks[0], timeout_s);
  print(asks[0]);
  return r;
}

// One process's entry in free-held --all --json: its answer's fields (a
// JSON object from "free-held json", "released N" from a release), or the
// error and exit code it would have as a PID command.
std::string json_entry(const wire::ProcessEntry& p, const Asking& a, int result) {
  std::string o = "{\"pid\": " + std::to_string(p.pid) + ", \"command\": " + json_string(p.command);
  if (result != kOk) {
    std::string err = a.err;
    if (err.rfind(std::string(kProg) + ": ", 0) == 0) err.erase(0, std::strlen(kProg) + 2);
    while (!err.empty() && err.back() == '\n') err.pop_back();
    return o + ", \"ok\": false, \"exit\": " + std::to_string(result) +
           ", \"error\": " + json_string(err) + "}";
  }
  o += ", \"ok\": true";
  const std::string body = a.out.substr(0, a.out.find('\n'));
  if (body.rfind("released ", 0) == 0) return o + ", \"released_bytes\": " + body.substr(9) + "}";
  const auto open = body.find('{'), close = body.rfind('}');
  if (open != std::string::npos && close != std::string::npos && close > open + 1)
    o += ", " + body.substr(open + 1, close - open - 1);
  return o + "}";
}

// free-held --all: every listed process once (a pid listed in several
// slots is asked once), all at once, with one deadline for every answer;
// with `json`, one document for them all.
int talk_all(const std::vector<wire::ProcessEntry>& procs, const std::string& request,
             double timeout_s, bool json, const std::string& device) {
  std::vector<const wire::ProcessEntry*> once;
  for (const auto& p : procs)
    if (std::none_of(once.begin(), once.end(), [&](auto* o) { return o->pid == p.pid; }))
      once.push_back(&p);
  std::vector<Asking> asks(once.size());
  const std::uint64_t start = io::mono_ns();
  const std::uint64_t deadline = start / 1'000'000 + static_cast<std::uint64_t>(timeout_s * 1000);
  const std::uint64_t until = request_deadline(start, timeout_s);
  const std::string line = wire::request_line(request, until);
  // Each once at first: a process whose queue is full must not hold up the
  // others; those are tried again, every few ms, while there is time.
  for (std::size_t i = 0; i < once.size(); ++i) ask(once[i]->pid, line, &asks[i], 0);
  for (;;) {
    std::vector<std::size_t> busy;
    for (std::size_t i = 0; i < once.size(); ++i)
      if (asks[i].busy) busy.push_back(i);
    if (busy.empty() || io::mono_ns() >= until) break;
    const timespec pause{0, 2'000'000};
    nanosleep(&pause, nullptr);
    for (std::size_t i : busy) ask(once[i]->pid, line, &asks[i], 0);
  }
  read_answers(asks, deadline);
  int worst = kOk;
  std::string doc =
      "{\"device\": " + (device.empty() ? "null" : json_string(device)) + ", \"processes\": [";
  for (std::size_t i = 0; i < once.size(); ++i) {
    const int result = settle(asks[i], timeout_s);
    if (result != kOk) worst = kFailed;
    if (json) {
      doc += (i ? ", " : "") + json_entry(*once[i], asks[i], result);
      continue;
    }
    // One line per process within 100 columns: what it released on standard
    // output, or why it could not (the error names the process) on stderr.
    if (result == kOk) {
      const std::string out =
          observe::fit_lines("process " + std::to_string(once[i]->pid) + " (" +
                             terminal_text(once[i]->command) + "): " + terminal_text(asks[i].out));
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);
    } else {
      std::fputs(observe::fit_lines(terminal_text(asks[i].err)).c_str(), stderr);
    }
  }
  if (json) std::printf("%s]}\n", doc.c_str());
  else if (once.empty()) std::printf("no gpupool process of this user on this node\n");
  return worst;
}

}  // namespace

const char* pid_help(const std::string& cmd) {
  switch (config::action_of_verb(cmd)) {
    case config::kStats:
      return kStatsHelp;
    case config::kFreeHeld:
      return kFreeHeldHelp;
    case config::kStopHolding:
      return kStopHoldingHelp;
    case config::kActions:
      break;
  }
  return nullptr;
}

int cmd_pid(const std::string& cmd, int argc, char** argv) {
  const char* help = pid_help(cmd);
  bool json = false, all = false;
  double timeout = 5;
  std::optional<long> pid;
  std::optional<wire::DeviceKey> device;
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
    if (a == "--json") {
      json = true;
    } else if (a == "--all" && cmd == "free-held") {
      all = true;
    } else if (cmd == "free-held" && value_of("--device", "a device")) {
      if (bad) return bad;
      wire::DeviceKey u;
      if (!wire::parse_key(v, &u))
        return usage_error(cmd + ": --device: '" + v +
                               "' is not a device as `gpupool ps` names it (GPU-<UUID>, host, "
                               "opencl-<24 hex digits>)",
                           cmd.c_str());
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
    std::vector<wire::ProcessEntry> procs;
    if (!registry_processes(&procs)) return kFailed;
    const std::string req =
        device ? "release " + wire::key_text(*device) + " " + std::to_string(UINT64_MAX)
               : std::string("free-held");
    if (device)
      procs.erase(std::remove_if(procs.begin(), procs.end(),
                                 [&](const wire::ProcessEntry& p) {
                                   return std::none_of(
                                       p.devices.begin(), p.devices.end(),
                                       [&](const wire::DeviceUse& d) { return d.key == *device; });
                                 }),
                  procs.end());
    return talk_all(procs, device || !json ? req : req + " json", timeout, json,
                    device ? wire::key_text(*device) : "");
  }
  if (!pid) return usage_error(cmd + ": no PID given", cmd.c_str());
  return talk(*pid, json ? cmd + " json" : cmd, timeout);
}

// ---------------------------------------------------------------- env

}  // namespace gpupool::launcher
