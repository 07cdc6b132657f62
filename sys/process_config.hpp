// The process's configuration: its environment parsed once (config/), its
// diagnostics logged once (sys/log.cpp).
#pragma once

#include "config/config.hpp"

namespace gpupool::config {

// The process's configuration, parsed on first use (thread-safe). Reads no
// environment at all in a secure-execution (AT_SECURE) process. Diagnostics
// are logged once, through the gpupool logger.
const Config& get();

// get() without logging (and so without building the logger, which opens
// GPUPOOL_LOG_FILE): for the preloaded library's start, which turns its
// files thread on first (sys/io.hpp).
const Config& get_unlogged();

}  // namespace gpupool::config
