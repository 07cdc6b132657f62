// Signal names and numbers: which signals a GPUPOOL_SIGNAL_* variable may
// name, and how they are written.
#include <csignal>
#include <cstring>

#include "config/config.hpp"
#include "config/values.hpp"

namespace gpupool::config {

namespace {
struct SignalName {
  const char* name;
  int signo;
};
const SignalName kSignals[] = {
    {"HUP", SIGHUP},       {"INT", SIGINT},   {"QUIT", SIGQUIT},     {"ILL", SIGILL},
    {"TRAP", SIGTRAP},     {"ABRT", SIGABRT}, {"IOT", SIGIOT},       {"BUS", SIGBUS},
    {"FPE", SIGFPE},       {"KILL", SIGKILL}, {"USR1", SIGUSR1},     {"SEGV", SIGSEGV},
    {"USR2", SIGUSR2},     {"PIPE", SIGPIPE}, {"ALRM", SIGALRM},     {"TERM", SIGTERM},
#ifdef SIGSTKFLT
    {"STKFLT", SIGSTKFLT},
#endif
    {"CHLD", SIGCHLD},     {"CLD", SIGCHLD},  {"CONT", SIGCONT},     {"STOP", SIGSTOP},
    {"TSTP", SIGTSTP},     {"TTIN", SIGTTIN}, {"TTOU", SIGTTOU},     {"URG", SIGURG},
    {"XCPU", SIGXCPU},     {"XFSZ", SIGXFSZ}, {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF},
    {"WINCH", SIGWINCH},   {"IO", SIGIO},     {"POLL", SIGPOLL},
#ifdef SIGPWR
    {"PWR", SIGPWR},
#endif
    {"SYS", SIGSYS},
};
}  // namespace

int parse_signal(const std::string& text, std::string* why) {
  std::string scratch;
  if (!why) why = &scratch;
  std::string v = values::upper(values::trim(text));
  if (v.empty()) {
    *why = "is empty";
    return -1;
  }
  if (v == "NONE" || v == "OFF" || v == "0") return 0;
  int signo = -1;
  if (values::is_digit(v.front())) {
    std::uint64_t n = 0;
    std::size_t used = 0;
    if (!values::take_u64(v, &n, &used) || used != v.size()) {
      *why = "is not a signal";
      return -1;
    }
    if (n < 1 || n > static_cast<std::uint64_t>(SIGRTMAX)) {
      *why = "is not a signal number";
      return -1;
    }
    signo = static_cast<int>(n);
  } else {
    if (v.front() == '-') {
      *why = "is negative";
      return -1;
    }
    if (v.rfind("SIG", 0) == 0) v.erase(0, 3);
    if (v.rfind("RTMIN", 0) == 0 || v.rfind("RTMAX", 0) == 0) {
      const bool min = v[4] == 'N';
      std::string_view rest = values::trim(std::string_view(v).substr(5));
      std::uint64_t off = 0;
      if (!rest.empty()) {
        if (rest.front() != (min ? '+' : '-')) {
          *why = "is not a signal";
          return -1;
        }
        rest = values::trim(rest.substr(1));
        std::size_t used = 0;
        if (!values::take_u64(rest, &off, &used) || used == 0 || used != rest.size()) {
          *why = "is not a signal";
          return -1;
        }
      }
      const std::uint64_t span = static_cast<std::uint64_t>(SIGRTMAX - SIGRTMIN);
      if (off > span) {
        *why = "is beyond the real-time signals";
        return -1;
      }
      signo = min ? SIGRTMIN + static_cast<int>(off) : SIGRTMAX - static_cast<int>(off);
    } else {
      for (const SignalName& s : kSignals)
        if (v == s.name) {
          signo = s.signo;
          break;
        }
      if (signo < 0) {
        *why = "is not a signal";
        return -1;
      }
    }
  }
  switch (signo) {
    case SIGKILL:
    case SIGSTOP:
      *why = "cannot be caught";
      return -1;
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGABRT:
    case SIGTRAP:
    case SIGSYS:
      *why = "reports a fault in the program and cannot be borrowed safely";
      return -1;
    default:
      break;
  }
  // Between the classic signals and SIGRTMIN: kept by the C library (glibc
  // uses them for thread cancellation and setxid).
  if (signo > SIGSYS && signo < SIGRTMIN) {
    *why = "is reserved by the C library";
    return -1;
  }
  // Every other classic signal has a meaning people rely on: TERM, INT and
  // HUP stop the program, PIPE and CHLD drive its I/O and children, TSTP
  // and CONT job control. A handler of ours would take that away, so only
  // the signals left to applications are borrowed.
  if (signo != SIGUSR1 && signo != SIGUSR2 && signo < SIGRTMIN) {
    *why = "has a default action programs rely on";
    return -1;
  }
  return signo;
}

std::string signal_name(int signo) {
  if (signo == 0) return "none";
  for (const SignalName& s : kSignals)
    if (s.signo == signo && std::strcmp(s.name, "IOT") && std::strcmp(s.name, "CLD") &&
        std::strcmp(s.name, "POLL"))
      return s.name;
  if (signo == SIGRTMIN) return "RTMIN";
  if (signo == SIGRTMAX) return "RTMAX";
  if (signo > SIGRTMIN && signo < SIGRTMAX) {
    // The shorter of the two spellings, RTMIN+n first on a tie.
    const int up = signo - SIGRTMIN, down = SIGRTMAX - signo;
    return up <= down ? "RTMIN+" + std::to_string(up) : "RTMAX-" + std::to_string(down);
  }
  return std::to_string(signo);
}

}  // namespace gpupool::config
