// GPUPOOL_* variables read from an environment: each value parsed into a
// temporary and stored only when it is valid, so a bad value leaves the
// table's default in place, and every problem one Diagnostic (worded here:
// the value quoted safely, the nearest known name suggested). Nothing here
// throws or aborts.
#include <algorithm>
#include <cstdint>

#include "config/table.hpp"
#include "config/values.hpp"

namespace gpupool::config {
namespace {

// Text from the environment as shown in a message: quotes and control bytes
// escaped, long values cut, so a hostile environment cannot forge log lines.
std::string clean(std::string_view v) {
  constexpr std::size_t kMax = 80;
  std::string r;
  for (std::size_t i = 0; i < v.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"' || c == '\\') {
      r += '\\';
      r += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
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
      std::size_t v =
          std::min({d[(i - 1) * w + j] + 1, d[i * w + j - 1] + 1, d[(i - 1) * w + j - 1] + cost});
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
  const std::string u = values::upper(name);
  std::string best;
  std::size_t best_d = SIZE_MAX;
  for (const Option& o : table()) {
    const std::size_t d = distance(u, o.info.name);
    if (d < best_d) {
      best_d = d;
      best = o.info.name;
    }
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

// Two actions on one signal: values set in the environment win over
// defaults; between two set values the later in the table falls back to its
// default if that is free, else to none.
void resolve_signal_clashes(Config& c, const bool explicit_set[kActions],
                            std::vector<Diagnostic>* diags) {
  const Config& d = defaults();
  struct Taken {
    int signo;
    const char* by;
  };
  std::vector<Taken> taken;
  auto owner = [&](int s) -> const char* {
    for (const Taken& t : taken)
      if (t.signo == s) return t.by;
    return nullptr;
  };
  for (int pass = 0; pass < 2; ++pass) {
    for (unsigned i = 0; i < kActions; ++i) {
      if (explicit_set[i] != (pass == 0)) continue;
      const char* name = kActionInfo[i].variable;
      int& v = c.*(kActionInfo[i].signal);
      const int def = d.*(kActionInfo[i].signal);
      if (v == 0) continue;
      const char* by = owner(v);
      if (!by) {
        taken.push_back({v, name});
        continue;
      }
      const int was = v;
      if (explicit_set[i] && def != 0 && !owner(def)) {
        v = def;
        taken.push_back({v, name});
      } else {
        v = 0;
      }
      diag(diags, name,
           std::string(name) + (explicit_set[i] ? "=" : "'s default ") + quote(signal_name(was)) +
               " is the signal of " + by + " already; using " +
               (v ? "the default (" + signal_name(v) + ")" : std::string("none")) + " for " + name);
    }
  }
}

}  // namespace

Config parse(const char* const* envp, std::vector<Diagnostic>* diagnostics) {
  Config c = defaults();
  const auto& t = table();
  std::vector<bool> seen(t.size(), false);
  bool signal_set[kActions] = {};
  for (const char* const* e = envp; e && *e; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, kPrefix.size()) != kPrefix) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq), value = entry.substr(eq + 1);
    std::size_t index = t.size();
    for (std::size_t i = 0; i < t.size(); ++i)
      if (name == t[i].info.name) {
        index = i;
        break;
      }
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
           std::string(o.info.name) + "=" + quote(value) + " " + reason +
               " (accepted: " + o.accepted + "); using the default (" + def + ")");
      continue;
    }
    for (unsigned a = 0; a < kActions; ++a)
      if (name == kActionInfo[a].variable) signal_set[a] = true;
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

}  // namespace gpupool::config
