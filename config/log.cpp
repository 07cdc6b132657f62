// The gpupool logger. It needs the configuration (level, file) and the
// configuration reports its problems through it, so: config parses without
// logging, the logger is built from the parsed config, and the stored
// diagnostics are emitted once, by whichever thread first reaches log().
//
// Lines go to one file descriptor with one write(2) each: no stdio buffer is
// shared with the host program, lines from threads and processes appending to
// one file do not interleave, and nothing is lost if the program _exit()s.
#include "config/log.hpp"

#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

#include "config/io.hpp"
#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"

namespace gpupool {
namespace config::detail {
const Config& parsed_config();
const std::vector<Diagnostic>& parsed_diagnostics();
}  // namespace config::detail

namespace {

// Writes each line with one bounded write (config/io.hpp): to the log file,
// reopened if the program closed or replaced its descriptor (and in a forked
// child whose path names its pid), or to stderr.
// The sink's lock: last but the files thread's (core/lock_rank.hpp), since
// any code may log whatever it holds.
using SinkLock = Ranked<LockRank::log_sink>;

class FdSink final : public spdlog::sinks::base_sink<SinkLock> {
 public:
  // `pattern` empty: stderr.
  explicit FdSink(std::string pattern) : pattern_(std::move(pattern)) {}

  // Opens the file now; false (and *why) when it cannot, then lines go to
  // stderr until a later reopen succeeds.
  bool open(std::string* why) {
    if (pattern_.empty()) return true;
    // A failure here is reported by the caller, once.
    bool ok = false;
    io::in_private([&] { ok = reopen(why); });
    warned_ = !ok;
    return !warned_;
  }

  bool fork_prepare() GPUPOOL_TRY_ACQUIRE(true, mutex_) { return fork_wait::take(mutex_); }
  void fork_release() GPUPOOL_RELEASE(mutex_) { mutex_.unlock(); }

  // log_file_to_private_table(), on a thread of the program's table.
  void to_private_table() {
    LockGuard lock(mutex_);
    if (pattern_.empty() || !file_in_program_ || io::on_private_thread() ||
        io::start_private_files() != 0)
      return;
    file_.close();  // this thread's table is the program's: closed if still ours
    std::string why;
    io::in_private([&] { reopen(&why); });  // a failure is said by the next line
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    if (!pattern_.empty()) {
      std::string why;
      bool reopened = true, written = false;
      // The file is the files thread's (config/io.hpp), and so is every
      // use of it.
      io::in_private([&] {
        if (!file_.ours() || pid_ != getpid()) reopened = reopen(&why);
        written = file_.valid() &&
                  io::write_bounded(file_.get(), buf.data(), buf.size(), kLineTimeoutNs);
      });
      if (!reopened && !warned_) {
        warned_ = true;
        const std::string line = "gpupool[" + std::to_string(getpid()) + "]: warning: " + why +
                                 "; logging to stderr\n";
        io::write_stderr(line.data(), line.size(), kLineTimeoutNs);
      }
      if (written) return;
    }
    // Nowhere to report a failing log: the line is dropped.
    io::write_stderr(buf.data(), buf.size(), kLineTimeoutNs);
  }
  void flush_() override {}

 private:
  static constexpr std::uint64_t kLineTimeoutNs = io::kWriteTimeoutNs / 10;

  bool reopen(std::string* why) {
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

  std::string pattern_;
  io::OwnedFd file_;
  bool file_in_program_ = false;  // opened in the program's table (no files thread then)
  pid_t pid_ = 0;
  bool warned_ = false;
};

// The process logger's sink, for fork and the library's start (which may
// run beside the thread that builds the logger).
std::atomic<FdSink*> g_sink{nullptr};

spdlog::level::level_enum to_spdlog(config::LogLevel l) {
  switch (l) {
    case config::LogLevel::trace: return spdlog::level::trace;
    case config::LogLevel::debug: return spdlog::level::debug;
    case config::LogLevel::info: return spdlog::level::info;
    case config::LogLevel::warn: return spdlog::level::warn;
    case config::LogLevel::error: return spdlog::level::err;
    case config::LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::warn;
}

}  // namespace

std::shared_ptr<spdlog::logger> make_logger(const config::Config& config, std::string* problem) {
  // No file is opened for a logger that logs nothing.
  auto sink = std::make_shared<FdSink>(config.log_level == config::LogLevel::off ? std::string()
                                                                                  : config.log_file);
  std::string why;
  if (!sink->open(&why) && problem) *problem = why + "; logging to stderr";
  auto logger = std::make_shared<spdlog::logger>("gpupool", sink);
  logger->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      "gpupool[%P]: %l: %v", spdlog::pattern_time_type::local, std::string("\n")));
  logger->set_level(to_spdlog(config.log_level));
  logger->flush_on(spdlog::level::trace);
  return logger;
}

spdlog::logger& log() {
  static std::string problem;
  // Never destroyed: the shim may log from atexit handlers and other threads
  // while the process exits.
  static const std::shared_ptr<spdlog::logger>* const holder = [] {
    auto* h = new std::shared_ptr<spdlog::logger>(make_logger(config::detail::parsed_config(), &problem));
    g_sink.store(static_cast<FdSink*>((*h)->sinks().front().get()), std::memory_order_release);
    return h;
  }();
  spdlog::logger* const logger = holder->get();
  static std::atomic<bool> emitted{false};
  if (!emitted.load(std::memory_order_acquire) && !emitted.exchange(true)) {
    if (!problem.empty()) logger->warn("{}", problem);
    for (const config::Diagnostic& d : config::detail::parsed_diagnostics())
      logger->log(to_spdlog(d.level), "{}", d.message);
  }
  return *logger;
}

void log_file_to_private_table() {
  if (FdSink* s = g_sink.load(std::memory_order_acquire)) s->to_private_table();
}

void log_fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (FdSink* s = g_sink.load(std::memory_order_acquire)) s->fork_prepare();
}

void log_fork_release() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (FdSink* s = g_sink.load(std::memory_order_acquire)) s->fork_release();
}

}  // namespace gpupool
