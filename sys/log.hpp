// The "gpupool" logger, configured from GPUPOOL_LOG / GPUPOOL_LOG_FILE:
// lines "gpupool[PID]: LEVEL: message", formatted with fmt, each written
// with one write(2) to the log file or stderr (sys/log.cpp says why).
#pragma once

#include <cxxabi.h>

#include <sys/types.h>
#include <iterator>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "core/lock_rank.hpp"
#include "core/thread_safety.hpp"
#include "sys/io.hpp"
#include "sys/process_config.hpp"

namespace gpupool {

class Logger {
 public:
  using Level = config::LogLevel;

  // `file` empty: stderr; else a GPUPOOL_LOG_FILE pattern (%p: the pid).
  Logger(Level level, std::string file);
  // As `config` asks, its file opened: if that fails it writes to stderr
  // and *problem (when given) says why.
  Logger(const config::Config& config, std::string* problem);

  template <class... A>
  void trace(fmt::format_string<A...> f, A&&... a) {
    log(Level::trace, f, std::forward<A>(a)...);
  }
  template <class... A>
  void debug(fmt::format_string<A...> f, A&&... a) {
    log(Level::debug, f, std::forward<A>(a)...);
  }
  template <class... A>
  void info(fmt::format_string<A...> f, A&&... a) {
    log(Level::info, f, std::forward<A>(a)...);
  }
  template <class... A>
  void warn(fmt::format_string<A...> f, A&&... a) {
    log(Level::warn, f, std::forward<A>(a)...);
  }
  template <class... A>
  void error(fmt::format_string<A...> f, A&&... a) {
    log(Level::error, f, std::forward<A>(a)...);
  }

  template <class... A>
  void log(Level level, fmt::format_string<A...> f, A&&... a) {
    if (!shown(level)) return;
    // Made in the buffer's own 500 bytes: a line is logged without the
    // heap, also where host memory ran out. One that cannot be made is
    // dropped: logging never throws into a hook. A thread's cancellation
    // still unwinds.
    try {
      fmt::memory_buffer line;
      begin_line(line, level);
      fmt::format_to(std::back_inserter(line), f, std::forward<A>(a)...);
      line.push_back('\n');
      write(line.data(), line.size());
    } catch (const abi::__forced_unwind&) {
      throw;
    } catch (...) {
    }
  }

  bool shown(Level level) const { return level >= level_ && level_ != Level::off; }

  // Opens the file now; false (and *why) when it cannot: lines go to
  // stderr until a later reopen succeeds.
  bool open(std::string* why);
  // fork(): the lock, taken before and released after in both processes.
  bool fork_prepare() GPUPOOL_TRY_ACQUIRE(true, mu_);
  void fork_release() GPUPOOL_RELEASE(mu_);
  // log_file_to_private_table() below.
  void to_private_table();

 private:
  // "gpupool[PID]: LEVEL: "
  static void begin_line(fmt::memory_buffer& line, Level level);
  void write(const char* line, std::size_t size);
  bool reopen(std::string* why);

  const Level level_;
  const std::string pattern_;
  // Last but the files thread's (core/lock_rank.hpp): any code may log
  // whatever it holds.
  Ranked<LockRank::log_sink> mu_;
  // Under mu_, and used on the files thread (io::in_private) while the
  // caller holds it: unannotated, since the analysis cannot follow a lock
  // into the lambda another thread runs.
  io::OwnedFd file_;
  bool file_in_program_ = false;  // opened in the program's table (no files thread then)
  pid_t pid_ = 0;
  bool warned_ = false;
};

// The process's logger. Never null, never destroyed. Configured on first use
// from config::get(); the configuration's diagnostics are logged then, once.
Logger& log();

// fork(): the process logger's lock, taken before and released after in
// both processes, so a child never inherits it held by a thread it lacks.
void log_fork_prepare();
void log_fork_release();

// The preloaded library's start, once its files thread is on (sys/io.hpp),
// on the program's thread: a log file the logger opened before (something
// logged first) is in the program's table; it is closed there and opened
// again in the private one. Nothing to do where there is no private table.
void log_file_to_private_table();

// A logger as log() builds it, for `config` (exposed for tests). If the file
// cannot be opened it writes to stderr and *problem says why.
std::unique_ptr<Logger> make_logger(const config::Config& config, std::string* problem);

}  // namespace gpupool
