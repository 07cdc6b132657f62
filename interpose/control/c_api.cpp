// The gpupool_* C API (docs/c-api.md). A program (or a test) finds these
// with dlsym(RTLD_DEFAULT, "gpupool_stats_json") and so runs unchanged
// without gpupool. Every function starts gpupool's runtime if no GPU call
// has yet, and none of them may crash the caller: all exceptions stop here.
#include <cstddef>
#include <cstring>
#include <string>

#include "interpose/control/control.hpp"
#include "interpose/hook_scope.hpp"
#include "interpose/runtime.hpp"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace {

std::size_t copy_out(const std::string& s, char* buf, std::size_t len) {
  if (buf && len) {
    const std::size_t n = s.size() < len - 1 ? s.size() : len - 1;
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return s.size();
}

std::size_t render(char* buf, std::size_t len, bool json) noexcept {
  const gpupool::HookScope hook_scope;
  try {
    gpupool::Runtime* rt = gpupool::runtime();
    if (!rt) {
      if (buf && len) buf[0] = '\0';
      return 0;
    }
    return copy_out(gpupool::control::render(*rt, json, "api"), buf, len);
  } catch (...) {
    if (buf && len) buf[0] = '\0';
    return 0;
  }
}

}  // namespace

GPUPOOL_EXPORT std::size_t gpupool_stats_json(char* buf, std::size_t len) {
  return render(buf, len, true);
}

GPUPOOL_EXPORT std::size_t gpupool_stats_text(char* buf, std::size_t len) {
  return render(buf, len, false);
}

GPUPOOL_EXPORT int gpupool_dump_stats(void) {
  const gpupool::HookScope hook_scope;
  try {
    gpupool::Runtime* rt = gpupool::runtime();
    return rt && gpupool::control::dump(*rt, "api") ? 0 : -1;
  } catch (...) {
    return -1;
  }
}

namespace {
// One of control's actions on this process's runtime: 0 when it was done,
// -1 when there is no runtime or it failed.
int act(bool (*action)(gpupool::Runtime&)) {
  const gpupool::HookScope hook_scope;
  try {
    gpupool::Runtime* rt = gpupool::runtime();
    return rt && action(*rt) ? 0 : -1;
  } catch (...) {
    return -1;
  }
}
}  // namespace

GPUPOOL_EXPORT int gpupool_free_held(void) { return act(gpupool::control::free_held); }

GPUPOOL_EXPORT int gpupool_stop_holding(void) { return act(gpupool::control::stop_holding); }

GPUPOOL_EXPORT int gpupool_reset_peak(void) { return act(gpupool::control::reset_peaks); }

namespace {

// The trace calls: 0, or -1 with why in msg (snprintf's way; msg may be
// NULL). On success msg is the file written.
int trace_call(const char* path, char* msg, std::size_t msg_len, bool start) noexcept {
  const gpupool::HookScope hook_scope;
  std::string said;
  bool ok = false;
  try {
    gpupool::Runtime* rt = gpupool::runtime();
    if (!rt) {
      said = "gpupool is disabled (GPUPOOL_DISABLE=1)";
    } else if (start && (!path || !*path)) {
      said = "no trace file named (path is NULL or empty)";
    } else {
      ok = start ? gpupool::control::trace_start(*rt, path, &said)
                 : gpupool::control::trace_stop(*rt, &said);
    }
  } catch (...) {
    ok = false;
    said = "out of host memory";
  }
  copy_out(said, msg, msg_len);
  return ok ? 0 : -1;
}

}  // namespace

GPUPOOL_EXPORT int gpupool_trace_start(const char* path, char* msg, std::size_t msg_len) {
  return trace_call(path, msg, msg_len, true);
}

GPUPOOL_EXPORT int gpupool_trace_stop(char* msg, std::size_t msg_len) {
  return trace_call(nullptr, msg, msg_len, false);
}

GPUPOOL_EXPORT std::size_t gpupool_snapshot_json(char* buf, std::size_t len) {
  const gpupool::HookScope hook_scope;
  try {
    gpupool::Runtime* rt = gpupool::runtime();
    if (!rt) {
      if (buf && len) buf[0] = '\0';
      return 0;
    }
    return copy_out(gpupool::control::snapshot_json(*rt), buf, len);
  } catch (...) {
    if (buf && len) buf[0] = '\0';
    return 0;
  }
}

GPUPOOL_EXPORT int gpupool_active(void) {
  try {
    return gpupool::runtime() != nullptr ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

GPUPOOL_EXPORT const char* gpupool_version(void) { return GPUPOOL_VERSION; }
