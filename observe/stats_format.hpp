// Stats reports: what one dump contains, and its three renderings (a human
// table, one JSON object following docs/stats-schema.json, Prometheus text).
// Pure functions of a Report, so tests can check them without a pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/stats.hpp"
#include "observe/bytes.hpp"

namespace gpupool::stats {

// Bumped whenever a field is removed or changes meaning (adding one is not a
// break); docs/stats.md keeps the history.
constexpr int kSchemaVersion = 2;

struct SignalInfo {
  std::string action;      // "stats", "free_held", "stop_holding"
  int signo = 0;           // 0: none configured
  bool installed = false;  // false once the program replaced our handler
};

struct Report {
  std::string version;  // gpupool's version
  long pid = 0;
  double time = 0;     // Unix time, seconds
  std::string reason;  // "signal", "interval", "exit", "request", "api"
  bool holding = true;
  Stats totals;
  std::vector<ArenaSnapshot> arenas;  // and one row per kind of destroyed ones
  std::vector<SignalInfo> signals;
  std::vector<std::string> warnings;
};

// Every Stats field with its name, in schema order; the renderers and the
// schema test iterate over it, so a field added to Stats must be added here
// (a test compares the count with sizeof(Stats)).
struct Field {
  const char* name;
  std::uint64_t Stats::*member;
  bool bytes;    // a byte count (rendered in readable units in the table)
  bool counter;  // monotonic (Prometheus counter) rather than a gauge
};
const std::vector<Field>& fields();

std::string to_text(const Report& report);
std::string to_json(const Report& report);  // one line, no trailing newline
// Whose a Prometheus text is: the labels every series has. `slot` is the
// number of the file the process writes (sys/outputs.hpp's
// NumberedNames), reused once its process is gone, so the series are as
// many as the processes that run at once; the pid is only gpupool_info's.
struct PromSource {
  long slot = 0;
  long uid = 0;
  std::string program;  // /proc/self/comm
};
std::string to_prometheus(const Report& report, const PromSource& source);
// How every to_prometheus text begins (how gpupool knows its own files).
inline constexpr const char* kPrometheusStart = "# HELP gpupool_info ";

// The dump's byte counts: 1536 -> "1.50 KiB"; below 1024 -> "512 B".
inline std::string human_bytes(std::uint64_t bytes) {
  return observe::bytes_text(bytes, observe::Digits::three_significant);
}
// "SIGUSR1", "SIGRTMIN+3", "none".
std::string signal_name(int signo);
// A JSON string's contents: quotes, backslashes and every control character
// (C0, DEL, C1) escaped.
std::string json_escape(const std::string& s);

}  // namespace gpupool::stats
