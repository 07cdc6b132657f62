// The gpupool logger. It needs the configuration (level, file) and the
// configuration reports its problems through it, so: config parses without
// logging, the logger is built from the parsed config, and the stored
// diagnostics are emitted once, by whichever thread first reaches log().
//
// Lines go to one file descriptor with one write(2) each: no stdio buffer is
// shared with the host program, lines from threads and processes appending to
// one file do not interleave, and nothing is lost if the program _exit()s.
// The file is the files thread's (sys/io.hpp), and so is every use of it;
// it is reopened if the program closed or replaced its descriptor, and in a
// forked child, whose path may name its pid.
#include "sys/log.hpp"

#include <unistd.h>

#include <atomic>

#include "core/fork_wait.hpp"
#include "core/no_destructor.hpp"

namespace gpupool {
namespace config::detail {
const Config& parsed_config();
const std::vector<Diagnostic>& parsed_diagnostics();
}  // namespace config::detail

namespace {

constexpr std::uint64_t kLineTimeoutNs = io::kWriteTimeoutNs / 10;

const char* level_name(config::LogLevel l) {
  switch (l) {
    case config::LogLevel::trace:
      return "trace";
    case config::LogLevel::debug:
      return "debug";
    case config::LogLevel::info:
      return "info";
    case config::LogLevel::warn:
      return "warning";
    case config::LogLevel::error:
      return "error";
    case config::LogLevel::off:
      break;
  }
  return "off";
}

// The process logger, for fork and the library's start (which may run
// beside the thread that builds the logger).
std::atomic<Logger*> g_logger{nullptr};

}  // namespace

Logger::Logger(Level level, std::string file) : level_(level), pattern_(std::move(file)) {}

bool Logger::open(std::string* why) {
  if (pattern_.empty()) return true;
  LockGuard lock(mu_);
  // A failure here is reported by the caller, once.
  bool ok = false;
  io::in_private([&] { ok = reopen(why); });
  warned_ = !ok;
  return ok;
}

bool Logger::fork_prepare() { return fork_wait::take(mu_); }
void Logger::fork_release() { mu_.unlock(); }

void Logger::to_private_table() {
  LockGuard lock(mu_);
  if (pattern_.empty() || !file_in_program_ || io::on_private_thread() ||
      io::start_private_files() != 0)
    return;
  file_.close();  // this thread's table is the program's: closed if still ours
  std::string why;
  io::in_private([&] { reopen(&why); });  // a failure is said by the next line
}

void Logger::begin_line(fmt::memory_buffer& line, Level level) {
  fmt::format_to(std::back_inserter(line), "gpupool[{}]: {}: ", getpid(), level_name(level));
}

void Logger::write(const char* line, std::size_t size) {
  LockGuard lock(mu_);
  if (!pattern_.empty()) {
    std::string why;
    bool reopened = true, written = false;
    io::in_private([&] {
      if (!file_.ours() || pid_ != getpid()) reopened = reopen(&why);
      written = file_.valid() && io::write_bounded(file_.get(), line, size, kLineTimeoutNs);
    });
    if (!reopened && !warned_) {
      warned_ = true;
      const std::string note =
          "gpupool[" + std::to_string(getpid()) + "]: warning: " + why + "; logging to stderr\n";
      io::write_stderr(note.data(), note.size(), kLineTimeoutNs);
    }
    if (written) return;
  }
  // Nowhere to report a failing log: the line is dropped.
  io::write_stderr(line, size, kLineTimeoutNs);
}

bool Logger::reopen(std::string* why) {
  pid_ = getpid();
  const std::string path = io::expand_path(pattern_, static_cast<long>(pid_));
  // Not ours any more (forgotten), or the parent's (fork): closed where
  // this table has it, a forked child's copy without a private table.
  file_.close();
  file_ = io::open_output(path, /*append=*/true, why);
  file_in_program_ = !io::on_private_thread();
  if (!file_.valid()) *why = "GPUPOOL_LOG_FILE=\"" + pattern_ + "\": " + *why;
  return file_.valid();
}

// No file is opened for a logger that logs nothing.
Logger::Logger(const config::Config& config, std::string* problem)
    : Logger(config.log_level,
             config.log_level == config::LogLevel::off ? std::string() : config.log_file) {
  std::string why;
  if (!open(&why) && problem) *problem = why + "; logging to stderr";
}

std::unique_ptr<Logger> make_logger(const config::Config& config, std::string* problem) {
  return std::make_unique<Logger>(config, problem);
}

namespace {
// log()'s logger, published for the fork handlers once made.
struct ProcessLogger {
  std::string problem;
  Logger logger{config::detail::parsed_config(), &problem};
  ProcessLogger() { g_logger.store(&logger, std::memory_order_release); }
};
}  // namespace

Logger& log() {
  // Never destroyed: the shim may log from atexit handlers and other threads
  // while the process exits.
  static NoDestructor<ProcessLogger> p;
  static std::atomic<bool> emitted{false};
  if (!emitted.load(std::memory_order_acquire) && !emitted.exchange(true)) {
    if (!p->problem.empty()) p->logger.warn("{}", p->problem);
    for (const config::Diagnostic& d : config::detail::parsed_diagnostics())
      p->logger.log(d.level, "{}", d.message);
  }
  return p->logger;
}

void log_file_to_private_table() {
  if (Logger* l = g_logger.load(std::memory_order_acquire)) l->to_private_table();
}

void log_fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (Logger* l = g_logger.load(std::memory_order_acquire)) l->fork_prepare();
}

void log_fork_release() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (Logger* l = g_logger.load(std::memory_order_acquire)) l->fork_release();
}

}  // namespace gpupool
