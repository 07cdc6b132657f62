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
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>

namespace gpupool {
namespace config::detail {
const Config& parsed_config();
const std::vector<Diagnostic>& parsed_diagnostics();
}  // namespace config::detail

namespace {

class FdSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  FdSink(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~FdSink() override {
    if (owned_) ::close(fd_);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    const char* p = buf.data();
    std::size_t left = buf.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // nowhere to report a failing log; drop the line
      p += n;
      left -= static_cast<std::size_t>(n);
    }
  }
  void flush_() override {}

 private:
  int fd_;
  bool owned_;
};

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
  int fd = STDERR_FILENO;
  bool owned = false;
  if (!config.log_file.empty()) {
    const int f = ::open(config.log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
    if (f >= 0) {
      fd = f;
      owned = true;
    } else if (problem) {
      *problem = "cannot open GPUPOOL_LOG_FILE=\"" + config.log_file + "\" (" + std::strerror(errno) +
                 "); logging to stderr";
    }
  }
  auto sink = std::make_shared<FdSink>(fd, owned);
  auto logger = std::make_shared<spdlog::logger>("gpupool", std::move(sink));
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
  static const std::shared_ptr<spdlog::logger>* const holder =
      new std::shared_ptr<spdlog::logger>(make_logger(config::detail::parsed_config(), &problem));
  spdlog::logger* const logger = holder->get();
  static std::atomic<bool> emitted{false};
  if (!emitted.load(std::memory_order_acquire) && !emitted.exchange(true)) {
    if (!problem.empty()) logger->warn("{}", problem);
    for (const config::Diagnostic& d : config::detail::parsed_diagnostics())
      logger->log(to_spdlog(d.level), "{}", d.message);
  }
  return *logger;
}

}  // namespace gpupool
