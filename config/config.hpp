// gpupool's configuration: every GPUPOOL_* variable, parsed once.
//
// The variables are listed in one table, config/options.def, which drives
// Config, the parser, `gpupool env` and docs/configuration.md's table (a test
// checks the page against it); the control actions in one more,
// config/actions.def.
//
//   options.cpp       the table, Config's defaults, its text for env and the docs
//   values.cpp        how each kind of value is read and written (values.hpp)
//   signal_names.cpp  the signals a variable may name
//   environment.cpp   parse()/load(): an environment into a Config and diagnostics
//   config.cpp        get(): the process's own, parsed once
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gpupool::config {

// A byte count, or a fraction of the memory it applies to ("25%").
struct SizeSpec {
  bool unlimited = true;
  bool percent = false;
  double fraction = 0;      // percent / 100 when percent
  std::uint64_t bytes = 0;  // when !percent && !unlimited
  // Bytes for memory of `capacity` bytes; SIZE_MAX when unlimited.
  std::size_t resolve(std::size_t capacity) const;
};

enum class Reuse { safe, ordered, fenced, immediate };
// Whether freed blocks wait for the device's work (on the host, or under
// ordered, by the device's own order where it can) rather than reuse at once.
inline bool reuse_waits(Reuse r) { return r != Reuse::immediate; }
// What GPUPOOL_SPLIT's pieces are cut from (GPUPOOL_SEGMENTS).
enum class Segments { driver, expandable };
// GPUPOOL_SPLIT=on: PyTorch's line between its small and large blocks.
inline constexpr std::uint64_t kSplitOn = std::uint64_t{1} << 20;

// Which allocations get their call stack recorded (GPUPOOL_SITES).
struct SiteSampling {
  enum class Mode { off, every, bytes };
  Mode mode = Mode::off;
  std::uint64_t n = 0;  // every: one allocation in n (1: all); bytes: one per n bytes asked for
  bool on() const { return mode != Mode::off; }
};
// Which gpupool processes on the node share held memory with this one.
enum class Neighbours { off, user, all };
enum class StatsFormat { text, json };
enum class LogLevel { trace, debug, info, warn, error, off };

// Every GPUPOOL_* variable's value, one member per row of options.def. A
// Config made in code holds the table's defaults, as a process with no
// GPUPOOL_* variable set runs with.
struct Config {
  Config();
#define GPUPOOL_OPTION(name, field, type, kind, def, doc) type field{};
#include "config/options.def"
};

// The control actions (actions.def), in its order.
enum Action : unsigned {
#define GPUPOOL_ACTION(id, name, verb, variable, field, signal, doc) id,
#include "config/actions.def"
  kActions
};
struct ActionInfo {
  const char* name;      // "free_held"
  const char* verb;      // "free-held"
  const char* variable;  // "GPUPOOL_SIGNAL_FREE_HELD"
  int Config::*signal;   // the member that variable sets
};
inline constexpr ActionInfo kActionInfo[kActions] = {
#define GPUPOOL_ACTION(id, name, verb, variable, field, signal, doc) \
  {name, verb, #variable, &Config::field},
#include "config/actions.def"
};
// The action whose verb is `verb`, or kActions.
Action action_of_verb(std::string_view verb);

// The smallest CUDA device request served by pieces (ArenaOptions::split_min;
// 0: none): GPUPOOL_SPLIT, or kSplitOn when it is off and GPUPOOL_SEGMENTS
// is expandable.
std::uint64_t split_min(const Config& config);

// One problem found while parsing, already worded for the log.
struct Diagnostic {
  std::string variable;
  std::string message;
  LogLevel level = LogLevel::warn;  // added: debug for "secure process, env ignored"
};

// Parse from an environ-style array ("NAME=value", NULL-terminated).
// Never fails: bad values keep their defaults and add a diagnostic.
Config parse(const char* const* envp, std::vector<Diagnostic>* diagnostics);

// What the process's configuration is (sys/process_config.hpp: get()):
// parse(envp) unless `secure` (AT_SECURE), in which case the environment is
// not looked at and the defaults are returned.
Config load(const char* const* envp, bool secure, std::vector<Diagnostic>* diagnostics);

// One row of the table, for `gpupool env` and the docs/configuration.md check.
struct OptionInfo {
  const char* name;
  const char* type;
  const char* default_value;
  const char* doc;
};
const std::vector<OptionInfo>& options();

// The markdown table of options() that docs/configuration.md carries between
// <!-- options-table:begin --> and <!-- options-table:end -->.
std::string options_markdown();

// A value of `config` as text in the form its variable accepts (for
// `gpupool env`); empty for an unknown name.
std::string value_text(const Config& config, const std::string& name);

// Why `value` is not a value variable `name` takes ("is not a size
// (accepted: ...)"), for the launcher's option checks; empty when it is
// one, or when `name` is no variable.
std::string value_problem(const std::string& name, const std::string& value);

// Signal parsing, exposed for the launcher and tests. Returns the signal
// number (0 for none/off/0) or -1 with *why set.
int parse_signal(const std::string& text, std::string* why);
// "USR1", "RTMIN+3", "none" for 0.
std::string signal_name(int signo);

// The value parsers, exposed for the launcher's option checks and tests:
// true and *out set, or false and *why set to a phrase ("is not a size").
bool parse_size(const std::string& text, bool allow_percent, SizeSpec* out, std::string* why);
bool parse_duration(const std::string& text, std::uint64_t* ns, std::string* why);
// 1/0, true/false, yes/no, on/off (any case, surrounding blanks). Allocates
// nothing: the library's load-time code uses it too.
bool parse_bool(std::string_view text, bool* out);

}  // namespace gpupool::config
