// The preloaded library's process-wide state: configuration, the one pool,
// and the control thread. Created at the first intercepted call, never at
// load time, and never destroyed (hooks may run during exit).
#pragma once

#include "config/config.hpp"
#include "core/pool.hpp"

#define GPUPOOL_EXPORT extern "C" __attribute__((visibility("default")))

namespace gpupool {

struct Runtime {
  const config::Config& config;
  Pool pool;
};

// The runtime, created on first call. nullptr when GPUPOOL_DISABLE=1 (or when
// the first call comes after exit began): hooks then pass calls straight
// through.
Runtime* runtime();

// True once exit has begun (atexit ran): no more calls into drivers that may
// already be torn down.
bool exiting();

}  // namespace gpupool
