// Parsing of the GPUPOOL_* variables, driven by config/options.def.
//
// Every value is parsed into a temporary and stored only when it is valid, so
// a bad value leaves the table's default in place; every problem becomes one
// Diagnostic, logged once by get(). Nothing here throws or aborts.
#include "config/config.hpp"

#include <sys/auxv.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <string_view>

#include "config/log.hpp"

extern char** environ;

namespace gpupool::config {

std::size_t SizeSpec::resolve(std::size_t capacity) const {
  if (unlimited) return SIZE_MAX;
  if (percent) {
    const long double b = static_cast<long double>(capacity) * fraction;
    if (b >= static_cast<long double>(SIZE_MAX)) return SIZE_MAX;
    return b <= 0 ? 0 : static_cast<std::size_t>(b);
  }
  return bytes > SIZE_MAX ? SIZE_MAX : static_cast<std::size_t>(bytes);
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

std::string upper(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return r;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Leading decimal digits of `s` into *out; false on overflow. *used = digits read.
bool take_u64(std::string_view s, std::uint64_t* out, std::size_t* used) {
  std::uint64_t v = 0;
  std::size_t i = 0;
  for (; i < s.size() && is_digit(s[i]); ++i) {
    const unsigned d = static_cast<unsigned>(s[i] - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  *used = i;
  return true;
}

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* r) {
  return __builtin_mul_overflow(a, b, r);
}

// ---- kinds: how one value is parsed and shown -------------------------------
// parse(text, out, reason): true and *out set, or false and *reason set to a
// phrase that follows the quoted value ("is not a size").

struct Bool {
  using T = bool;
  static constexpr const char* type = "bool";
  static constexpr const char* accepted = "1/0, true/false, yes/no, on/off";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    if (trim(text).empty()) { *reason = "is empty"; return false; }
    if (parse_bool(text, out)) return true;
    *reason = "is not a boolean";
    return false;
  }
  static std::string show(T v) { return v ? "1" : "0"; }
};

struct Bits {
  using T = unsigned;
  static constexpr const char* type = "integer 1..8";
  static constexpr const char* accepted = "an integer from 1 to 8";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string_view v = trim(text);
    if (v.empty()) { *reason = "is empty"; return false; }
    if (v.front() == '-') { *reason = "is negative"; return false; }
    std::uint64_t n = 0;
    std::size_t used = 0;
    if (!take_u64(v, &n, &used)) { *reason = "is out of range"; return false; }
    if (used == 0 || used != v.size()) { *reason = "is not an integer"; return false; }
    if (n < 1 || n > 8) { *reason = "is out of range"; return false; }
    *out = static_cast<T>(n);
    return true;
  }
  static std::string show(T v) { return std::to_string(v); }
};

constexpr const char* kSizeAccepted =
    "bytes with optional K/M/G/T[i][B] suffix, binary (1K = 1024), or unlimited";
constexpr const char* kSizeOrPercentAccepted =
    "bytes with optional K/M/G/T[i][B] suffix, binary (1K = 1024), or N% of the "
    "device's memory, or unlimited";

bool size_from(std::string_view text, bool allow_percent, SizeSpec* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) { *reason = "is empty"; return false; }
  if (lower(v) == "unlimited") { *out = SizeSpec{}; return true; }
  if (v.front() == '-') { *reason = "is negative"; return false; }
  if (v.back() == '%') {
    if (!allow_percent) { *reason = "is a percentage, which this variable does not take"; return false; }
    const std::string_view num = trim(v.substr(0, v.size() - 1));
    // Digits with an optional fraction: "25", "12.5".
    std::uint64_t whole = 0;
    std::size_t used = 0;
    if (!take_u64(num, &whole, &used) || used == 0) { *reason = "is not a size"; return false; }
    double value = static_cast<double>(whole);
    if (used < num.size()) {
      if (num[used] != '.') { *reason = "is not a size"; return false; }
      double scale = 0.1;
      std::size_t i = used + 1;
      if (i == num.size()) { *reason = "is not a size"; return false; }
      for (; i < num.size(); ++i) {
        if (!is_digit(num[i])) { *reason = "is not a size"; return false; }
        value += scale * (num[i] - '0');
        scale /= 10;
      }
    }
    if (value > 100) { *reason = "is more than 100%"; return false; }
    SizeSpec s;
    s.unlimited = false;
    s.percent = true;
    s.fraction = value / 100;
    *out = s;
    return true;
  }
  std::uint64_t n = 0;
  std::size_t used = 0;
  if (!take_u64(v, &n, &used)) { *reason = "overflows 64 bits"; return false; }
  if (used == 0) { *reason = "is not a size"; return false; }
  std::string_view rest = trim(v.substr(used));
  unsigned shift = 0;
  if (!rest.empty()) {
    switch (std::toupper(static_cast<unsigned char>(rest.front()))) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      case 'T': shift = 40; break;
      default: break;
    }
    if (shift) {
      rest.remove_prefix(1);
      if (!rest.empty() && (rest.front() == 'i' || rest.front() == 'I')) rest.remove_prefix(1);
    }
    if (!rest.empty() && (rest.front() == 'B' || rest.front() == 'b')) rest.remove_prefix(1);
    if (!rest.empty()) { *reason = "is not a size"; return false; }
  }
  std::uint64_t bytes = 0;
  if (mul_overflows(n, std::uint64_t{1} << shift, &bytes)) { *reason = "overflows 64 bits"; return false; }
  SizeSpec s;
  s.unlimited = false;
  s.percent = false;
  s.bytes = bytes;
  *out = s;
  return true;
}

std::string show_size(const SizeSpec& s) {
  if (s.unlimited) return "unlimited";
  if (s.percent) {
    std::string r = std::to_string(s.fraction * 100);  // "25.000000"
    if (r.find('.') != std::string::npos) {
      while (r.back() == '0') r.pop_back();
      if (r.back() == '.') r.pop_back();
    }
    return r + "%";
  }
  static const char* const units[] = {"", "K", "M", "G", "T"};
  std::uint64_t b = s.bytes;
  int u = 0;
  while (u < 4 && b != 0 && b % 1024 == 0) { b /= 1024; ++u; }
  return std::to_string(b) + units[u];
}

struct Size {
  using T = SizeSpec;
  static constexpr const char* type = "size";
  static constexpr const char* accepted = kSizeAccepted;
  static bool parse(std::string_view text, T* out, std::string* reason) {
    return size_from(text, false, out, reason);
  }
  static std::string show(const T& v) { return show_size(v); }
};

struct SizeOrPercent {
  using T = SizeSpec;
  static constexpr const char* type = "size or %";
  static constexpr const char* accepted = kSizeOrPercentAccepted;
  static bool parse(std::string_view text, T* out, std::string* reason) {
    return size_from(text, true, out, reason);
  }
  static std::string show(const T& v) { return show_size(v); }
};

// A plain count, or a size with a unit (*is_size): what GPUPOOL_SITES and
// GPUPOOL_SPLIT accept besides their words. `what` names both for errors.
bool count_or_size(std::string_view v, std::uint64_t* n, bool* is_size, std::string* reason,
                   const char* what) {
  if (v.front() == '-') { *reason = "is negative"; return false; }
  std::size_t used = 0;
  if (!take_u64(v, n, &used) || used == 0) { *reason = std::string("is not ") + what; return false; }
  *is_size = used != v.size();
  if (!*is_size) return true;
  SizeSpec size;
  if (!size_from(v, false, &size, reason)) return false;
  if (size.unlimited) { *reason = "is not a size"; return false; }
  *n = size.bytes;
  return true;
}

std::string show_bytes(std::uint64_t bytes) {
  SizeSpec s;
  s.unlimited = false;
  s.bytes = bytes;
  return show_size(s);
}

// GPUPOOL_SITES: a plain number counts allocations, a number with a unit is
// bytes, so "64MiB" and "64" cannot be mistaken for each other.
struct Sampling {
  using T = SiteSampling;
  static constexpr const char* type = "sampling";
  static constexpr const char* accepted =
      "off, all, N (one allocation in N) or a size with a unit (one allocation per that many "
      "bytes asked for, e.g. 64MiB)";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string_view v = trim(text);
    if (v.empty()) { *reason = "is empty"; return false; }
    const std::string l = lower(v);
    if (l == "off" || l == "none" || l == "0") { *out = {}; return true; }
    if (l == "all" || l == "on" || l == "1") { *out = {SiteSampling::Mode::every, 1}; return true; }
    std::uint64_t n = 0;
    bool is_size = false;
    if (!count_or_size(v, &n, &is_size, reason, "a count or a size")) return false;
    if (!is_size) { *out = {SiteSampling::Mode::every, n}; return true; }
    if (n == 0) { *reason = "is not a size of at least one byte"; return false; }
    *out = {SiteSampling::Mode::bytes, n};
    return true;
  }
  static std::string show(const T& v) {
    switch (v.mode) {
      case SiteSampling::Mode::off: return "off";
      case SiteSampling::Mode::every: return v.n == 1 ? "all" : std::to_string(v.n);
      case SiteSampling::Mode::bytes: return show_bytes(v.n);
    }
    return "off";
  }
};

// GPUPOOL_SPLIT: off, on (1 MiB: PyTorch's line between its small and large
// blocks), or the smallest request split, with a unit so that "1" reads as
// on and not as one byte.
struct Split {
  using T = std::uint64_t;  // bytes, 0 = off
  static constexpr std::uint64_t kOn = std::uint64_t{1} << 20;
  static constexpr const char* type = "off, on or size";
  static constexpr const char* accepted =
      "off, on (1MiB) or a size with a unit of at least 4KiB (e.g. 4MiB)";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string_view v = trim(text);
    if (v.empty()) { *reason = "is empty"; return false; }
    const std::string l = lower(v);
    if (l == "off" || l == "none" || l == "0" || l == "no" || l == "false") { *out = 0; return true; }
    if (l == "on" || l == "1" || l == "yes" || l == "true") { *out = kOn; return true; }
    std::uint64_t n = 0;
    bool is_size = false;
    if (!count_or_size(v, &n, &is_size, reason, "off, on or a size")) return false;
    if (!is_size) { *reason = "is a number without a unit"; return false; }
    if (n < 4096) { *reason = "is under 4KiB"; return false; }
    *out = n;
    return true;
  }
  static std::string show(const T& v) { return v == 0 ? "off" : show_bytes(v); }
};

struct Duration {
  using T = std::uint64_t;  // nanoseconds, 0 = off
  static constexpr const char* type = "duration";
  static constexpr const char* accepted =
      "a number with unit ns, us, ms, s, m or h (no unit: seconds), or off";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string_view v = trim(text);
    if (v.empty()) { *reason = "is empty"; return false; }
    const std::string l = lower(v);
    if (l == "off" || l == "none") { *out = 0; return true; }
    if (v.front() == '-') { *reason = "is negative"; return false; }
    std::uint64_t n = 0;
    std::size_t used = 0;
    if (!take_u64(v, &n, &used)) { *reason = "overflows 64 bits of nanoseconds"; return false; }
    if (used == 0) { *reason = "is not a duration"; return false; }
    const std::string unit = lower(trim(v.substr(used)));
    std::uint64_t scale = 0;
    if (unit.empty() || unit == "s") scale = 1'000'000'000;
    else if (unit == "ms") scale = 1'000'000;
    else if (unit == "us") scale = 1'000;
    else if (unit == "ns") scale = 1;
    else if (unit == "m" || unit == "min") scale = 60'000'000'000;
    else if (unit == "h") scale = 3'600'000'000'000;
    else { *reason = "is not a duration"; return false; }
    std::uint64_t ns = 0;
    if (mul_overflows(n, scale, &ns)) { *reason = "overflows 64 bits of nanoseconds"; return false; }
    *out = ns;
    return true;
  }
  static std::string show(T ns) {
    if (ns == 0) return "off";
    struct U { std::uint64_t scale; const char* name; };
    static const U units[] = {{3'600'000'000'000, "h"}, {60'000'000'000, "m"},
                              {1'000'000'000, "s"},     {1'000'000, "ms"},
                              {1'000, "us"},            {1, "ns"}};
    for (const U& u : units)
      if (ns % u.scale == 0) return std::to_string(ns / u.scale) + u.name;
    return std::to_string(ns) + "ns";
  }
};

struct ReuseKind {
  using T = Reuse;
  static constexpr const char* type = "safe, fenced or immediate";
  static constexpr const char* accepted = "safe, fenced or immediate";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string v = lower(trim(text));
    if (v.empty()) { *reason = "is empty"; return false; }
    if (v == "safe") { *out = Reuse::safe; return true; }
    if (v == "fenced") { *out = Reuse::fenced; return true; }
    if (v == "immediate") { *out = Reuse::immediate; return true; }
    *reason = "is not a reuse mode";
    return false;
  }
  static std::string show(T v) {
    return v == Reuse::safe ? "safe" : v == Reuse::fenced ? "fenced" : "immediate";
  }
};

struct NeighbourScope {
  using T = Neighbours;
  static constexpr const char* type = "off, user or all";
  static constexpr const char* accepted = "off (or 0), user (or 1), all";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string v = lower(trim(text));
    if (v.empty()) { *reason = "is empty"; return false; }
    if (v == "all") { *out = Neighbours::all; return true; }
    if (v == "user") { *out = Neighbours::user; return true; }
    bool b = false;
    if (parse_bool(v, &b)) { *out = b ? Neighbours::user : Neighbours::off; return true; }
    *reason = "is not a neighbour scope";
    return false;
  }
  static std::string show(T v) {
    return v == Neighbours::off ? "off" : v == Neighbours::user ? "user" : "all";
  }
};

struct Level {
  using T = LogLevel;
  static constexpr const char* type = "log level";
  static constexpr const char* accepted = "off, error, warn, info, debug or trace";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string v = lower(trim(text));
    if (v.empty()) { *reason = "is empty"; return false; }
    if (v == "off" || v == "none" || v == "0") *out = LogLevel::off;
    else if (v == "error" || v == "err") *out = LogLevel::error;
    else if (v == "warn" || v == "warning") *out = LogLevel::warn;
    else if (v == "info") *out = LogLevel::info;
    else if (v == "debug") *out = LogLevel::debug;
    else if (v == "trace") *out = LogLevel::trace;
    else { *reason = "is not a log level"; return false; }
    return true;
  }
  static std::string show(T v) {
    switch (v) {
      case LogLevel::trace: return "trace";
      case LogLevel::debug: return "debug";
      case LogLevel::info: return "info";
      case LogLevel::warn: return "warn";
      case LogLevel::error: return "error";
      case LogLevel::off: return "off";
    }
    return "warn";
  }
};

struct Path {
  using T = std::string;
  static constexpr const char* type = "path";
  static constexpr const char* accepted = "a file name";
  // Taken as is (file names may hold spaces); empty means unset.
  static bool parse(std::string_view text, T* out, std::string*) {
    *out = std::string(text);
    return true;
  }
  static std::string show(const T& v) { return v; }
};

// A process id, or none.
struct Pid {
  using T = long;
  static constexpr const char* type = "process id";
  static constexpr const char* accepted = "a process id, or none";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string_view v = trim(text);
    if (v.empty()) { *reason = "is empty"; return false; }
    if (lower(v) == "none") { *out = 0; return true; }
    std::uint64_t n = 0;
    std::size_t used = 0;
    if (!take_u64(v, &n, &used) || used == 0 || used != v.size() || n == 0) {
      *reason = "is not a process id";
      return false;
    }
    // Linux's pid_max is at most 2^22.
    if (n > std::numeric_limits<int>::max()) { *reason = "is out of range"; return false; }
    *out = static_cast<T>(n);
    return true;
  }
  static std::string show(T v) { return v > 0 ? std::to_string(v) : "none"; }
};

struct Format {
  using T = StatsFormat;
  static constexpr const char* type = "text or json";
  static constexpr const char* accepted = "text or json";
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const std::string v = lower(trim(text));
    if (v.empty()) { *reason = "is empty"; return false; }
    if (v == "text") { *out = StatsFormat::text; return true; }
    if (v == "json") { *out = StatsFormat::json; return true; }
    *reason = "is not a stats format";
    return false;
  }
  static std::string show(T v) { return v == StatsFormat::text ? "text" : "json"; }
};

constexpr const char* kSignalAccepted =
    "USR1, USR2, a real-time signal (RTMIN+n, RTMAX-n, or its number), or none";

struct Signal {
  using T = int;
  static constexpr const char* type = "signal";
  static constexpr const char* accepted = kSignalAccepted;
  static bool parse(std::string_view text, T* out, std::string* reason) {
    const int s = parse_signal(std::string(text), reason);
    if (s < 0) return false;
    *out = s;
    return true;
  }
  static std::string show(T v) { return signal_name(v); }
};

// ---- the table ---------------------------------------------------------------

struct Option {
  OptionInfo info;
  const char* accepted;
  bool (*apply)(Config&, std::string_view, std::string*);
  std::string (*show)(const Config&);
};

template <class K, class F>
bool apply_kind(F field, Config& c, std::string_view text, std::string* reason) {
  typename K::T value{};
  if (!K::parse(text, &value, reason)) return false;
  c.*field = value;
  return true;
}

const std::vector<Option>& table() {
  static const std::vector<Option> t = {
#define GPUPOOL_OPTION(name, field, kind, def, doc)                                       \
  Option{OptionInfo{#name, kind::type, def, doc}, kind::accepted,                         \
         [](Config& c, std::string_view v, std::string* r) {                              \
           return apply_kind<kind>(&Config::field, c, v, r);                              \
         },                                                                               \
         [](const Config& c) { return kind::show(c.field); }},
#include "config/options.def"
  };
  return t;
}

const Option* find(std::string_view name) {
  for (const Option& o : table())
    if (name == o.info.name) return &o;
  return nullptr;
}

// Text from the environment as shown in a message: quotes and control bytes
// escaped, long values cut, so a hostile environment cannot forge log lines.
std::string clean(std::string_view v) {
  constexpr std::size_t kMax = 80;
  std::string r;
  for (std::size_t i = 0; i < v.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') { r += '\\'; r += static_cast<char>(c); }
    else if (c < 0x20 || c == 0x7f) {
      static const char hex[] = "0123456789abcdef";
      r += "\\x";
      r += hex[c >> 4];
      r += hex[c & 15];
    } else r += static_cast<char>(c);
  }
  if (v.size() > kMax) r += "...";
  return r;
}

std::string quote(std::string_view v) {
  std::string r = "\"" + clean(v.substr(0, 80)) + "\"";
  if (v.size() > 80) r += "...";
  return r;
}

// Optimal string alignment distance (a transposition counts as one edit).
// Names are at most 64 bytes here (closest() checks), so the table is small.
std::size_t distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size(), m = b.size(), w = m + 1;
  std::vector<std::size_t> d((n + 1) * w);
  for (std::size_t i = 0; i <= n; ++i) d[i * w] = i;
  for (std::size_t j = 0; j <= m; ++j) d[j] = j;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      std::size_t v = std::min({d[(i - 1) * w + j] + 1, d[i * w + j - 1] + 1,
                                d[(i - 1) * w + j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        v = std::min(v, d[(i - 2) * w + j - 2] + 1);
      d[i * w + j] = v;
    }
  return d[n * w + m];
}

constexpr std::string_view kPrefix = "GPUPOOL_";

// The known name closest to `name`, or "" if none is plausibly meant.
std::string closest(std::string_view name) {
  // Bound the work for absurd names from a hostile or fuzzed environment.
  if (name.size() > 64) return "";
  const std::string u = upper(name);
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const Option& o : table()) {
    const std::size_t d = distance(u, o.info.name);
    if (d < best_d) { best_d = d; best = o.info.name; }
  }
  const std::size_t suffix = u.size() > kPrefix.size() ? u.size() - kPrefix.size() : 0;
  if (best_d <= std::max<std::size_t>(2, suffix / 3)) return best;
  // "GPUPOOL_LOG_LEVEL": the longest known name it extends.
  best.clear();
  for (const Option& o : table()) {
    const std::string known = std::string(o.info.name) + "_";
    if (u.rfind(known, 0) == 0 && known.size() > best.size() + 1) best = o.info.name;
  }
  if (!best.empty()) return best;
  // "GPUPOOL_STATS": a known name it starts.
  if (suffix >= 3)
    for (const Option& o : table())
      if (std::string_view(o.info.name).substr(0, u.size()) == u) return o.info.name;
  return "";
}

void diag(std::vector<Diagnostic>* out, std::string variable, std::string message,
          LogLevel level = LogLevel::warn) {
  if (out) out->push_back(Diagnostic{std::move(variable), std::move(message), level});
}

// Config{} with the table's defaults applied.
const Config& defaults() {
  static const Config c = [] {
    Config r;
    for (const Option& o : table()) {
      std::string reason;
      // The table's defaults parse (a unit test checks it); this only guards
      // against a bad edit of options.def.
      (void)o.apply(r, o.info.default_value, &reason);
    }
    return r;
  }();
  return c;
}

// Two actions on one signal: values set in the environment win over
// defaults; between two set values the later in the table falls back to its
// default if that is free, else to none.
void resolve_signal_clashes(Config& c, const bool explicit_set[3],
                            std::vector<Diagnostic>* diags) {
  struct Slot { const char* name; int Config::*field; int def; };
  const Config& d = defaults();
  const Slot slots[3] = {
      {"GPUPOOL_SIGNAL_STATS", &Config::signal_stats, d.signal_stats},
      {"GPUPOOL_SIGNAL_FREE_HELD", &Config::signal_free_held, d.signal_free_held},
      {"GPUPOOL_SIGNAL_STOP_HOLDING", &Config::signal_stop_holding, d.signal_stop_holding}};
  struct Taken { int signo; const char* by; };
  std::vector<Taken> taken;
  auto owner = [&](int s) -> const char* {
    for (const Taken& t : taken)
      if (t.signo == s) return t.by;
    return nullptr;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (int i = 0; i < 3; ++i) {
      if (explicit_set[i] != (pass == 0)) continue;
      const Slot& s = slots[i];
      int& v = c.*(s.field);
      if (v == 0) continue;
      const char* by = owner(v);
      if (!by) { taken.push_back({v, s.name}); continue; }
      const int was = v;
      if (explicit_set[i] && s.def != 0 && !owner(s.def)) {
        v = s.def;
        taken.push_back({v, s.name});
      } else {
        v = 0;
      }
      diag(diags, s.name,
           std::string(s.name) + (explicit_set[i] ? "=" : "'s default ") + quote(signal_name(was)) +
               " is the signal of " + by + " already; using " +
               (v ? "the default (" + signal_name(v) + ")" : std::string("none")) + " for " +
               s.name);
    }
  }
}

}  // namespace

// ---- signals -----------------------------------------------------------------

namespace {
struct SignalName { const char* name; int signo; };
const SignalName kSignals[] = {
    {"HUP", SIGHUP},   {"INT", SIGINT},       {"QUIT", SIGQUIT},   {"ILL", SIGILL},
    {"TRAP", SIGTRAP}, {"ABRT", SIGABRT},     {"IOT", SIGIOT},     {"BUS", SIGBUS},
    {"FPE", SIGFPE},   {"KILL", SIGKILL},     {"USR1", SIGUSR1},   {"SEGV", SIGSEGV},
    {"USR2", SIGUSR2}, {"PIPE", SIGPIPE},     {"ALRM", SIGALRM},   {"TERM", SIGTERM},
#ifdef SIGSTKFLT
    {"STKFLT", SIGSTKFLT},
#endif
    {"CHLD", SIGCHLD}, {"CLD", SIGCHLD},      {"CONT", SIGCONT},   {"STOP", SIGSTOP},
    {"TSTP", SIGTSTP}, {"TTIN", SIGTTIN},     {"TTOU", SIGTTOU},   {"URG", SIGURG},
    {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},     {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF},
    {"WINCH", SIGWINCH}, {"IO", SIGIO},       {"POLL", SIGPOLL},
#ifdef SIGPWR
    {"PWR", SIGPWR},
#endif
    {"SYS", SIGSYS},
};
}  // namespace

int parse_signal(const std::string& text, std::string* why) {
  std::string scratch;
  if (!why) why = &scratch;
  std::string v = upper(trim(text));
  if (v.empty()) { *why = "is empty"; return -1; }
  if (v == "NONE" || v == "OFF" || v == "0") return 0;
  int signo = -1;
  if (is_digit(v.front())) {
    std::uint64_t n = 0;
    std::size_t used = 0;
    if (!take_u64(v, &n, &used) || used != v.size()) { *why = "is not a signal"; return -1; }
    if (n < 1 || n > static_cast<std::uint64_t>(SIGRTMAX)) { *why = "is not a signal number"; return -1; }
    signo = static_cast<int>(n);
  } else {
    if (v.front() == '-') { *why = "is negative"; return -1; }
    if (v.rfind("SIG", 0) == 0) v.erase(0, 3);
    if (v.rfind("RTMIN", 0) == 0 || v.rfind("RTMAX", 0) == 0) {
      const bool min = v[4] == 'N';
      std::string_view rest = trim(std::string_view(v).substr(5));
      std::uint64_t off = 0;
      if (!rest.empty()) {
        if (rest.front() != (min ? '+' : '-')) { *why = "is not a signal"; return -1; }
        rest = trim(rest.substr(1));
        std::size_t used = 0;
        if (!take_u64(rest, &off, &used) || used == 0 || used != rest.size()) {
          *why = "is not a signal";
          return -1;
        }
      }
      const std::uint64_t span = static_cast<std::uint64_t>(SIGRTMAX - SIGRTMIN);
      if (off > span) { *why = "is beyond the real-time signals"; return -1; }
      signo = min ? SIGRTMIN + static_cast<int>(off) : SIGRTMAX - static_cast<int>(off);
    } else {
      for (const SignalName& s : kSignals)
        if (v == s.name) { signo = s.signo; break; }
      if (signo < 0) { *why = "is not a signal"; return -1; }
    }
  }
  switch (signo) {
    case SIGKILL:
    case SIGSTOP:
      *why = "cannot be caught";
      return -1;
    case SIGSEGV:
    case SIGBUS:
    case SIGILL:
    case SIGFPE:
    case SIGABRT:
    case SIGTRAP:
    case SIGSYS:
      *why = "reports a fault in the program and cannot be borrowed safely";
      return -1;
    default:
      break;
  }
  // Between the classic signals and SIGRTMIN: kept by the C library (glibc
  // uses them for thread cancellation and setxid).
  if (signo > SIGSYS && signo < SIGRTMIN) { *why = "is reserved by the C library"; return -1; }
  // Every other classic signal has a meaning people rely on: TERM, INT and
  // HUP stop the program, PIPE and CHLD drive its I/O and children, TSTP
  // and CONT job control. A handler of ours would take that away, so only
  // the signals left to applications are borrowed.
  if (signo != SIGUSR1 && signo != SIGUSR2 && signo < SIGRTMIN) {
    *why = "has a default action programs rely on";
    return -1;
  }
  return signo;
}

bool parse_bool(std::string_view text, bool* out) {
  const std::string_view v = trim(text);
  auto is = [&](std::string_view word) {
    if (v.size() != word.size()) return false;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(v[i])) != word[i]) return false;
    return true;
  };
  if (is("1") || is("true") || is("yes") || is("on")) { *out = true; return true; }
  if (is("0") || is("false") || is("no") || is("off")) { *out = false; return true; }
  return false;
}

bool parse_size(const std::string& text, bool allow_percent, SizeSpec* out, std::string* why) {
  std::string scratch;
  SizeSpec s;
  if (!size_from(text, allow_percent, &s, why ? why : &scratch)) return false;
  if (out) *out = s;
  return true;
}

bool parse_duration(const std::string& text, std::uint64_t* ns, std::string* why) {
  std::string scratch;
  std::uint64_t v = 0;
  if (!Duration::parse(text, &v, why ? why : &scratch)) return false;
  if (ns) *ns = v;
  return true;
}

std::string signal_name(int signo) {
  if (signo == 0) return "none";
  for (const SignalName& s : kSignals)
    if (s.signo == signo && std::strcmp(s.name, "IOT") && std::strcmp(s.name, "CLD") &&
        std::strcmp(s.name, "POLL"))
      return s.name;
  if (signo == SIGRTMIN) return "RTMIN";
  if (signo == SIGRTMAX) return "RTMAX";
  if (signo > SIGRTMIN && signo < SIGRTMAX) {
    // The shorter of the two spellings, RTMIN+n first on a tie.
    const int up = signo - SIGRTMIN, down = SIGRTMAX - signo;
    return up <= down ? "RTMIN+" + std::to_string(up) : "RTMAX-" + std::to_string(down);
  }
  return std::to_string(signo);
}

// ---- public API ------------------------------------------------------------------

Config parse(const char* const* envp, std::vector<Diagnostic>* diagnostics) {
  Config c = defaults();
  const auto& t = table();
  std::vector<bool> seen(t.size(), false);
  bool signal_set[3] = {false, false, false};
  for (const char* const* e = envp; e && *e; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    std::size_t index = t.size();
    for (std::size_t i = 0; i < t.size(); ++i)
      if (name == t[i].info.name) { index = i; break; }
    if (index == t.size()) {
      const std::string near = closest(name);
      diag(diagnostics, std::string(name),
           clean(name) + " is not a gpupool variable and is ignored" +
               (near.empty() ? std::string(" (`gpupool env` lists them)")
                             : "; did you mean " + near + "?"));
      continue;
    }
    // getenv() semantics: the first definition counts.
    if (seen[index]) continue;
    seen[index] = true;
    const Option& o = t[index];
    std::string reason;
    if (!o.apply(c, value, &reason)) {
      const std::string def = *o.info.default_value ? o.info.default_value : "unset";
      diag(diagnostics, o.info.name,
           std::string(o.info.name) + "=" + quote(value) + " " + reason + " (accepted: " +
               o.accepted + "); using the default (" + def + ")");
      continue;
    }
    if (name == "GPUPOOL_SIGNAL_STATS") signal_set[0] = true;
    if (name == "GPUPOOL_SIGNAL_FREE_HELD") signal_set[1] = true;
    if (name == "GPUPOOL_SIGNAL_STOP_HOLDING") signal_set[2] = true;
  }
  resolve_signal_clashes(c, signal_set, diagnostics);
  return c;
}

Config load(const char* const* envp, bool secure, std::vector<Diagnostic>* diagnostics) {
  if (secure) {
    diag(diagnostics, "",
         "secure-execution process (setuid, setgid or capabilities): GPUPOOL_* variables are "
         "ignored, using defaults",
         LogLevel::debug);
    return defaults();
  }
  return parse(envp, diagnostics);
}

namespace detail {
struct Parsed {
  Config config;
  std::vector<Diagnostic> diagnostics;
};

// Parsed once; no logging here (log() builds its logger from this, then
// emits the diagnostics).
const Parsed& parsed() {
  static const Parsed* p = [] {
    auto* r = new Parsed;  // never destroyed: hooks may run during exit
    r->config = load(environ, getauxval(AT_SECURE) != 0, &r->diagnostics);
    return r;
  }();
  return *p;
}

const Config& parsed_config() { return parsed().config; }
const std::vector<Diagnostic>& parsed_diagnostics() { return parsed().diagnostics; }
}  // namespace detail

const Config& get_unlogged() { return detail::parsed_config(); }

const Config& get() {
  const Config& c = detail::parsed_config();
  // Makes sure the diagnostics have been logged (once, by log()).
  (void)gpupool::log();
  return c;
}

const std::vector<OptionInfo>& options() {
  static const std::vector<OptionInfo> v = [] {
    std::vector<OptionInfo> r;
    for (const Option& o : table()) r.push_back(o.info);
    return r;
  }();
  return v;
}

std::string options_markdown() {
  std::string r = "| Variable | Type | Default | Description |\n|---|---|---|---|\n";
  for (const OptionInfo& o : options()) {
    r += "| `";
    r += o.name;
    r += "` | ";
    r += o.type;
    r += " | ";
    if (*o.default_value) {
      r += '`';
      r += o.default_value;
      r += '`';
    }
    r += " | ";
    r += o.doc;
    r += " |\n";
  }
  return r;
}

std::string value_text(const Config& config, const std::string& name) {
  const Option* o = find(name);
  return o ? o->show(config) : std::string();
}

}  // namespace gpupool::config
