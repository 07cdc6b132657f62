// The "gpupool" logger (spdlog), configured from GPUPOOL_LOG / GPUPOOL_LOG_FILE.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

#include "config/config.hpp"

namespace gpupool {

// Never null. Configured on first use from config::get(); until then (and if
// the log file cannot be opened) it writes to stderr with a "gpupool" prefix.
spdlog::logger& log();

// fork(): the process logger's lock, taken before and released after in
// both processes, so a child never inherits it held by a thread it lacks.
void log_fork_prepare();
void log_fork_release();

// The preloaded library's start, once its files thread is on (config/io.hpp),
// on the program's thread: a log file the logger opened before (something
// logged first) is in the program's table; it is closed there and opened
// again in the private one. Nothing to do where there is no private table.
void log_file_to_private_table();

// A logger as log() builds it, for `config`: named "gpupool", pattern
// "gpupool[PID]: LEVEL: message", writing to config.log_file (appended, %p
// the pid, opened as config/io.hpp's open_output does) or stderr, never
// registered with spdlog, no thread. If the file cannot be opened it writes
// to stderr and *problem says why. (Exposed for tests.)
std::shared_ptr<spdlog::logger> make_logger(const config::Config& config, std::string* problem);

}  // namespace gpupool
