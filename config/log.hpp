// The "gpupool" logger (spdlog), configured from GPUPOOL_LOG / GPUPOOL_LOG_FILE.
#pragma once

#include <spdlog/spdlog.h>

namespace gpupool {

// Never null. Configured on first use from config::get(); until then (and if
// the log file cannot be opened) it writes to stderr with a "gpupool" prefix.
spdlog::logger& log();

}  // namespace gpupool
