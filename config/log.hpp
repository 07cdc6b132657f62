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

// A logger as log() builds it, for `config`: named "gpupool", pattern
// "gpupool[PID]: LEVEL: message", writing to config.log_file (appended, %p
// the pid, opened as config/io.hpp's open_output does) or stderr, never
// registered with spdlog, no thread. If the file cannot be opened it writes
// to stderr and *problem says why. (Exposed for tests.)
std::shared_ptr<spdlog::logger> make_logger(const config::Config& config, std::string* problem);

}  // namespace gpupool
