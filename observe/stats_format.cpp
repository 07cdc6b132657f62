#include "observe/stats_format.hpp"

#include "config/config.hpp"
#include "core/no_destructor.hpp"
#include "observe/text_width.hpp"

#include <signal.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <string_view>

namespace gpupool::stats {

const std::vector<Field>& fields() {
  // Never destroyed: the at-exit dump runs after static destructors of
  // objects created after it was registered.
  static const NoDestructor<std::vector<Field>> f(std::vector<Field>{
#define GPUPOOL_STATS_ROW(name, kind, meaning) \
  {#name, &Stats::name, std::string_view(#kind) == "bytes", std::string_view(#kind) == "counter"},
      GPUPOOL_STATS_FIELDS(GPUPOOL_STATS_ROW)
#undef GPUPOOL_STATS_ROW
  });
  return *f;
}

namespace {

std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (n < 0) return {};
  if (static_cast<std::size_t>(n) < sizeof buf) return std::string(buf, n);
  std::string s(n + 1, '\0');
  va_start(ap, fmt);
  vsnprintf(s.data(), s.size(), fmt, ap);
  va_end(ap);
  s.resize(n);
  return s;
}

std::string iso_time(double t) {
  std::time_t secs = static_cast<std::time_t>(t);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  int ms = static_cast<int>((t - std::floor(t)) * 1000);
  return format("%s.%03dZ", buf, ms);
}

// Long names are cut in the middle: the start says what it is, the end
// (device, flags) which one.
std::string pad(std::string s, std::size_t width, bool right = false) {
  s = observe::shorten_middle(s, width);
  std::string spaces(width - std::min(width, observe::text_columns(s)), ' ');
  return right ? spaces + s : s + spaces;
}

std::string blocks_bytes(std::uint64_t blocks, std::uint64_t bytes) {
  return format("%" PRIu64 " / %s", blocks, human_bytes(bytes).c_str());
}

std::string hit_rate(const Stats& s) {
  const std::uint64_t n = s.hits + s.misses;
  if (n == 0) return "-";
  return format("%.1f%%", 100.0 * static_cast<double>(s.hits) / static_cast<double>(n));
}

void json_stats(std::string& out, const Stats& s) {
  out += '{';
  bool first = true;
  for (const Field& f : fields()) {
    if (!first) out += ',';
    first = false;
    out += format("\"%s\":%" PRIu64, f.name, s.*f.member);
  }
  out += '}';
}

std::string prom_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

}  // namespace

std::string signal_name(int signo) {
  // config's names (one table of them), in the dumps' SIG-prefixed form.
  return signo <= 0 ? "none" : "SIG" + config::signal_name(signo);
}

std::string json_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (std::size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    // DEL and the C1 controls (U+0080..U+009F, C2 80..C2 9F in UTF-8) too:
    // no control character reaches a terminal that shows the JSON.
    if (c == 0x7f) {
      out += "\\u007f";
      continue;
    }
    if (c == 0xc2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
        static_cast<unsigned char>(s[i + 1]) < 0xa0) {
      out += format("\\u%04x", static_cast<unsigned char>(s[++i]));
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) out += format("\\u%04x", c);
        else out += static_cast<char>(c);
    }
  }
  return out;
}

// Within kTextColumns: per arena a row of the figures that move (active,
// held, managed, the hit rate), then a detail paragraph (its whole name,
// kind, group, driver calls, hits and misses, peaks) and the bins holding
// most, wrapped.
std::string to_text(const Report& r) {
  std::string out =
      format("gpupool %s stats: pid %ld, %s, %s, holding %s\n", r.version.c_str(), r.pid,
             iso_time(r.time).c_str(), r.reason.c_str(), r.holding ? "on" : "off (stop_holding)");
  constexpr std::size_t kFigures = 2 + 18 + 2 + 18 + 2 + 10 + 2 + 6;
  std::size_t name_w = 24;
  for (const auto& b : r.arenas) name_w = std::max(name_w, b.name.size() + (b.retired ? 10 : 0));
  name_w = std::min(name_w, observe::kTextColumns - kFigures);

  out += pad("arena", name_w) + "  " + pad("active", 18, true) + "  " + pad("held", 18, true) +
         "  " + pad("managed", 10, true) + "  " + pad("hit%", 6, true) + "\n";
  auto row = [&](const std::string& name, const Stats& s) {
    out += pad(name, name_w) + "  " + pad(blocks_bytes(s.active_blocks, s.active_bytes), 18, true) +
           "  " + pad(blocks_bytes(s.held_blocks, s.held_bytes), 18, true) + "  " +
           pad(human_bytes(s.managed_bytes), 10, true) + "  " + pad(hit_rate(s), 6, true) + "\n";
  };
  for (const auto& b : r.arenas) row(b.retired ? b.name + " (retired)" : b.name, b.stats);
  row(format("total (%zu arena%s)", r.arenas.size(), r.arenas.size() == 1 ? "" : "s"), r.totals);
  // Wrapped between items (an item's own spaces are written as \x01 until
  // then): "10.0 KiB x 1 = 10.0 KiB" stays on one line.
  auto paragraph = [&](const std::string& text, std::size_t indent) {
    std::vector<std::string> lines = observe::wrap_text(text, observe::kTextColumns - indent - 2);
    for (std::size_t k = 0; k < lines.size(); ++k) {
      std::replace(lines[k].begin(), lines[k].end(), '\x01', ' ');
      out += std::string(indent + (k ? 2 : 0), ' ') + lines[k] + "\n";
    }
  };
  auto item = [](std::string s) {
    std::replace(s.begin(), s.end(), ' ', '\x01');
    return s;
  };
  for (const auto& b : r.arenas) {
    const Stats& s = b.stats;
    paragraph(b.name + " [" + b.kind + ", " + b.group +
                  "]: " + item(format("hits %" PRIu64 ",", s.hits)) + " " +
                  item(format("misses %" PRIu64 ";", s.misses)) + " " +
                  item(format("backend allocs %" PRIu64 ",", s.backend_allocs)) + " " +
                  item(format("frees %" PRIu64 ";", s.backend_frees)) + " " +
                  item(format("oom retries %" PRIu64 ",", s.oom_retries)) + " " +
                  item(format("trims %" PRIu64 ",", s.trims)) + " " +
                  item(format("pending frees %" PRIu64 ",", s.pending_frees)) + " " +
                  item(format("fence waits %" PRIu64 " (%.1f ms),", s.fence_waits,
                              double(s.fence_wait_ns) / 1e6)) +
                  " " + item(format("stock growths %" PRIu64 ";", s.stock_growths)) + " " +
                  item("peak managed " + human_bytes(s.peak_managed_bytes) + ",") + " " +
                  item(format("peak active %" PRIu64 " / %s,", s.peak_active_blocks,
                              human_bytes(s.peak_active_bytes).c_str())) +
                  " " +
                  item(format("peak held %" PRIu64 " / %s", s.peak_held_blocks,
                              human_bytes(s.peak_held_bytes).c_str())),
              2);
    if (!b.bins.empty()) {
      std::string bins = "bins holding most:";
      bool first = true;
      for (const auto& bin : b.bins) {
        bins += std::string(first ? " " : ", ") +
                item(format("%s x %" PRIu64 " = %s", human_bytes(bin.alloc_size).c_str(),
                            bin.held_blocks, human_bytes(bin.held_bytes).c_str()));
        first = false;
      }
      paragraph(bins, 4);
    }
  }
  for (const auto& w : r.warnings) paragraph("warning: " + w, 2);
  return out;
}

std::string to_json(const Report& r) {
  std::string out;
  out += format(
      "{\"version\":%d,\"gpupool\":\"%s\",\"pid\":%ld,\"time\":%.3f,\"reason\":\"%s\","
      "\"holding\":%s,\"totals\":",
      kSchemaVersion, json_escape(r.version).c_str(), r.pid, r.time, json_escape(r.reason).c_str(),
      r.holding ? "true" : "false");
  json_stats(out, r.totals);
  out += ",\"arenas\":[";
  for (std::size_t i = 0; i < r.arenas.size(); ++i) {
    const auto& b = r.arenas[i];
    if (i) out += ',';
    out += format("{\"name\":\"%s\",\"kind\":\"%s\",\"group\":\"%s\",\"retired\":%s,\"stats\":",
                  json_escape(b.name).c_str(), json_escape(b.kind).c_str(),
                  json_escape(b.group).c_str(), b.retired ? "true" : "false");
    json_stats(out, b.stats);
    out += ",\"bins\":[";
    for (std::size_t j = 0; j < b.bins.size(); ++j) {
      if (j) out += ',';
      out += format("{\"alloc_size\":%zu,\"held_blocks\":%" PRIu64 ",\"held_bytes\":%" PRIu64 "}",
                    b.bins[j].alloc_size, b.bins[j].held_blocks, b.bins[j].held_bytes);
    }
    // Last: a field added in place would move the ones after it.
    out += format("],\"device\":\"%s\"}", json_escape(b.device).c_str());
  }
  out += "],\"signals\":[";
  for (std::size_t i = 0; i < r.signals.size(); ++i) {
    const auto& s = r.signals[i];
    if (i) out += ',';
    out += format("{\"action\":\"%s\",\"signal\":\"%s\",\"installed\":%s}",
                  json_escape(s.action).c_str(), signal_name(s.signo).c_str(),
                  s.installed ? "true" : "false");
  }
  out += "],\"warnings\":[";
  for (std::size_t i = 0; i < r.warnings.size(); ++i) {
    if (i) out += ',';
    out += "\"" + json_escape(r.warnings[i]) + "\"";
  }
  out += "]}";
  return out;
}

std::string to_prometheus(const Report& r, const PromSource& source) {
  // node_exporter's textfile collector reads every process's file into one
  // scrape and refuses a series two files share: the slot (the file's
  // number) tells live processes apart. No pid and no address on the
  // series: a new process takes a free slot's series over, so they do not
  // grow with every process, and a program's keep their names from run to
  // run. The pid is on gpupool_info alone, for the per-process detail.
  const std::string who = format("slot=\"%ld\",uid=\"%ld\",program=\"%s\"", source.slot, source.uid,
                                 prom_escape(source.program).c_str());
  std::string out;
  out +=
      "# HELP gpupool_info gpupool version and the process writing this slot.\n"
      "# TYPE gpupool_info gauge\n";
  out += format("gpupool_info{%s,pid=\"%ld\",version=\"%s\"} 1\n", who.c_str(), r.pid,
                prom_escape(r.version).c_str());
  out +=
      "# HELP gpupool_holding 1 while freed blocks are held for reuse, 0 after stop_holding.\n"
      "# TYPE gpupool_holding gauge\n";
  out += format("gpupool_holding{%s} %d\n", who.c_str(), r.holding ? 1 : 0);
  // One label set per arena; the destroyed arenas' row (one per kind and
  // device) is "destroyed", whatever their count.
  std::vector<std::string> labels;
  for (const auto& b : r.arenas) {
    const bool destroyed = b.retired && b.group == "retired";
    std::string arena = destroyed ? "destroyed" : b.name;
    std::string l = format("%s,gpu=\"%s\",kind=\"%s\",arena=\"", who.c_str(),
                           prom_escape(b.device).c_str(), prom_escape(b.kind).c_str());
    // Names are unique in a process; should two ever meet, the second is
    // numbered rather than refused by the collector.
    std::string unique = arena;
    for (int n = 2;
         std::find(labels.begin(), labels.end(), l + prom_escape(unique) + "\"") != labels.end();
         ++n)
      unique = arena + " #" + std::to_string(n);
    labels.push_back(l + prom_escape(unique) + "\"");
  }
  for (const Field& f : fields()) {
    const std::string metric = std::string("gpupool_") + f.name + (f.counter ? "_total" : "");
    out += format("# HELP %s gpupool %s per arena (see docs/stats.md).\n# TYPE %s %s\n",
                  metric.c_str(), f.name, metric.c_str(), f.counter ? "counter" : "gauge");
    for (std::size_t i = 0; i < r.arenas.size(); ++i)
      out += format("%s{%s} %" PRIu64 "\n", metric.c_str(), labels[i].c_str(),
                    r.arenas[i].stats.*f.member);
  }
  return out;
}

}  // namespace gpupool::stats
