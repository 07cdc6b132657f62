// The readers and writers of the GPUPOOL_* value kinds (values.hpp).
#include "config/values.hpp"

#include <cctype>
#include <cstdint>
#include <limits>

namespace gpupool::config {
namespace values {

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

namespace {

bool mul_overflows(std::uint64_t a, std::uint64_t b, std::uint64_t* r) {
  return __builtin_mul_overflow(a, b, r);
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
  while (u < 4 && b != 0 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + units[u];
}

// A plain count, or a size with a unit (*is_size): what GPUPOOL_SITES and
// GPUPOOL_SPLIT accept besides their words. `what` names both for errors.
bool count_or_size(std::string_view v, std::uint64_t* n, bool* is_size, std::string* reason,
                   const char* what) {
  if (v.front() == '-') {
    *reason = "is negative";
    return false;
  }
  std::size_t used = 0;
  if (!take_u64(v, n, &used) || used == 0) {
    *reason = std::string("is not ") + what;
    return false;
  }
  *is_size = used != v.size();
  if (!*is_size) return true;
  SizeSpec size;
  if (!size_from(v, false, &size, reason)) return false;
  if (size.unlimited) {
    *reason = "is not a size";
    return false;
  }
  *n = size.bytes;
  return true;
}

std::string show_bytes(std::uint64_t bytes) {
  SizeSpec s;
  s.unlimited = false;
  s.bytes = bytes;
  return show_size(s);
}

}  // namespace

bool Bool::parse(std::string_view text, T* out, std::string* reason) {
  if (trim(text).empty()) {
    *reason = "is empty";
    return false;
  }
  if (parse_bool(text, out)) return true;
  *reason = "is not a boolean";
  return false;
}

std::string Bool::show(const T& v) { return v ? "1" : "0"; }

bool Bits::parse(std::string_view text, T* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v.front() == '-') {
    *reason = "is negative";
    return false;
  }
  std::uint64_t n = 0;
  std::size_t used = 0;
  if (!take_u64(v, &n, &used)) {
    *reason = "is out of range";
    return false;
  }
  if (used == 0 || used != v.size()) {
    *reason = "is not an integer";
    return false;
  }
  if (n < 1 || n > 8) {
    *reason = "is out of range";
    return false;
  }
  *out = static_cast<T>(n);
  return true;
}

std::string Bits::show(const T& v) { return std::to_string(v); }

bool size_from(std::string_view text, bool allow_percent, SizeSpec* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (lower(v) == "unlimited") {
    *out = SizeSpec{};
    return true;
  }
  if (v.front() == '-') {
    *reason = "is negative";
    return false;
  }
  if (v.back() == '%') {
    if (!allow_percent) {
      *reason = "is a percentage, which this variable does not take";
      return false;
    }
    const std::string_view num = trim(v.substr(0, v.size() - 1));
    // Digits with an optional fraction: "25", "12.5".
    std::uint64_t whole = 0;
    std::size_t used = 0;
    if (!take_u64(num, &whole, &used) || used == 0) {
      *reason = "is not a size";
      return false;
    }
    double value = static_cast<double>(whole);
    if (used < num.size()) {
      if (num[used] != '.') {
        *reason = "is not a size";
        return false;
      }
      double scale = 0.1;
      std::size_t i = used + 1;
      if (i == num.size()) {
        *reason = "is not a size";
        return false;
      }
      for (; i < num.size(); ++i) {
        if (!is_digit(num[i])) {
          *reason = "is not a size";
          return false;
        }
        value += scale * (num[i] - '0');
        scale /= 10;
      }
    }
    if (value > 100) {
      *reason = "is more than 100%";
      return false;
    }
    SizeSpec s;
    s.unlimited = false;
    s.percent = true;
    s.fraction = value / 100;
    *out = s;
    return true;
  }
  std::uint64_t n = 0;
  std::size_t used = 0;
  if (!take_u64(v, &n, &used)) {
    *reason = "overflows 64 bits";
    return false;
  }
  if (used == 0) {
    *reason = "is not a size";
    return false;
  }
  std::string_view rest = trim(v.substr(used));
  unsigned shift = 0;
  if (!rest.empty()) {
    switch (std::toupper(static_cast<unsigned char>(rest.front()))) {
      case 'K':
        shift = 10;
        break;
      case 'M':
        shift = 20;
        break;
      case 'G':
        shift = 30;
        break;
      case 'T':
        shift = 40;
        break;
      default:
        break;
    }
    if (shift) {
      rest.remove_prefix(1);
      if (!rest.empty() && (rest.front() == 'i' || rest.front() == 'I')) rest.remove_prefix(1);
    }
    if (!rest.empty() && (rest.front() == 'B' || rest.front() == 'b')) rest.remove_prefix(1);
    if (!rest.empty()) {
      *reason = "is not a size";
      return false;
    }
  }
  std::uint64_t bytes = 0;
  if (mul_overflows(n, std::uint64_t{1} << shift, &bytes)) {
    *reason = "overflows 64 bits";
    return false;
  }
  SizeSpec s;
  s.unlimited = false;
  s.percent = false;
  s.bytes = bytes;
  *out = s;
  return true;
}

bool Size::parse(std::string_view text, T* out, std::string* reason) {
  return size_from(text, false, out, reason);
}

std::string Size::show(const T& v) { return show_size(v); }

bool SizeOrPercent::parse(std::string_view text, T* out, std::string* reason) {
  return size_from(text, true, out, reason);
}

std::string SizeOrPercent::show(const T& v) { return show_size(v); }

bool Sampling::parse(std::string_view text, T* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  const std::string l = lower(v);
  if (l == "off" || l == "none" || l == "0") {
    *out = {};
    return true;
  }
  if (l == "all" || l == "on" || l == "1") {
    *out = {SiteSampling::Mode::every, 1};
    return true;
  }
  std::uint64_t n = 0;
  bool is_size = false;
  if (!count_or_size(v, &n, &is_size, reason, "a count or a size")) return false;
  if (!is_size) {
    *out = {SiteSampling::Mode::every, n};
    return true;
  }
  if (n == 0) {
    *reason = "is not a size of at least one byte";
    return false;
  }
  *out = {SiteSampling::Mode::bytes, n};
  return true;
}

std::string Sampling::show(const T& v) {
  switch (v.mode) {
    case SiteSampling::Mode::off:
      return "off";
    case SiteSampling::Mode::every:
      return v.n == 1 ? "all" : std::to_string(v.n);
    case SiteSampling::Mode::bytes:
      return show_bytes(v.n);
  }
  return "off";
}

bool Split::parse(std::string_view text, T* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  const std::string l = lower(v);
  if (l == "off" || l == "none" || l == "0" || l == "no" || l == "false") {
    *out = 0;
    return true;
  }
  if (l == "on" || l == "1" || l == "yes" || l == "true") {
    *out = kSplitOn;
    return true;
  }
  std::uint64_t n = 0;
  bool is_size = false;
  if (!count_or_size(v, &n, &is_size, reason, "off, on or a size")) return false;
  if (!is_size) {
    *reason = "is a number without a unit";
    return false;
  }
  if (n < 4096) {
    *reason = "is under 4KiB";
    return false;
  }
  *out = n;
  return true;
}

std::string Split::show(const T& v) { return v == 0 ? "off" : show_bytes(v); }

bool Duration::parse(std::string_view text, T* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  const std::string l = lower(v);
  if (l == "off" || l == "none") {
    *out = 0;
    return true;
  }
  if (v.front() == '-') {
    *reason = "is negative";
    return false;
  }
  std::uint64_t n = 0;
  std::size_t used = 0;
  if (!take_u64(v, &n, &used)) {
    *reason = "overflows 64 bits of nanoseconds";
    return false;
  }
  if (used == 0) {
    *reason = "is not a duration";
    return false;
  }
  const std::string unit = lower(trim(v.substr(used)));
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "s") scale = 1'000'000'000;
  else if (unit == "ms") scale = 1'000'000;
  else if (unit == "us") scale = 1'000;
  else if (unit == "ns") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60'000'000'000;
  else if (unit == "h") scale = 3'600'000'000'000;
  else {
    *reason = "is not a duration";
    return false;
  }
  std::uint64_t ns = 0;
  if (mul_overflows(n, scale, &ns)) {
    *reason = "overflows 64 bits of nanoseconds";
    return false;
  }
  *out = ns;
  return true;
}

std::string Duration::show(const T& ns) {
  if (ns == 0) return "off";
  struct U {
    std::uint64_t scale;
    const char* name;
  };
  static const U units[] = {{3'600'000'000'000, "h"}, {60'000'000'000, "m"}, {1'000'000'000, "s"},
                            {1'000'000, "ms"},        {1'000, "us"},         {1, "ns"}};
  for (const U& u : units)
    if (ns % u.scale == 0) return std::to_string(ns / u.scale) + u.name;
  return std::to_string(ns) + "ns";
}

bool ReuseKind::parse(std::string_view text, T* out, std::string* reason) {
  const std::string v = lower(trim(text));
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v == "safe") {
    *out = Reuse::safe;
    return true;
  }
  if (v == "ordered") {
    *out = Reuse::ordered;
    return true;
  }
  if (v == "fenced") {
    *out = Reuse::fenced;
    return true;
  }
  if (v == "immediate") {
    *out = Reuse::immediate;
    return true;
  }
  *reason = "is not a reuse mode";
  return false;
}

std::string ReuseKind::show(const T& v) {
  switch (v) {
    case Reuse::safe:
      return "safe";
    case Reuse::ordered:
      return "ordered";
    case Reuse::fenced:
      return "fenced";
    case Reuse::immediate:
      break;
  }
  return "immediate";
}

bool SegmentsKind::parse(std::string_view text, T* out, std::string* reason) {
  const std::string v = lower(trim(text));
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v == "driver") {
    *out = Segments::driver;
    return true;
  }
  if (v == "expandable") {
    *out = Segments::expandable;
    return true;
  }
  *reason = "is not a kind of segments";
  return false;
}

std::string SegmentsKind::show(const T& v) {
  return v == Segments::expandable ? "expandable" : "driver";
}

bool NeighbourScope::parse(std::string_view text, T* out, std::string* reason) {
  const std::string v = lower(trim(text));
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v == "all") {
    *out = Neighbours::all;
    return true;
  }
  if (v == "user") {
    *out = Neighbours::user;
    return true;
  }
  bool b = false;
  if (parse_bool(v, &b)) {
    *out = b ? Neighbours::user : Neighbours::off;
    return true;
  }
  *reason = "is not a neighbour scope";
  return false;
}

std::string NeighbourScope::show(const T& v) {
  return v == Neighbours::off ? "off" : v == Neighbours::user ? "user" : "all";
}

bool Level::parse(std::string_view text, T* out, std::string* reason) {
  const std::string v = lower(trim(text));
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v == "off" || v == "none" || v == "0") *out = LogLevel::off;
  else if (v == "error" || v == "err") *out = LogLevel::error;
  else if (v == "warn" || v == "warning") *out = LogLevel::warn;
  else if (v == "info") *out = LogLevel::info;
  else if (v == "debug") *out = LogLevel::debug;
  else if (v == "trace") *out = LogLevel::trace;
  else {
    *reason = "is not a log level";
    return false;
  }
  return true;
}

std::string Level::show(const T& v) {
  switch (v) {
    case LogLevel::trace:
      return "trace";
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
    case LogLevel::off:
      return "off";
  }
  return "warn";
}

bool Path::parse(std::string_view text, T* out, std::string*) {
  *out = std::string(text);
  return true;
}

std::string Path::show(const T& v) { return v; }

bool Pid::parse(std::string_view text, T* out, std::string* reason) {
  const std::string_view v = trim(text);
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (lower(v) == "none") {
    *out = 0;
    return true;
  }
  std::uint64_t n = 0;
  std::size_t used = 0;
  if (!take_u64(v, &n, &used) || used == 0 || used != v.size() || n == 0) {
    *reason = "is not a process id";
    return false;
  }
  // Linux's pid_max is at most 2^22.
  if (n > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
    *reason = "is out of range";
    return false;
  }
  *out = static_cast<T>(n);
  return true;
}

std::string Pid::show(const T& v) { return v > 0 ? std::to_string(v) : "none"; }

bool Format::parse(std::string_view text, T* out, std::string* reason) {
  const std::string v = lower(trim(text));
  if (v.empty()) {
    *reason = "is empty";
    return false;
  }
  if (v == "text") {
    *out = StatsFormat::text;
    return true;
  }
  if (v == "json") {
    *out = StatsFormat::json;
    return true;
  }
  *reason = "is not a stats format";
  return false;
}

std::string Format::show(const T& v) { return v == StatsFormat::text ? "text" : "json"; }

bool Signal::parse(std::string_view text, T* out, std::string* reason) {
  const int s = parse_signal(std::string(text), reason);
  if (s < 0) return false;
  *out = s;
  return true;
}

std::string Signal::show(const T& v) { return signal_name(v); }

}  // namespace values

// ---- the readers config.hpp exposes ----------------------------------------------

bool parse_bool(std::string_view text, bool* out) {
  const std::string_view v = values::trim(text);
  auto is = [&](std::string_view word) {
    if (v.size() != word.size()) return false;
    for (std::size_t i = 0; i < v.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(v[i])) != word[i]) return false;
    return true;
  };
  if (is("1") || is("true") || is("yes") || is("on")) {
    *out = true;
    return true;
  }
  if (is("0") || is("false") || is("no") || is("off")) {
    *out = false;
    return true;
  }
  return false;
}

bool parse_size(const std::string& text, bool allow_percent, SizeSpec* out, std::string* why) {
  std::string scratch;
  SizeSpec s;
  if (!values::size_from(text, allow_percent, &s, why ? why : &scratch)) return false;
  if (out) *out = s;
  return true;
}

bool parse_duration(const std::string& text, std::uint64_t* ns, std::string* why) {
  std::string scratch;
  std::uint64_t v = 0;
  if (!values::Duration::parse(text, &v, why ? why : &scratch)) return false;
  if (ns) *ns = v;
  return true;
}

std::size_t SizeSpec::resolve(std::size_t capacity) const {
  if (unlimited) return SIZE_MAX;
  if (percent) {
    const long double b = static_cast<long double>(capacity) * fraction;
    if (b >= static_cast<long double>(SIZE_MAX)) return SIZE_MAX;
    return b <= 0 ? 0 : static_cast<std::size_t>(b);
  }
  return bytes > SIZE_MAX ? SIZE_MAX : static_cast<std::size_t>(bytes);
}

}  // namespace gpupool::config
